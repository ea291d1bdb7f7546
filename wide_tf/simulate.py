"""Owns the study simulator: whole studies with a known answer, run through the real protocol
(`wide_tf.lr_grid`) and the real analysis (`wide_tf.analysis`), to calibrate the verdict.

A simulated run of member w at batch B and learning-rate multiplier m takes

    S = S_min (1 + B_crit(w) / B) * (1 + c * log(m / m*)^2) * exp(sigma * Z)

steps to the target (McCandlish et al.'s curve, a quadratic learning-rate response in log m around
a per-cell optimum m* scattered about the scaling rule's guess, log-normal seed noise), with
B_crit(w) = B_crit_ref * (w / w_narrowest)^alpha. A rate more than `diverge_factor` x m* diverges.
A run is censored by its budget (max(max_epochs * n / B, min_steps) steps, as in `train.py`), and
is seen only at the evaluation cadence: the target is detected at the first evaluation at or after
S, and the interpolated crossing lands between that evaluation and the one before.

    python -m wide_tf.simulate                  # the calibration table quoted in the README
    python -m wide_tf.simulate --studies=500 --noise=0.05,0.1,0.2
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Sequence

import numpy as np

from wide_tf import analysis, lr_grid


@dataclasses.dataclass(frozen=True)
class Design:
    """What the experimenter chooses (defaults: the shape of `configs/mlp.py:local`)."""

    widths: tuple = (79.0, 117.0, 189.0, 667.0)
    depths: tuple = (8, 4, 2, 1)
    batch_sizes: tuple = (16, 32, 64, 128, 256, 512, 1024)
    lr_multipliers: tuple = (0.7071, 1.0, 1.4142)
    tuning_seeds: tuple = (0,)
    confirm_seeds: tuple = (1, 2, 3, 4)
    max_lr_extensions: int = 2
    num_train: int = 1438
    max_epochs: float = 60.0
    min_steps: int = 400
    eval_every_examples: int = 360


@dataclasses.dataclass(frozen=True)
class Truth:
    """What nature chooses."""

    alpha: float = 0.0  # B_crit grows like width^alpha (0: width does not matter)
    b_crit_ref: float = 150.0  # B_crit of the narrowest member
    epochs_small_batch: float = 8.0  # epochs to target as B -> 0: S_min * B_crit / n
    noise: float = 0.1  # sigma of the log-normal seed noise
    lr_curvature: float = 1.5  # c of the learning-rate response
    lr_opt_spread: float = 0.25  # sd of log m* around the scaling rule's guess
    diverge_factor: float = 2.5


def _budget(design: Design, batch: int) -> int:
    return max(math.ceil(design.max_epochs * design.num_train / batch), design.min_steps)


def _eval_steps(design: Design, batch: int, budget: int) -> np.ndarray:
    every = design.eval_every_examples
    k = np.arange(1, math.ceil(budget * batch / every) + 2)
    steps = np.unique(np.minimum(np.ceil(k * every / batch), budget).astype(int))
    return steps


def simulate_run(
    rng,
    design: Design,
    truth: Truth,
    b_crit: float,
    m_opt: float,
    member: str,
    width: float,
    depth: int,
    batch: int,
    mult: float,
    seed: int,
    role: str,
) -> dict:
    s_min = truth.epochs_small_batch * design.num_train / b_crit
    budget = _budget(design, batch)
    rec = {
        "trial_id": f"{member}_b{batch}_lr{mult:g}_s{seed}",
        "member": member,
        "arch": "sim",
        "depth": depth,
        "width": width,
        "params": 50_000,
        "batch_size": batch,
        "lr_multiplier": mult,
        "learning_rate": 0.1 * mult,
        "seed": seed,
        "role": role,
        "num_train": design.num_train,
        "steps_to_target": None,
        "steps_to_target_interp": None,
        "epochs_to_target": None,
    }
    if mult > truth.diverge_factor * m_opt:
        rec.update(status="diverged", steps=int(rng.integers(1, 20)))
        return rec
    s = s_min * (1 + b_crit / batch) * (1 + truth.lr_curvature * math.log(mult / m_opt) ** 2)
    s *= math.exp(truth.noise * rng.standard_normal())
    if s > budget:
        rec.update(status="not_reached", steps=budget)
        return rec
    evals = _eval_steps(design, batch, budget)
    i = int(np.searchsorted(evals, s))  # first evaluation at or after the crossing
    seen = int(evals[min(i, len(evals) - 1)])
    prev = int(evals[i - 1]) if i > 0 else 0
    # A crossing interpolated on a noisy metric lands near, not at, the true one.
    interp = min(max(s + (rng.random() - 0.5) * 0.5 * (seen - prev), prev), seen)
    rec.update(
        status="reached",
        steps=seen,
        steps_to_target=seen,
        steps_to_target_interp=interp,
        epochs_to_target=seen * batch / design.num_train,
    )
    return rec


def simulate_study(rng: np.random.Generator, design: Design, truth: Truth) -> list[dict]:
    """Every record of one simulated study, driven by the real learning-rate protocol."""
    records = []
    w0 = min(design.widths)
    for width, depth in zip(design.widths, design.depths):
        member = f"sim-d{depth}-w{width:g}"
        b_crit = truth.b_crit_ref * (width / w0) ** truth.alpha
        for batch in design.batch_sizes:
            m_opt = math.exp(truth.lr_opt_spread * rng.standard_normal())
            args = (rng, design, truth, b_crit, m_opt, member, width, depth, batch)
            cell = [
                simulate_run(*args, m, s, lr_grid.TUNE)
                for m in design.lr_multipliers
                for s in design.tuning_seeds
            ]
            while True:
                nxt = lr_grid.next_runs(
                    cell,
                    design.lr_multipliers,
                    design.tuning_seeds,
                    design.confirm_seeds,
                    design.max_lr_extensions,
                )
                if not nxt:
                    break
                cell += [simulate_run(*args, m, s, role) for m, s, role in nxt]
            records += cell
    return records


@dataclasses.dataclass(frozen=True)
class Calibration:
    n_studies: int
    supported: int
    contradicted: int
    no_effect: int
    inconclusive: int
    median_min_detectable: float | None

    @property
    def decisive_rate(self) -> float:
        return (self.supported + self.contradicted) / self.n_studies

    @property
    def supported_rate(self) -> float:
        return self.supported / self.n_studies


def calibrate(
    design: Design,
    truth: Truth,
    n_studies: int,
    seed: int = 0,
    eps: float = analysis.DEFAULT_EPS,
    n_boot: int = 200,
) -> Calibration:
    """Runs n_studies simulated studies through the analysis and counts the outcomes."""
    rng = np.random.default_rng(seed)
    counts = {
        o: 0
        for o in (
            analysis.SUPPORTED,
            analysis.CONTRADICTED,
            analysis.NO_EFFECT,
            analysis.INCONCLUSIVE,
        )
    }
    mds = []
    for _ in range(n_studies):
        recs = simulate_study(rng, design, truth)
        summaries = analysis.summarize_members(recs, eps, n_boot=n_boot)
        d = analysis.decide(summaries)
        counts[d.outcome] += 1
        if d.b_crit_slope is not None:
            mds.append(d.b_crit_slope.min_detectable)
    return Calibration(
        n_studies,
        counts[analysis.SUPPORTED],
        counts[analysis.CONTRADICTED],
        counts[analysis.NO_EFFECT],
        counts[analysis.INCONCLUSIVE],
        float(np.median(mds)) if mds else None,
    )


def four_x_design() -> Design:
    """Four members over a 4x width range (the issue's calibration standard)."""
    return Design(widths=(100.0, 159.0, 252.0, 400.0), depths=(8, 4, 2, 1))


def table(noises: Sequence[float], n_studies: int, alpha: float, n_boot: int) -> list[str]:
    rows = [
        "| design | noise (sigma of log steps) | decisive under the null (identical members) "
        f"| 'supported' with B_crit ~ width^{alpha:g} | median min. detectable slope |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, design in (
        ("4 members, 4x width range", four_x_design()),
        ("configs/mlp.py:local shape (8.4x)", Design()),
    ):
        for k, noise in enumerate(noises):
            null = calibrate(
                design, Truth(alpha=0.0, noise=noise), n_studies, seed=100 + k, n_boot=n_boot
            )
            eff = calibrate(
                design, Truth(alpha=alpha, noise=noise), n_studies, seed=200 + k, n_boot=n_boot
            )
            rows.append(
                f"| {name} | {noise:g} | {null.decisive_rate:.1%} "
                f"({null.supported + null.contradicted}/{n_studies}) | "
                f"{eff.supported_rate:.1%} ({eff.supported}/{n_studies}) | "
                f"{null.median_min_detectable:.2f} |"
            )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", type=int, default=300, help="simulated studies per table cell")
    p.add_argument("--noise", default="0.05,0.1,0.2", help="comma-separated seed-noise sigmas")
    p.add_argument("--alpha", type=float, default=0.5, help="effect: B_crit ~ width^alpha")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates per member")
    a = p.parse_args(argv)
    try:
        noises = [float(v) for v in a.noise.split(",")]
    except ValueError:
        print(f"--noise={a.noise!r}: give comma-separated numbers, e.g. 0.05,0.1", file=sys.stderr)
        return 2
    if a.studies < 1 or a.bootstrap < 20:
        print("--studies must be >= 1 and --bootstrap >= 20", file=sys.stderr)
        return 2
    t0 = time.time()
    for line in table(noises, a.studies, a.alpha, a.bootstrap):
        print(line)
    print(
        f"\n({a.studies} studies per cell, {a.bootstrap} bootstrap replicates per member, "
        f"{time.time() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
