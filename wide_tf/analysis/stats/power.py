"""Owns the slope's decision on many simulated studies at once, for power: the random-effects
slope of `wide_tf.analysis.stats.meta` (REML tau^2, Knapp-Hartung interval with q floored at 1,
leave-one-out agreement, and the check without the member of the largest leverage) vectorised
over studies that share the members' x and variances.

tau^2 is the REML minimum over a fixed grid (0 and 48 log-spaced values from 1e-4 to 4) rather
than a bounded search per study: `tests/analysis/test_stats.py` checks that it agrees with
`meta.random_effects_slope` on the decisions. Thousands of studies take milliseconds, so a
report can say what its own design detects.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from wide_tf.analysis.stats.meta import MIN_VARIANCE

TAU2_GRID = np.concatenate([[0.0], np.geomspace(1e-4, 4.0, 48)])


def _fit(x: np.ndarray, v: np.ndarray, ys: np.ndarray, level: float):
    """(slope, low, high, index of the member of the largest leverage) arrays (S,) for studies
    ys (S, m) on members x (m,), variances v."""
    x, v = np.asarray(x, float), np.maximum(np.asarray(v, float), MIN_VARIANCE)
    ys = np.atleast_2d(np.asarray(ys, float))
    m = x.size
    X = np.stack([np.ones_like(x), x], axis=1)
    best = np.full(ys.shape[0], np.inf)
    slope = np.zeros(ys.shape[0])
    se = np.zeros(ys.shape[0])
    heavy = np.zeros(ys.shape[0], dtype=int)
    for t2 in TAU2_GRID:
        w = 1.0 / (v + t2)
        a = X.T @ (w[:, None] * X)
        inv = np.linalg.inv(a)
        beta = ys @ (w[:, None] * X) @ inv  # (S, 2)
        r = ys - beta @ X.T
        rss = np.sum(w * r**2, axis=1)
        nll = 0.5 * (np.sum(np.log(v + t2)) + rss + np.log(np.linalg.det(a)))
        take = nll < best - 1e-12
        q = np.maximum(rss / (m - 2), 1.0)
        best = np.where(take, nll, best)
        slope = np.where(take, beta[:, 1], slope)
        se = np.where(take, np.sqrt(q * inv[1, 1]), se)
        # The leverage at this tau^2 (as `meta.random_effects_slope` weighs the members).
        heavy = np.where(take, int(np.argmax(w * (x - np.sum(w * x) / np.sum(w)) ** 2)), heavy)
    tq = float(stats.t.ppf(0.5 + level / 2, m - 2))
    return slope, slope - tq * se, slope + tq * se, heavy


def decisions(x, v, ys, heaviest_level: float) -> np.ndarray:
    """+1 / -1 where a study's interval excludes 0 on that side, every leave-one-out slope
    (where 3 members remain) has the same sign, and the slope without the member of the largest
    leverage excludes 0 on the same side at `heaviest_level` (the rule's check and its level,
    `wide_tf.analysis.decision.HEAVIEST_LEVEL`); 0 otherwise. Shape (S,)."""
    x, v = np.asarray(x, float), np.asarray(v, float)
    ys = np.atleast_2d(np.asarray(ys, float))
    _, low, high, heavy = _fit(x, v, ys, 0.95)
    dec = np.where(low > 0, 1, np.where(high < 0, -1, 0))
    for i in range(x.size):
        keep = np.arange(x.size) != i
        if keep.sum() < 3 or np.ptp(x[keep]) <= 0:
            # Too few members without it: the check cannot pass where it is the heaviest.
            dec = np.where(heavy == i, 0, dec)
            continue
        loo, r_low, r_high, _ = _fit(x[keep], v[keep], ys[:, keep], heaviest_level)
        dec = np.where(np.sign(loo) == dec, dec, 0)
        rest = np.where(r_low > 0, 1, np.where(r_high < 0, -1, 0))
        dec = np.where((heavy == i) & (rest != dec), 0, dec)
    return dec


def power_curve(x, v, noise: np.ndarray, slopes_, heaviest_level: float) -> np.ndarray:
    """The share of studies that detect each true slope (in its own direction): studies are the
    line b x plus the rows of `noise` (S, m), the same rows for every b (common random numbers,
    so the curve is smooth in b), decided by `decisions`."""
    xc = np.asarray(x, float) - np.mean(x)
    out = []
    for b in slopes_:
        dec = decisions(x, v, noise + b * xc[None, :], heaviest_level)
        out.append(float(np.mean(dec == np.sign(b))) if b != 0 else float(np.mean(dec != 0)))
    return np.array(out)


def min_detectable(
    x, v, noise: np.ndarray, heaviest_level: float, power: float = 0.8, hi: float = 4.0
) -> float | None:
    """The smallest positive slope detected in `power` of the studies (to 0.01; a positive and
    a negative slope are found alike up to the members' spread), None when even `hi` is not."""
    lo_b, hi_b = 0.0, hi
    if power_curve(x, v, noise, [hi_b], heaviest_level)[0] < power:
        return None
    while hi_b - lo_b > 0.01:
        mid = 0.5 * (lo_b + hi_b)
        if power_curve(x, v, noise, [mid], heaviest_level)[0] >= power:
            hi_b = mid
        else:
            lo_b = mid
    return hi_b
