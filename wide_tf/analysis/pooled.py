"""Owns the reading of a study together with its replicates (the same design run again on other
seeds): each member's log B_x(1+eps) pooled across the studies by inverse variance, then the
verdict's own rule on the pooled members (`wide_tf.analysis.decision`): the random-effects slope,
its leave-one-out slopes, the slope without the member of the highest leverage at
`decision.HEAVIEST_LEVEL`, the B_crit slope's sign (pooled the same way), any censored member
that could pull the slope back, and any learning-rate cell left at its grid's edge in any study.

Why pool members rather than verdicts: two studies of 5 seeds each are one study of 10 seeds per
cell with two learning-rate choices, and a member's estimates from independent seeds combine by
inverse variance; a vote of verdicts would throw away the half of the evidence that fell short of
a decisive line. The replicates share nature (the members' true curves), not noise, which is how
`wide_tf.analysis.simulate` draws them (`calibrate(..., replicates=2)`) to measure this reading's
false rate and power.

Pure NumPy on member summaries; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis import decision as dec
from wide_tf.analysis.members import MemberSummary
from wide_tf.analysis.stats import meta


@dataclasses.dataclass(frozen=True)
class Pooled:
    outcome: str  # decision.SUPPORTED | CONTRADICTED | NO_EFFECT | INCONCLUSIVE
    slope: meta.MetaSlope | None  # pooled log B_x(1+eps) on the log axis
    b_crit_slope: meta.MetaSlope | None
    heaviest: str | None  # the member of the highest leverage
    without_heaviest: meta.MetaSlope | None  # at decision.HEAVIEST_LEVEL
    reasons: tuple
    members: tuple  # member names pooled, in axis order
    n_studies: int
    axis: str = dec.WIDTH


def pool(studies: Sequence[Sequence[MemberSummary]], which: str):
    """{member name: (summary of the first study, log value, variance, censored)} over the members
    every study estimated: y = sum(y_i / v_i) / sum(1 / v_i), v = 1 / sum(1 / v_i); a member that
    is a bound in any study stays a bound (`decision.member_entries` per study)."""
    per = [{u[0].info.name: u for u in dec.member_entries(list(ms), which)[0]} for ms in studies]
    out = {}
    for name in per[0]:
        got = [p[name] for p in per if name in p]
        if len(got) < len(per):
            continue
        w = np.array([1.0 / max(u[2], meta.MIN_VARIANCE) for u in got])
        y = float(np.sum(w * np.array([u[1] for u in got])) / np.sum(w))
        out[name] = (got[0][0], y, float(1.0 / np.sum(w)), any(u[3] for u in got))
    return out


def _slope(entries, axis: str, level: float = 0.95):
    use = list(entries.values())
    if len(use) - sum(u[3] for u in use) < 3:
        return None
    x = np.log([dec.axis_value(u[0], axis) for u in use])
    return meta.random_effects_slope(x, [u[1] for u in use], [u[2] for u in use], level=level)


def _without(entries, mf: meta.MetaSlope, axis: str):
    names = list(entries)
    heavy = names[int(np.argmax(mf.leverage))]
    rest = {k: v for k, v in entries.items() if k != heavy}
    x = [dec.axis_value(u[0], axis) for u in rest.values()]
    if len(rest) < 3 or len(set(x)) < 2:
        return heavy, None
    return heavy, _slope(rest, axis, dec.HEAVIEST_LEVEL)


def _overturning(entries, mf: meta.MetaSlope, axis: str) -> list[str]:
    """Censored members whose true (higher) value would pull the pooled slope towards 0."""
    if mf.decision == 0:
        return []
    use = list(entries.values())
    x = np.log([dec.axis_value(u[0], axis) for u in use])
    w = 1.0 / (np.maximum([u[2] for u in use], meta.MIN_VARIANCE) + mf.tau2)
    pull = np.sign(x - np.sum(w * x) / np.sum(w))
    return [u[0].info.name for u, sg in zip(use, pull) if u[3] and sg != mf.decision]


def decide(studies: Sequence[Sequence[MemberSummary]], equivalence=None) -> Pooled:
    """The pooled reading of a study and its replicates (module docstring); `equivalence`
    as `decision.decide`'s."""
    first = list(studies[0]) if studies else []
    axis = dec.axis_of(first)
    order = [s.info.name for s in dec.order_members(first, axis)]
    mf_all = pool(studies, "model_free")
    mf_entries = {k: mf_all[k] for k in order if k in mf_all}
    bc_all = pool(studies, "b_crit")
    bc_entries = {k: bc_all[k] for k in order if k in bc_all}
    common = dict(members=tuple(mf_entries), n_studies=len(studies), axis=axis)
    mf = _slope(mf_entries, axis)
    if mf is None:
        reason = "fewer than 3 members have a model-free critical batch in every study"
        return Pooled(dec.INCONCLUSIVE, None, None, None, None, (reason,), **common)
    bc = _slope(bc_entries, axis)
    heavy, rest = _without(mf_entries, mf, axis)
    edges = [
        f"{s.info.name} (B = {', '.join(str(c.batch_size) for c in s.edge_cells)})"
        for ms in studies
        for s in ms
        if s.edge_cells
    ]
    outcome, reasons = dec._slope_outcome(
        mf,
        tuple(mf_entries),
        bc,
        edges,
        _overturning(mf_entries, mf, axis),
        (heavy, rest),
        equivalence,
        axis,
    )
    return Pooled(outcome, mf, bc, heavy, rest, tuple(reasons), **common)


def sentence(p: Pooled, names: Sequence[str]) -> str:
    """One line for a suite's report."""
    head = f"{' + '.join(names)} ({p.n_studies} studies, {len(p.members)} members pooled)"
    if p.slope is None:
        return f"{head}: {p.outcome.upper()}: {'; '.join(p.reasons)}."
    sl = p.slope
    out = (
        f"{head}: **{p.outcome.upper()}**, slope on log {p.axis} {sl.value:+.2f} "
        f"(95% CI {sl.low:+.2f} to {sl.high:+.2f}, {sl.df} df)"
    )
    out += "; " + dec.heaviest_check(p.heaviest, p.without_heaviest, sl.decision)
    if p.b_crit_slope is not None:
        out += f"; B_crit slope {p.b_crit_slope.value:+.2f}"
    return out + (f". Why: {'; '.join(p.reasons)}." if p.reasons else ".")
