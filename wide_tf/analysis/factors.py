"""Owns the two-factor fit: log B_x(1+eps) on log width **and** log depth over the members of
several studies (a budget family, a width family at one depth, a depth family at one width), to
say how much of the budget family's slope each factor carries.

The model is the random-effects meta-regression of `wide_tf.analysis.stats.meta` with two
covariates and one intercept per study (a study's target, data order and protocol shift all its
members alike):

    y_i = a_study(i) + b_w log w_i + b_d log d_i + u_i + e_i,  u_i ~ N(0, tau^2), e_i ~ N(0, v_i)

A member measured twice (a study's member and the same member of its replicate) has one u: the
replicate adds seeds, not members, so it narrows each member's e but not the members' scatter.

tau^2 by REML, the interval Knapp-Hartung's (q floored at 1) on m - p df. In a fixed-budget family
log depth falls with log width (slope g of log d on log w over its members), so the budget
family's slope on log width is b_w + g b_d: `width_part` = b_w and `depth_part` = g b_d, each
with its interval, are the two factors' shares of it, and their difference b_w - g b_d (with the
covariance of b_w and b_d) says whether one carries more. **Additivity**: the same model with the
product (log w - mean)(log d - mean) added; its coefficient's interval and p test whether the
two effects add (the width family runs at one depth, the depth family at one width, the budget
family along the anti-diagonal: the product is identified only with all three).

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
    # width part - depth part (b_w - g b_d) with its interval (the covariance of b_w and b_d
    # counted): which factor carries more of the budget slope, or that the data cannot say.
    difference: Coefficient | None = None
    # The additivity test: the coefficient of (log w - mean)(log d - mean) added to the model,
    # its interval and two-sided p (Knapp-Hartung t on its own df); None when not identifiable.
    interaction: Coefficient | None = None
    interaction_p: float | None = None
    n_groups: int = 0  # distinct members (a member of a study and of its replicate is one)


def _gls(X, y, W):
    """beta, its covariance (X' W X)^-1 and the residuals; W the inverse covariance (m, m)."""
    xtwx = X.T @ W @ X
    cov = np.linalg.inv(xtwx)
    beta = cov @ (X.T @ (W @ y))
    return beta, cov, y - X @ beta


def _inverse_cov(v, t2, Z):
    return np.linalg.inv(np.diag(v) + t2 * (Z @ Z.T))


def _reml(X, y, v, Z) -> float:
    def nll(t):
        V = np.diag(v) + t * (Z @ Z.T)
        W = np.linalg.inv(V)
        _, cov, r = _gls(X, y, W)
        return 0.5 * (np.linalg.slogdet(V)[1] + float(r @ W @ r) - math.log(np.linalg.det(cov)))

    hi = max(float(np.var(y)) * 10.0, 1e-4)
    res = optimize.minimize_scalar(nll, bounds=(0.0, hi), method="bounded")
    return 0.0 if nll(0.0) <= nll(float(res.x)) else float(res.x)


def _coef(value, var, tq) -> Coefficient:
    se = math.sqrt(max(var, 0.0))
    return Coefficient(float(value), float(value - tq * se), float(value + tq * se), se)


def _solve(X, y, v, Z, level):
    """(beta, covariance scaled by Knapp-Hartung's q floored at 1, tau^2, df, t quantile), or
    None when X cannot be estimated."""
    p = X.shape[1]
    if y.size <= p or np.linalg.matrix_rank(X) < p:
        return None
    t2 = _reml(X, y, v, Z)
    W = _inverse_cov(v, t2, Z)
    beta, cov, r = _gls(X, y, W)
    df = y.size - p
    q = max(float(r @ W @ r) / df, 1.0)
    return beta, q * cov, t2, df, float(stats.t.ppf(0.5 + level / 2, df))


def _additivity(X, lw, ld, y, v, Z, level):
    """(interaction coefficient, its p) with (log w - mean)(log d - mean) added, or (None, None)."""
    inter = (lw - lw.mean()) * (ld - ld.mean())
    got = _solve(np.column_stack([X, inter]), y, v, Z, level)
    if got is None:
        return None, None
    beta, cov, _, df, tq = got
    c = _coef(beta[-1], cov[-1, -1], tq)
    p = float(2 * stats.t.sf(abs(c.value) / c.se, df)) if c.se > 0 else None
    return c, p


def fit(
    log_width, log_depth, y, var, study, budget_study=None, level=0.95, member=None
) -> TwoFactor | None:
    """The two-factor fit over members (arrays of one entry per member; `study` labels which
    study each member came from; `budget_study` names the fixed-budget family whose slope is
    split; `member` labels which entries are one member measured twice, a study's member and
    the same member of its replicate: they share one random effect u, so a member is not
    counted as two independent points about the line). None when the design cannot separate
    the factors (fewer than p + 1 members, or log width and log depth collinear)."""
    lw, ld = np.asarray(log_width, float), np.asarray(log_depth, float)
    y, v = np.asarray(y, float), np.maximum(np.asarray(var, float), MIN_VARIANCE)
    labels = sorted(set(study))
    dummies = [np.array([s == lab for s in study], float) for lab in labels]
    X = np.column_stack(dummies + [lw, ld])
    groups = list(range(y.size)) if member is None else list(member)
    keys = list(dict.fromkeys(groups))
    Z = np.array([[g == k for k in keys] for g in groups], float)
    got = _solve(X, y, v, Z, level)
    if got is None:
        return None
    beta, cov, t2, df, tq = got
    bw, bd = beta[-2], beta[-1]
    g = wp = dp = slope = diff = None
    mine = np.array([s == budget_study for s in study])
    if budget_study is not None and mine.sum() >= 2 and np.ptp(lw[mine]) > 0:
        g = float(np.polyfit(lw[mine], ld[mine], 1)[0])
        wp = _coef(bw, cov[-2, -2], tq)
        dp = _coef(g * bd, g * g * cov[-1, -1], tq)
        slope = float(bw + g * bd)
        diff = _coef(bw - g * bd, cov[-2, -2] + g * g * cov[-1, -1] - 2 * g * cov[-2, -1], tq)
    inter, inter_p = _additivity(X, lw, ld, y, v, Z, level)
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
        diff,
        inter,
        inter_p,
        len(keys),
    )


def fit_studies(
    studies: Mapping[str, Sequence],
    budget_study: str | None = None,
    replicate_of: Mapping[str, str] | None = None,
):
    """The two-factor fit over several studies' member summaries ({label: summaries}): each
    member's log B_x(1+eps) and variance as the verdict's slope takes them (a bound at its
    bound; members without an estimate left out). `replicate_of` ({study: the study it
    repeats}) makes a member of a replicate share its random effect with the same member of the
    study it repeats (the budget study's replicate also counts as the budget family)."""
    reps = dict(replicate_of or {})
    lw, ld, y, v, lab, mem = [], [], [], [], [], []
    for name, summaries in studies.items():
        use, _ = dec.member_entries(list(summaries), "model_free")
        root = reps.get(name, name)
        for s, yi, vi, _c in use:
            if not (s.info.width and s.info.depth):
                continue
            lw.append(math.log(s.info.width)), ld.append(math.log(s.info.depth))
            y.append(yi), v.append(vi), lab.append(name), mem.append((root, s.info.name))
    return fit(lw, ld, y, v, lab, budget_study, member=mem)
