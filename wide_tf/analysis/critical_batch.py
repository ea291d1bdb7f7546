"""Owns the numbers of one family member's batch-size curve: the censored fit of
S(B) = S_min (1 + B_crit / B), the model-free critical batch B_x(1+eps) (the first batch whose
epochs-to-target exceed perfect scaling by eps), the lack-of-fit test, and their intervals.

NumPy (and SciPy's distributions through `wide_tf.analysis.stats.lof`), vectorised over replicates
so a whole simulated study is analysed in milliseconds; that is what lets
`wide_tf.analysis.simulate` calibrate the verdict on thousands of studies in a test.

The model, in log space (y = log steps-to-target, one observation per seed):

    y = a + log(1 + B_crit / B) + cell effect + seed noise,    a = log S_min.

* **Censoring.** A run that did not reach the target within its budget of c steps says only
  S > c. It enters the least-squares loss one-sidedly: (log c - prediction)^2 when the fit
  predicts fewer steps than the run was given, 0 otherwise. This is a hinge on the budget, not a
  likelihood: a censored run pulls the curve up to its budget and no further, so where a fit leans
  on censored runs it places the curve at the budget (an underestimate of S there), which is why
  such cells are flagged and counted. Dropping those runs instead would bias S further down at
  exactly the batches where scaling breaks down.
* **Fitting.** For each B_crit on a log grid spanning 100x beyond the batches tried, the best `a`
  solves a convex piecewise-quadratic problem (a few exact Newton steps); the grid minimum is then
  refined by a parabola through its neighbours. No local minima, no starting values to tune.
* **Bounds.** A B_crit outside the batches tried is not measured: the curve is flat (B_crit below
  the smallest batch) or still falling as 1/B (above the largest) over the whole range. It is
  reported as a bound ("> 4,000"), never as a number, and such a member does not enter the slope
  across members (`wide_tf.analysis.verdict`): a bound placed at the edge of the range could move
  the slope either way.
* **Fit quality that can fail.** The lack-of-fit F test of the cell means against the pure seed
  error (`wide_tf.analysis.stats.lof`); R^2 of log epochs is kept as a description only (a knee-less
  power law scores high on it).
* **Intervals.** Parametric hierarchical replicates (`wide_tf.analysis.stats.lof.draw`): a cell
  effect and seed noise, each with its variance estimated from the data and drawn from its sampling
  distribution; a replicate above a run's budget is censored there, as the run would have been.
  B_crit's replicates are centred on the fitted curve; the model-free measure's on the observed
  cell values, so its interval does not lean on the curve's shape.
* **B_x(1+eps)** (model-free; Zhang et al. 2024 define the critical batch this way with
  eps = 0.2): on the cell values of epochs-to-target (`cell_values`: the geometric mean over a
  cell's seeds, or the median, censored seeds counting as larger than any finished one, where a
  seed did not finish), the reference E_ref is the geometric mean of the two smallest batches'
  epochs (perfect scaling keeps epochs constant); B_x(1+eps) is the first batch at which the
  curve, interpolated linearly in (log B, log E), rises above (1 + eps) E_ref. No crossing
  within the batches tried is a bound ("> largest batch"). On an exact S_min (1 + B_crit / B)
  curve B_x1.2 is about B_crit / 5 (McCandlish's B_crit is the batch where epochs have
  doubled).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from wide_tf.analysis.stats import lof

# The B_crit grid reaches this factor beyond the smallest and largest batch tried.
GRID_MARGIN = 100.0
GRID_POINTS = 61
NEWTON_STEPS = 8


@dataclasses.dataclass(frozen=True)
class Observations:
    """The seed-level data of one member at its chosen learning rates."""

    batch: np.ndarray  # (n,) batch size of each observation
    log_steps: np.ndarray  # (n,) log steps-to-target, or log of the budget when censored
    censored: np.ndarray  # (n,) bool: did not reach the target within log_steps
    num_train: int
    # (n,) the seed of each observation (None: unknown; the replicates then draw every run's
    # seed noise independently instead of sharing a seed's effect across its batch sizes).
    seed: np.ndarray | None = None

    @classmethod
    def make(cls, batch, steps, censored, num_train, seed=None) -> Observations:
        b = np.asarray(batch, dtype=float)
        s = np.asarray(steps, dtype=float)
        c = np.asarray(censored, dtype=bool)
        sd = None if seed is None else np.asarray(seed)
        if not (b.shape == s.shape == c.shape) or (sd is not None and sd.shape != b.shape):
            raise ValueError("batch, steps and censored must have one entry per observation")
        if np.any(s <= 0) or np.any(b <= 0):
            raise ValueError("steps and batch sizes must be positive")
        order = np.argsort(b, kind="stable")
        sd = None if sd is None else sd[order]
        return cls(b[order], np.log(s[order]), c[order], int(num_train), sd)


@dataclasses.dataclass(frozen=True)
class Fit:
    log_s_min: float
    log_b_crit: float
    r2_log_epochs: float | None  # None: fewer than 3 finished observations or no spread in log E
    rms_log: float | None  # RMS residual of the finished observations in log steps
    n_obs: int
    n_censored: int

    @property
    def s_min(self) -> float:
        return float(np.exp(self.log_s_min))

    @property
    def b_crit(self) -> float:
        return float(np.exp(self.log_b_crit))


def _grid(batch: np.ndarray) -> np.ndarray:
    lo, hi = np.log(batch.min() / GRID_MARGIN), np.log(batch.max() * GRID_MARGIN)
    return np.linspace(lo, hi, GRID_POINTS)


# Replicates with a censored run per block of `_profile_censored`: its (rows, K, n) temporaries
# then stay within a core's cache (about 1 MB each at 61 grid points and 35 runs).
PROFILE_BLOCK = 64


def _profile(log_bc: np.ndarray, batch: np.ndarray, y: np.ndarray, cens: np.ndarray):
    """Best a and loss for every B_crit on a grid and every replicate.

    log_bc: (K,); batch: (n,); y, cens: (R, n). Returns a, loss of shape (R, K). A replicate
    without a censored run is a plain least-squares fit at each grid point (closed form, one
    matrix product for all of them); the others go through `_profile_censored`."""
    f = np.log1p(np.exp(log_bc)[:, None] / batch[None, :])  # (K, n)
    a = np.empty((len(y), len(log_bc)))
    loss = np.empty_like(a)
    plain = ~cens.any(-1)
    if plain.any():
        a[plain], loss[plain] = _profile_uncensored(f, y[plain])
    rest = np.flatnonzero(~plain)
    for i in range(0, rest.size, PROFILE_BLOCK):
        rows = rest[i : i + PROFILE_BLOCK]
        a[rows], loss[rows] = _profile_censored(f, y[rows], cens[rows])
    return a, loss


def _profile_uncensored(f: np.ndarray, y: np.ndarray):
    """`_profile` for replicates without a censored run: a = mean(y - f) and the loss the sum of
    squares about it, from the centred y and f (so no large sums cancel)."""
    yc = y - y.mean(-1, keepdims=True)
    fc = f - f.mean(-1, keepdims=True)
    a = y.mean(-1)[:, None] - f.mean(-1)[None, :]
    loss = (yc**2).sum(-1)[:, None] - 2.0 * (yc @ fc.T) + (fc**2).sum(-1)[None, :]
    return a, np.maximum(loss, 0.0)


def _profile_censored(f: np.ndarray, y: np.ndarray, cens: np.ndarray):
    """`_profile` by Newton steps on the censored least-squares loss (f: (K, n))."""
    d = y[:, None, :] - f[None, :, :]  # (R, K, n): y - f; residual = d - a
    fin = ~cens[:, None, :]
    n_fin = fin.sum(-1)
    # Start from the fit to finished runs only; censored ones can only push `a` up.
    a = np.where(n_fin > 0, np.where(fin, d, 0.0).sum(-1) / np.maximum(n_fin, 1), d.max(-1))
    for _ in range(
        NEWTON_STEPS
    ):  # exact on a convex piecewise quadratic once the active set is right
        r = d - a[..., None]
        active = fin | (
            r > 0
        )  # censored runs count only when the prediction lies below their budget
        num = np.where(active, r, 0.0).sum(-1)
        a = a + num / np.maximum(active.sum(-1), 1)
    r = d - a[..., None]
    loss = np.where(fin, r**2, np.where(r > 0, r**2, 0.0)).sum(-1)
    return a, loss


def fit_many(batch: np.ndarray, y: np.ndarray, cens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log S_min, log B_crit) for each replicate row of y: arrays of shape (R,)."""
    y = np.atleast_2d(y)
    cens = np.broadcast_to(cens, y.shape)
    grid = _grid(batch)
    a, loss = _profile(grid, batch, y, cens)
    k = np.argmin(loss, axis=1)
    # Parabolic refinement through the grid minimum and its neighbours (interior minima only).
    step = grid[1] - grid[0]
    kc = np.clip(k, 1, len(grid) - 2)
    rows = np.arange(len(k))
    l0, l1, l2 = loss[rows, kc - 1], loss[rows, kc], loss[rows, kc + 1]
    denom = l0 - 2 * l1 + l2
    shift = np.where(denom > 0, 0.5 * (l0 - l2) / np.where(denom > 0, denom, 1.0), 0.0)
    shift = np.clip(shift, -1.0, 1.0)
    interior = (k > 0) & (k < len(grid) - 1)
    log_bc = np.where(interior, grid[kc] + shift * step, grid[k])
    a_ref, _ = _profile_at(log_bc, batch, y, cens)
    return a_ref, log_bc


def _profile_at(log_bc: np.ndarray, batch, y, cens):
    """Best a at one B_crit per replicate (log_bc: (R,))."""
    f = np.log1p(np.exp(log_bc)[:, None] / batch[None, :])  # (R, n)
    d = y - f
    fin = ~cens
    n_fin = fin.sum(-1)
    a = np.where(n_fin > 0, np.where(fin, d, 0.0).sum(-1) / np.maximum(n_fin, 1), d.max(-1))
    for _ in range(NEWTON_STEPS):
        r = d - a[:, None]
        active = fin | (r > 0)
        a = a + np.where(active, r, 0.0).sum(-1) / np.maximum(active.sum(-1), 1)
    r = d - a[:, None]
    return a, r


def predict_log_steps(log_s_min, log_b_crit, batch) -> np.ndarray:
    return np.asarray(log_s_min)[..., None] + np.log1p(
        np.exp(np.asarray(log_b_crit))[..., None] / np.asarray(batch, dtype=float)
    )


def fit(obs: Observations) -> Fit | None:
    """The point fit; None when fewer than 3 batch sizes have a finished run."""
    fin = ~obs.censored
    if np.unique(obs.batch[fin]).size < 3:
        return None
    a, lbc = fit_many(obs.batch, obs.log_steps[None, :], obs.censored[None, :])
    a, lbc = float(a[0]), float(lbc[0])
    res = obs.log_steps - predict_log_steps(a, lbc, obs.batch)
    rf = res[fin]
    log_e = obs.log_steps[fin] + np.log(obs.batch[fin])
    sst = float(np.sum((log_e - log_e.mean()) ** 2))
    r2 = 1.0 - float(np.sum(rf**2)) / sst if rf.size >= 3 and sst > 1e-12 else None
    return Fit(
        a, lbc, r2, float(np.sqrt(np.mean(rf**2))), int(obs.batch.size), int(obs.censored.sum())
    )


# ----------------------------------------------------------------------------------------------
# Cell values and the model-free critical batch B_x(1+eps)
# ----------------------------------------------------------------------------------------------


def cell_values(batch: np.ndarray, y: np.ndarray, cens: np.ndarray):
    """A cell's log steps per batch, per replicate: the **mean over its seeds** (the log of their
    geometric mean) when every seed finished, else the **median** with censored seeds counting
    as +inf (larger than every finished seed); a median that lands on one is censored at the
    smallest censored bound of the cell. Returns (batches (m,), value (R, m), censored (R, m)).

    Why the mean: with no seed censored it has the smallest variance (the median of 5 or 7
    normal values has about 1.4x the mean's), and at the noise the local studies measure the
    seeds carry most of a member's error, so it buys power at no cost in runs
    (docs/power_table.txt). Where a seed is censored its steps are unknown and only the median's
    ordering argument holds."""
    y = np.atleast_2d(y)
    cens = np.broadcast_to(cens, y.shape)
    bs = np.unique(batch)
    vals, flags = [], []
    for b in bs:
        cols = batch == b
        cc = cens[:, cols]
        yy = np.where(cc, np.inf, y[:, cols])
        k = yy.shape[1]
        srt = np.sort(yy, axis=1)
        med = srt[:, (k - 1) // 2] if k % 2 else 0.5 * (srt[:, k // 2 - 1] + srt[:, k // 2])
        bound = np.where(cc, y[:, cols], np.inf).min(axis=1)
        is_c = ~np.isfinite(med)
        any_c = cc.any(axis=1)
        mean = np.where(cc, 0.0, y[:, cols]).mean(axis=1)
        vals.append(np.where(is_c, bound, np.where(any_c, med, mean)))
        flags.append(is_c)
    return bs, np.stack(vals, axis=1), np.stack(flags, axis=1)


def first_crossing(batches: np.ndarray, log_e: np.ndarray, cens: np.ndarray, eps: float):
    """log B_x(1+eps) per replicate on (log B, log E) cell curves.

    log_e, cens: (R, m) over ascending batches. The reference is the mean log E of the two
    smallest batches (the first alone when the second is censored or missing). Returns
    (log_value (R,), status (R,)) with status 0 = crossing found, 1 = no crossing up to the
    largest batch (a lower bound: the largest batch), 2 = undefined (the smallest batch never
    reached the target). A censored cell whose bound is already above the threshold crosses
    there; its bound stands for its value (so the crossing is, if anything, placed late)."""
    log_e = np.atleast_2d(log_e)
    cens = np.broadcast_to(cens, log_e.shape)
    lb = np.log(batches.astype(float))
    if log_e.shape[1] >= 2:
        two = ~cens[:, 1]
        ref = np.where(two, 0.5 * (log_e[:, 0] + log_e[:, 1]), log_e[:, 0])
    else:
        ref = log_e[:, 0]
    thr = ref + np.log1p(eps)
    above = log_e > thr[:, None] + 1e-12
    above[:, 0] = False
    has = above.any(axis=1)
    j = np.argmax(above, axis=1)  # first index above the threshold
    jm = np.maximum(j - 1, 0)
    rows = np.arange(log_e.shape[0])
    e0, e1 = log_e[rows, jm], log_e[rows, j]
    frac = np.where(e1 > e0, (thr - e0) / np.where(e1 > e0, e1 - e0, 1.0), 1.0)
    frac = np.clip(frac, 0.0, 1.0)
    value = np.where(has, lb[jm] + frac * (lb[j] - lb[jm]), lb[-1])
    status = np.where(cens[:, 0], 2, np.where(has, 0, 1))
    return value, status


# ----------------------------------------------------------------------------------------------
# Bootstrap
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with a 95% interval; each end may be a bound beyond the batches tried."""

    value: float | None
    low: float | None
    high: float | None
    below_range: bool = False  # the point estimate is below the smallest batch tried
    above_range: bool = False  # ... above the largest batch tried
    low_open: bool = False  # the interval's low end is below the range (reads "< smallest")
    high_open: bool = False  # the interval's high end is above the range (reads "> largest")
    range_lo: float | None = None
    range_hi: float | None = None

    @property
    def is_bound(self) -> bool:
        return self.below_range or self.above_range


def bias_corrected_quantiles(point: float, reps: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Efron's bias-corrected percentile interval: when the estimator is biased, replicates drawn
    around the estimate carry the bias again, and plain percentiles shift the interval the same
    way twice. z0 = Phi^-1(share of replicates below the point) moves both quantiles back."""
    reps = np.asarray(reps, dtype=float)
    if not reps.size:
        return np.array([np.nan, np.nan])
    share = (np.sum(reps < point) + 0.5 * np.sum(reps == point)) / reps.size
    z0 = float(stats.norm.ppf(np.clip(share, 1.0 / reps.size, 1.0 - 1.0 / reps.size)))
    z = float(stats.norm.ppf(0.5 + level / 2))
    qs = stats.norm.cdf([2 * z0 - z, 2 * z0 + z]) * 100
    return np.percentile(reps, qs)


def _interval(point: float, reps: np.ndarray, lo: float | None = None, hi: float | None = None):
    """Interval in natural units from a log-space point and replicates (bias-corrected
    percentiles); with a range [lo, hi] (the batches tried), values and ends beyond it are marked
    as bounds."""
    q = bias_corrected_quantiles(point, reps)
    iv = Interval(
        value=float(np.exp(point)),
        low=float(np.exp(q[0])) if np.isfinite(q[0]) else None,
        high=float(np.exp(q[1])) if np.isfinite(q[1]) else None,
    )
    if lo is None or hi is None:
        return iv
    tol, llo, lhi = 1e-9, np.log(lo), np.log(hi)
    return dataclasses.replace(
        iv,
        below_range=bool(point < llo - tol),
        above_range=bool(point > lhi + tol),
        low_open=bool(np.isfinite(q[0]) and q[0] < llo - tol),
        high_open=bool(np.isfinite(q[1]) and q[1] > lhi + tol),
        range_lo=float(lo),
        range_hi=float(hi),
    )


@dataclasses.dataclass(frozen=True)
class CurveEstimate:
    """Everything measured about one member's curve, with replicates for the verdict."""

    fit: Fit | None
    fit_reason: str | None  # why there is no fit
    b_crit: Interval | None
    s_min: Interval | None
    b_model_free: Interval | None  # B_x(1+eps), the model-free critical batch
    b_model_free_status: int  # 0 crossing, 1 no crossing (lower bound), 2 undefined
    b_model_free_reason: str
    reference_epochs: float | None  # E_ref: the two smallest batches' epochs (geometric mean)
    threshold_epochs: float | None
    # Replicates in log space (unclipped): the intervals' (variance components drawn too).
    log_b_crit_reps: np.ndarray | None
    log_b_model_free_reps: np.ndarray | None
    band_batches: np.ndarray | None = None  # batches at which the fitted curve's band is given
    band_low: np.ndarray | None = None  # 2.5% / 97.5% of the fitted steps over replicates
    band_high: np.ndarray | None = None
    components: lof.Components | None = None  # variance components and the lack-of-fit test
    # B_x(1+eps)'s sampling replicates (the components fixed at their estimates,
    # `lof.draw(fixed=True)`): the member's variance in the slope across members and its noise
    # in the power simulation.
    log_b_model_free_sampling_reps: np.ndarray | None = None

    @property
    def lof_p(self) -> float | None:
        return None if self.components is None else self.components.p_value


def _bounds(obs: Observations) -> np.ndarray:
    # A run given c steps that would need more is censored at c, in a replicate as in the data.
    # Finished runs' budgets are not recorded here; they could only have censored runs that the
    # data show finishing, so they stay uncensored.
    return np.where(obs.censored, obs.log_steps, np.inf)


def observed_centers(obs: Observations) -> np.ndarray:
    """Each observation's cell centre for model-free replicates: the cell's value (`cell_values`:
    mean log steps, or the median where a seed is censored), or the cell's smallest budget when
    that median is censored (such a cell stays censored in every replicate)."""
    bs, med, _ = cell_values(obs.batch, obs.log_steps, obs.censored)
    return med[0, np.searchsorted(bs, obs.batch)]


def bootstrap_replicates(
    obs: Observations, fit_: Fit, n_boot: int, rng: np.random.Generator, comp=None
):
    """Replicate log steps (n_boot, n) and their censoring flags around the fitted curve."""
    pred = predict_log_steps(fit_.log_s_min, fit_.log_b_crit, obs.batch)
    comp = comp or lof.components(obs.batch, obs.log_steps, obs.censored, pred, obs.seed)
    return lof.draw(comp, pred, obs.batch, _bounds(obs), n_boot, rng, obs.seed)


MODEL_FREE_REASONS = {
    0: "first crossing of (1+eps) x E_ref",
    1: "no crossing up to the largest batch tried (a lower bound)",
}


@dataclasses.dataclass(frozen=True)
class _ModelFreePoint:
    """B_x(1+eps) read off the cell values, before its interval."""

    batches: np.ndarray  # the cells' batch sizes, ascending
    value: float
    status: int  # 0 crossing, 1 no crossing (lower bound), 2 undefined
    reason: str
    reference_epochs: float | None
    threshold_epochs: float | None


def _model_free_point(obs: Observations, eps: float) -> _ModelFreePoint:
    bs, med, med_c = cell_values(obs.batch, obs.log_steps, obs.censored)
    log_e = med + np.log(bs)[None, :] - np.log(obs.num_train)
    point, st = first_crossing(bs, log_e, med_c, eps)
    status = int(st[0])
    e_ref = None
    if status != 2:
        two = log_e.shape[1] >= 2 and not med_c[0, 1]
        e_ref = float(np.exp(0.5 * (log_e[0, 0] + log_e[0, 1]) if two else log_e[0, 0]))
    reason = MODEL_FREE_REASONS.get(
        status, f"the smallest batch B={int(bs[0])} did not reach the target"
    )
    thr = None if e_ref is None else e_ref * (1.0 + eps)
    return _ModelFreePoint(bs, float(point[0]), status, reason, e_ref, thr)


def _model_free_reps(obs, mf: _ModelFreePoint, eps, comp, centers, n_boot, rng, fixed: bool):
    """Log replicates of B_x(1+eps): seeds redrawn about the cell values (replicates where the
    smallest batch never reaches the target are dropped)."""
    bs, log_n = mf.batches, np.log(obs.num_train)
    y_m, c_m = lof.draw(comp, centers, obs.batch, _bounds(obs), n_boot, rng, obs.seed, fixed)
    _, med_r, medc_r = cell_values(obs.batch, y_m, c_m)
    mb_r, st_r = first_crossing(bs, med_r + np.log(bs)[None, :] - log_n, medc_r, eps)
    return mb_r[st_r != 2]


def _model_free_interval(obs, mf: _ModelFreePoint, eps, comp, centers, n_boot, rng, rng_sampling):
    """(Interval, interval replicates, sampling replicates) of B_x(1+eps); Nones when it is
    undefined. The sampling replicates have their own generator, so the intervals' draws (and
    B_crit's after them) are those of a given seed whether or not they are made."""
    if mf.status == 2:
        return None, None, None
    reps = _model_free_reps(obs, mf, eps, comp, centers, n_boot, rng, fixed=False)
    sampling = _model_free_reps(obs, mf, eps, comp, centers, n_boot, rng_sampling, fixed=True)
    iv = _interval(mf.value, reps, float(obs.batch.min()), float(obs.batch.max()))
    return iv, reps, sampling


def estimate(obs: Observations, eps: float, n_boot: int = 200, seed: int = 0) -> CurveEstimate:
    """Point estimates and intervals of B_crit and B_x(1+eps) for one member."""
    rng = np.random.default_rng(seed)
    lo, hi = float(obs.batch.min()), float(obs.batch.max())
    mf = _model_free_point(obs, eps)
    fit_ = fit(obs)
    # Variance components: from the fitted curve when there is one, else from the cell values
    # (then there is no lack-of-fit test, only the seed noise).
    centers = observed_centers(obs)
    pred = (
        predict_log_steps(fit_.log_s_min, fit_.log_b_crit, obs.batch)
        if fit_ is not None
        else centers
    )
    comp = lof.components(obs.batch, obs.log_steps, obs.censored, pred, obs.seed)
    if fit_ is None:
        comp = dataclasses.replace(comp, ms_lof=None, df_lof=0)
    rng_sampling = np.random.default_rng([seed, 1])
    mb, mb_reps, mb_sampling = _model_free_interval(
        obs, mf, eps, comp, centers, n_boot, rng, rng_sampling
    )
    model_free = dict(
        b_model_free=mb,
        b_model_free_status=mf.status,
        b_model_free_reason=mf.reason,
        reference_epochs=mf.reference_epochs,
        threshold_epochs=mf.threshold_epochs,
        log_b_model_free_reps=mb_reps,
        log_b_model_free_sampling_reps=mb_sampling,
        components=comp,
    )
    if fit_ is None:
        reason = (
            f"needs finished runs at >= 3 batch sizes, has "
            f"{np.unique(obs.batch[~obs.censored]).size}"
        )
        return CurveEstimate(
            fit=None, fit_reason=reason, b_crit=None, s_min=None, log_b_crit_reps=None, **model_free
        )
    y, c = bootstrap_replicates(obs, fit_, n_boot, rng, comp)
    a_r, lbc_r = fit_many(obs.batch, y, c)
    grid_b = np.exp(np.linspace(np.log(lo), np.log(hi), 40))
    curves = predict_log_steps(a_r, lbc_r, grid_b)
    band_lo, band_hi = np.exp(np.percentile(curves, [2.5, 97.5], axis=0))
    return CurveEstimate(
        fit=fit_,
        fit_reason=None,
        b_crit=_interval(fit_.log_b_crit, lbc_r, lo, hi),
        s_min=_interval(fit_.log_s_min, a_r),  # steps: no batch range to be beyond
        log_b_crit_reps=lbc_r,
        band_batches=grid_b,
        band_low=band_lo,
        band_high=band_hi,
        **model_free,
    )
