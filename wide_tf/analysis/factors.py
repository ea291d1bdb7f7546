"""Owns the two-factor fit: log B_x(1+eps) on log width **and** log depth over the members of
several studies (a budget family, a width family at one depth, a depth family at one width), to
say how much of the budget family's slope each factor carries.

The model is the random-effects meta-regression of `wide_tf.analysis.stats.meta` with two
covariates and one intercept per study (a study's target, data order and protocol shift all its
members alike):

    y_i = a_study(i) + b_w log w_i + b_d log d_i + u_i + e_i,  u_i ~ N(0, tau^2), e_i ~ N(0, v_i)

tau^2 by REML, the interval Knapp-Hartung's (q floored at 1) on m - p df. In a fixed-budget family
log depth falls with log width (slope g of log d on log w over its members), so the budget
family's slope on log width is b_w + g b_d: `width_part` = b_w and `depth_part` = g b_d, each
with its interval, are the two factors' shares of it.

Pure NumPy/SciPy; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from wide_tf.analysis import decision as dec
from wide_tf.analysis.stats.meta import MIN_VARIANCE


@dataclasses.dataclass(frozen=True)
class Coefficient:
    value: float
    low: float
    high: float
    se: float


@dataclasses.dataclass(frozen=True)
class TwoFactor:
    width: Coefficient  # b_w: log B_x(1+eps) per log width at fixed depth
    depth: Coefficient  # b_d: per log depth at fixed width
    width_part: Coefficient | None  # b_w: the width factor's part of the budget slope
    depth_part: Coefficient | None  # g b_d: the depth factor's part of it
    budget_slope: float | None  # b_w + g b_d
    depth_per_width: float | None  # g: log depth on log width in the budget family
    tau2: float
    df: int
    n_members: int


def _gls(X, y, w):
    xtwx = X.T @ (w[:, None] * X)
    cov = np.linalg.inv(xtwx)
    beta = cov @ (X.T @ (w * y))
    return beta, cov, y - X @ beta


def _reml(X, y, v) -> float:
    def nll(t):
        w = 1.0 / (v + t)
        _, cov, r = _gls(X, y, w)
        return 0.5 * (np.sum(np.log(v + t)) + np.sum(w * r**2) - math.log(np.linalg.det(cov)))

    hi = max(float(np.var(y)) * 10.0, 1e-4)
    res = optimize.minimize_scalar(nll, bounds=(0.0, hi), method="bounded")
    return 0.0 if nll(0.0) <= nll(float(res.x)) else float(res.x)


def _coef(value, var, tq) -> Coefficient:
    se = math.sqrt(max(var, 0.0))
    return Coefficient(float(value), float(value - tq * se), float(value + tq * se), se)


def fit(log_width, log_depth, y, var, study, budget_study=None, level=0.95) -> TwoFactor | None:
    """The two-factor fit over members (arrays of one entry per member; `study` labels which
    study each member came from; `budget_study` names the fixed-budget family whose slope is
    split). None when the design cannot separate the factors (fewer than p + 1 members, or log
    width and log depth collinear)."""
    lw, ld = np.asarray(log_width, float), np.asarray(log_depth, float)
    y, v = np.asarray(y, float), np.maximum(np.asarray(var, float), MIN_VARIANCE)
    labels = sorted(set(study))
    dummies = [np.array([s == lab for s in study], float) for lab in labels]
    X = np.column_stack(dummies + [lw, ld])
    p = X.shape[1]
    if y.size <= p or np.linalg.matrix_rank(X) < p:
        return None
    t2 = _reml(X, y, v)
    w = 1.0 / (v + t2)
    beta, cov, r = _gls(X, y, w)
    df = y.size - p
    q = max(float(np.sum(w * r**2)) / df, 1.0)
    cov = q * cov
    tq = float(stats.t.ppf(0.5 + level / 2, df))
    bw, bd = beta[-2], beta[-1]
    g = wp = dp = slope = None
    mine = np.array([s == budget_study for s in study])
    if budget_study is not None and mine.sum() >= 2 and np.ptp(lw[mine]) > 0:
        g = float(np.polyfit(lw[mine], ld[mine], 1)[0])
        wp = _coef(bw, cov[-2, -2], tq)
        dp = _coef(g * bd, g * g * cov[-1, -1], tq)
        slope = float(bw + g * bd)
    return TwoFactor(
        _coef(bw, cov[-2, -2], tq),
        _coef(bd, cov[-1, -1], tq),
        wp,
        dp,
        slope,
        g,
        t2,
        df,
        int(y.size),
    )


def fit_studies(studies: Mapping[str, Sequence], budget_study: str | None = None):
    """The two-factor fit over several studies' member summaries ({label: summaries}): each
    member's log B_x(1+eps) and variance as the verdict's slope takes them (a bound at its
    bound; members without an estimate left out)."""
    lw, ld, y, v, lab = [], [], [], [], []
    for name, summaries in studies.items():
        use, _ = dec.member_entries(list(summaries), "model_free")
        for s, yi, vi, _c in use:
            if not (s.info.width and s.info.depth):
                continue
            lw.append(math.log(s.info.width)), ld.append(math.log(s.info.depth))
            y.append(yi), v.append(vi), lab.append(name)
    return fit(lw, ld, y, v, lab, budget_study)
