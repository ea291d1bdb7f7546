"""Owns the calibration generators: how a simulated run's steps-to-target depend on the member,
the batch and the learning rate, including the ways real studies differ from the fitted curve
S_min (1 + B_crit / B). `wide_tf.analysis.simulate` runs them through the real protocol and
analysis.

Every generator is a `Truth`. Its member curves are

    S(B) = S_min (1 + (B_crit / B)^p)^(1/p)           (p = 1: McCandlish et al.'s curve)

times a learning-rate response, times a cell effect shared by a cell's seeds, times seed noise,
plus an optional fixed overhead of steps per run. The **null** of every generator is that the
quantity the verdict is about, the model-free critical batch B_x(1+eps) of the noiseless curve, is
the same for every member: where the curve's exponent differs between members, B_crit is solved
per member so that B_x(1+eps) agrees (`b_crit_for_b_plus`); where it does not, equal B_crit gives
equal B_x(1+eps). The **effect** multiplies B_crit by (w / w_narrowest)^alpha.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize


@dataclasses.dataclass(frozen=True)
class Truth:
    """What nature chooses (defaults: the fitted curve, at the local designs' noise)."""

    name: str = "fitted model"
    alpha: float = 0.0  # B_crit grows like width^alpha (0: width does not matter)
    b_crit_ref: float = 30.0  # B_crit of the narrowest member (p = 1)
    # Epochs to target as B -> 0 (S_min B_crit / n): about 2 on the digits at the local target.
    epochs_small_batch: float = 2.0
    noise: float = 0.14  # sigma of the log-normal seed noise (the local studies measure 0.13-0.15)
    cell_effect: float = 0.1  # sigma of a log-normal effect shared by a cell's seeds
    # Seed noise grows with the batch: sigma x (1 + hetero x position of log B in the range).
    hetero: float = 0.0
    exponent: float = 1.0  # p of the curve (large: a hard knee)
    # p varies linearly in log width from exponent - spread to exponent + spread (narrow to wide).
    exponent_spread: float = 0.0
    tau: float = 0.0  # member scatter of log B_crit unrelated to width
    overhead_steps: float = 0.0  # fixed steps added to every run (optimizer ramps, BN lag)
    deepest_s_min_factor: float = 1.0  # the deepest member needs this many times the steps
    # S_min spread across members: the widest member's S_min / s_min_spread ... the deepest's
    # S_min x 1, log-linear in depth between (measured: 104 to 8.6 steps, 12x; 1: shared S_min).
    s_min_spread: float = 1.0
    widest_b_crit_factor: float = 1.0  # only the widest member's B_crit times this (a corner)
    # sigma of a log-normal (member, seed) effect shared by a seed's runs at every batch size
    # (measured: seed deviations correlate +0.27 across batch sizes).
    seed_effect: float = 0.0
    lr_curvature: float = 1.5  # c of the learning-rate response (1 + c log(m / m*)^2)
    lr_opt_spread: float = 0.25  # sd of log m* around the scaling rule's guess
    # The widest member's optimum drifts up with the batch: log m* += drift x log2(B / B_min).
    lr_drift_widest: float = 0.0
    diverge_factor: float = 2.5  # a rate above this x m* diverges
    # Data-driven noise (`from_residuals`): cell effects and seed deviations (log steps) drawn
    # from a real study's fit residuals instead of normals; empty: normal noise as above.
    cell_pool: tuple = ()
    seed_pool: tuple = ()

    def cell_draw(self, rng) -> float:
        """A cell's multiplicative effect on steps."""
        if self.cell_pool:
            return math.exp(float(rng.choice(self.cell_pool)))
        return math.exp(self.cell_effect * rng.standard_normal())

    def seed_draw(self, rng, pos: float) -> float:
        """A seed's multiplicative noise at relative position `pos` (0..1) of log batch."""
        if self.seed_pool:
            return math.exp(float(rng.choice(self.seed_pool)))
        return math.exp(self.noise * (1 + self.hetero * pos) * rng.standard_normal())


def from_residuals(summaries, name: str) -> Truth:
    """A generator whose noise is a real study's: the cell effects (mean residual of a cell's
    finished seeds about its member's fitted curve) and the seed deviations within cells, pooled
    over members and centred, each resampled with replacement. Cells with a censored seed are left
    out (their residuals are truncated)."""
    cells, seeds = [], []
    for s in summaries:
        cv = s.curve
        if cv is None or cv.fit is None:
            continue
        for c in s.cells:
            if c.censored_budgets or len(c.seed_steps) < 2:
                continue
            pred = cv.fit.log_s_min + math.log1p(cv.fit.b_crit / c.batch_size)
            r = np.log(np.asarray(c.seed_steps)) - pred
            cells.append(float(r.mean()))
            k = r.size
            # Deviations rescaled by sqrt(k / (k - 1)) so their variance is the seeds' own.
            seeds += list((r - r.mean()) * math.sqrt(k / (k - 1)))
    if len(cells) < 3 or len(seeds) < 3:
        raise ValueError(f"{name}: fewer than 3 complete cells with a fitted curve to resample")
    cells = np.asarray(cells) - np.mean(cells)
    return Truth(
        name=f"resampled residuals of {name} ({len(cells)} cells, {len(seeds)} seeds)",
        cell_pool=tuple(float(v) for v in cells),
        seed_pool=tuple(float(v) for v in seeds),
    )


def curve_steps(s_min: float, b_crit: float, batch, p: float):
    """S(B) = S_min (1 + (B_crit / B)^p)^(1/p)."""
    b = np.asarray(batch, dtype=float)
    return s_min * (1.0 + (b_crit / b) ** p) ** (1.0 / p)


def b_plus(b_crit: float, p: float, batches, eps: float) -> float:
    """B_x(1+eps) of the noiseless curve: epochs E = S B rise (1 + eps)-fold over the geometric mean
    of the two smallest batches' epochs (as `critical_batch.first_crossing` measures it)."""
    b = np.asarray(sorted(batches), dtype=float)
    log_e = lambda x: math.log(float(curve_steps(1.0, b_crit, x, p)) * x)  # noqa: E731
    ref = 0.5 * (log_e(b[0]) + log_e(b[1])) if b.size >= 2 else log_e(b[0])
    thr = ref + math.log1p(eps)
    f = lambda lx: log_e(math.exp(lx)) - thr  # noqa: E731
    lo, hi = math.log(b[0]), math.log(b[-1] * 1e4)
    if f(lo) > 0:
        return float(b[0])
    return float(math.exp(optimize.brentq(f, lo, hi)))


def b_crit_for_b_plus(target: float, p: float, batches, eps: float) -> float:
    """The B_crit that gives a curve of exponent p the model-free critical batch `target`."""
    f = lambda lbc: math.log(b_plus(math.exp(lbc), p, batches, eps)) - math.log(target)  # noqa: E731
    return float(math.exp(optimize.brentq(f, math.log(target) - 8, math.log(target) + 8)))


def member_exponents(truth: Truth, widths) -> np.ndarray:
    lw = np.log(np.asarray(widths, dtype=float))
    pos = (lw - lw.min()) / (np.ptp(lw) or 1.0)
    return truth.exponent + truth.exponent_spread * (2 * pos - 1)


def member_b_crits(truth: Truth, widths, batches, eps: float, rng) -> np.ndarray:
    """B_crit per member: the null's common B_x(1+eps) (or B_crit where every member has the same
    exponent), the width effect, and the member scatter."""
    w = np.asarray(widths, dtype=float)
    ps = member_exponents(truth, w)
    base = b_plus(truth.b_crit_ref, 1.0, batches, eps)  # the narrowest member's B_x(1+eps) at p = 1
    out = []
    for wi, p in zip(w, ps):
        if truth.exponent_spread == 0.0 and truth.exponent == 1.0:
            bc = truth.b_crit_ref
        else:
            bc = b_crit_for_b_plus(base, p, batches, eps)
        bc *= (wi / w.min()) ** truth.alpha
        if wi == w.max():
            bc *= truth.widest_b_crit_factor
        bc *= math.exp(truth.tau * rng.standard_normal())
        out.append(bc)
    return np.array(out)


GENERATORS = {
    "fitted": Truth(),
    "exponent 0.7": Truth(name="curve exponent 0.7 (all members)", exponent=0.7),
    "exponent 1.3": Truth(name="curve exponent 1.3 (all members)", exponent=1.3),
    "exponent varies": Truth(name="curve exponent 0.7 to 1.3, narrow to wide", exponent_spread=0.3),
    "hard knee": Truth(name="hard knee (exponent 8)", exponent=8.0),
    "heteroscedastic": Truth(name="seed noise doubling towards the largest batch", hetero=1.0),
    "lr drift": Truth(
        name="widest member's learning-rate optimum drifting up x2 per batch doubling",
        lr_drift_widest=math.log(2.0),
    ),
    "overhead": Truth(
        name="10 steps of overhead per run, deepest member 3x slower",
        overhead_steps=10.0,
        deepest_s_min_factor=3.0,
    ),
    "overhead only": Truth(name="10 steps of overhead per run", overhead_steps=10.0),
    "seed effect": Truth(
        # sigma^2 split so the seed total stays 0.14 and the share is 0.27 (as measured)
        name="(member, seed) effect shared across batch sizes, correlation 0.27",
        noise=0.14 * math.sqrt(0.73),
        seed_effect=0.14 * math.sqrt(0.27),
    ),
    "widest x1.8": Truth(
        name="no width trend, only the widest member's B_crit x1.8", widest_b_crit_factor=1.8
    ),
    "s_min 12x": Truth(
        name="S_min varying 12x across members, one shared B_crit", s_min_spread=12.0
    ),
    "tau 0.15": Truth(name="member scatter tau = 0.15", tau=0.15),
    "tau 0.3": Truth(name="member scatter tau = 0.3", tau=0.3),
}
