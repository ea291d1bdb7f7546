"""Owns the across-member slope: a random-effects meta-regression of a per-member log quantity
(log B_crit, log of the model-free critical batch, log B_simple) on log width.

Each member i gives an estimate y_i with its own sampling variance v_i (from its bootstrap). The
members also differ from any straight line for reasons unrelated to their measurement error
(learning-rate luck, architecture details): a between-member variance tau^2. The model is

    y_i = b0 + b1 x_i + u_i + e_i,   u_i ~ N(0, tau^2),   e_i ~ N(0, v_i),

fitted by weighted least squares with weights 1 / (v_i + tau^2), tau^2 by REML (restricted maximum
likelihood; DerSimonian-Laird's moment estimate is kept as a cross-check). The interval on the
slope is Knapp-Hartung's: the weighted residual scale q (floored at 1, the "modified" form, so the
interval is never narrower than the plain random-effects one) times the model's variance, with a
t quantile on m - 2 degrees of freedom. With few members that is what keeps the false-positive rate
near its nominal level; a fixed-effects interval (the members' measurement error alone) does not.

The leverage of each member (its share of the slope's weighted sum of squares in x) and the
leave-one-out slopes say whether one member decides the result.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, stats

# Variances below this are treated as this (a member measured "exactly" would otherwise take all
# the weight).
MIN_VARIANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class MetaSlope:
    """The random-effects slope of y on x across members, with a t interval on m - 2 df."""

    value: float
    low: float
    high: float
    se: float
    tau2: float  # between-member variance about the line (REML)
    df: int  # m - 2
    n_members: int
    leverage: tuple  # each member's share of the slope's weight (sums to 1), in input order
    loo: tuple  # the slope with each member left out (None where fewer than 3 remain)
    # (t_0.975 + t_0.80) x SE: an analytic guide only; the report's power sentence simulates the
    # study's design instead (`wide_tf.analysis.robustness.min_detectable`).
    min_detectable: float

    @property
    def decision(self) -> int:
        """+1 / -1 when the interval excludes 0 on that side, else 0."""
        return 1 if self.low > 0 else -1 if self.high < 0 else 0

    @property
    def loo_agree(self) -> bool:
        """Every leave-one-out slope lies on the same side of 0 as the slope itself."""
        vals = [v for v in self.loo if v is not None]
        return bool(vals) and all(np.sign(v) == np.sign(self.value) and v != 0 for v in vals)

    @property
    def max_leverage(self) -> float:
        return max(self.leverage) if self.leverage else float("nan")


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Weighted least squares of y on (1, x): coefficients, their covariance (unscaled) and
    residuals."""
    X = np.stack([np.ones_like(x), x], axis=1)
    xtwx = X.T @ (w[:, None] * X)
    cov = np.linalg.inv(xtwx)
    beta = cov @ (X.T @ (w * y))
    return beta, cov, y - X @ beta


def _reml_neg_loglik(tau2: float, x, y, v) -> float:
    """-log restricted likelihood (up to a constant; the fixed effects integrated out):
    0.5 (sum log(v + tau^2) + weighted RSS + log det X'WX), the line fitted about the weighted
    means, where det X'WX = sum(w) x sum(w (x - xbar_w)^2). Scalar sums instead of `_wls`'s 2 x 2
    inverses: the REML search evaluates it ~30 times per slope (tests/analysis/test_stats.py
    checks the minimiser against the textbook likelihood by brute force)."""
    vt = v + tau2
    w = 1.0 / vt
    sw = float(np.sum(w))
    xc = x - float(w @ x) / sw
    yc = y - float(w @ y) / sw
    sxx = float(w @ (xc * xc))
    r = yc - (float(w @ (xc * yc)) / sxx) * xc
    return 0.5 * (float(np.sum(np.log(vt))) + float(w @ (r * r)) + math.log(sw * sxx))


def tau2_reml(x: np.ndarray, y: np.ndarray, v: np.ndarray) -> float:
    """REML estimate of the between-member variance (0 when the members scatter no more than
    their measurement errors say)."""
    if x.size <= 2:
        return 0.0
    hi = max(float(np.var(y)) * 10.0, 1e-4)
    f = lambda t: _reml_neg_loglik(t, x, y, v)
    res = optimize.minimize_scalar(f, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-8})
    t = float(res.x)
    # The bounded search never evaluates the end point 0 itself.
    return 0.0 if f(0.0) <= f(t) else t


def tau2_dl(x: np.ndarray, y: np.ndarray, v: np.ndarray) -> float:
    """DerSimonian-Laird's method-of-moments estimate for a meta-regression (a cross-check)."""
    m = x.size
    if m <= 2:
        return 0.0
    w = 1.0 / v
    _, cov, r = _wls(x, y, w)
    q = float(np.sum(w * r**2))
    X = np.stack([np.ones_like(x), x], axis=1)
    # tr(W) - tr((X'WX)^-1 X'W^2 X)
    c = float(np.sum(w) - np.trace(cov @ (X.T @ ((w**2)[:, None] * X))))
    return max(0.0, (q - (m - 2)) / c) if c > 0 else 0.0


def knapp_hartung_q(w: np.ndarray, r: np.ndarray, df: int, floor: bool = True) -> float:
    """Knapp-Hartung's scale: the weighted residual mean square, floored at 1 (the "modified"
    form). Unfloored, a q below 1 narrows the interval below the random-effects one whenever the
    members happen to scatter less than their variances say, which on 5 df is often (q = 0.245
    made the local study's interval 2x too narrow); `tests/analysis/test_stats.py` measures the
    coverage of both."""
    q = float(np.sum(w * r**2)) / df if df >= 1 else 1.0
    return max(q, 1.0) if floor else q


def _slope_only(x, y, v, tau2=None, floor=True) -> tuple[float, float, float, float]:
    """(slope, Knapp-Hartung SE, tau^2, q) for one set of members."""
    t2 = tau2_reml(x, y, v) if tau2 is None else tau2
    w = 1.0 / (v + t2)
    beta, cov, r = _wls(x, y, w)
    q = knapp_hartung_q(w, r, x.size - 2, floor)
    se = math.sqrt(q * cov[1, 1])
    return float(beta[1]), se, t2, q


def random_effects_slope(x, y, var, level: float = 0.95, floor_q: bool = True) -> MetaSlope | None:
    """The slope of y on x across members (see the module docstring). None with fewer than 3
    members or fewer than 2 distinct x: a slope with its own scatter needs m - 2 >= 1.
    floor_q=False gives the unfloored Knapp-Hartung interval (only to measure its coverage)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    v = np.maximum(np.asarray(var, dtype=float), MIN_VARIANCE)
    if x.size < 3 or np.ptp(x) <= 0 or not (np.all(np.isfinite(y)) and np.all(np.isfinite(v))):
        return None
    value, se, t2, _ = _slope_only(x, y, v, floor=floor_q)
    df = x.size - 2
    tq = float(stats.t.ppf(0.5 + level / 2, df))
    w = 1.0 / (v + t2)
    xw = np.sum(w * x) / np.sum(w)
    lev = w * (x - xw) ** 2
    lev = lev / lev.sum()
    loo = []
    for i in range(x.size):
        keep = np.arange(x.size) != i
        if keep.sum() >= 3 and np.ptp(x[keep]) > 0:
            loo.append(_slope_only(x[keep], y[keep], v[keep], floor=floor_q)[0])
        else:
            loo.append(None)
    t80 = float(stats.t.ppf(0.80, df))
    return MetaSlope(
        value=value,
        low=value - tq * se,
        high=value + tq * se,
        se=se,
        tau2=t2,
        df=df,
        n_members=int(x.size),
        leverage=tuple(float(v_) for v_ in lev),
        loo=tuple(loo),
        min_detectable=(tq + t80) * se,
    )


def variance_from_replicates(reps: np.ndarray) -> float:
    """A member's sampling variance from its bootstrap replicates, robust to a few wild ones: the
    95% percentile width over 2 x 1.96, squared (equals the variance for a normal spread)."""
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size < 2:
        return float("inf")
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float(((hi - lo) / (2 * 1.959964)) ** 2)
