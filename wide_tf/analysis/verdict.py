"""Owns the verdict paragraph on the paper's claim: `describe` (the numbers of a decision by
`wide_tf.analysis.decision`, its power and sensitivity lines from `wide_tf.analysis.robustness`)
and `analyze`, which runs records -> cells (`wide_tf.analysis.cells`) -> member curves
(`wide_tf.analysis.members`) -> the verdict at every target the runs recorded.

The rule itself (the random-effects slope of log B_x(1+eps) on log width, or on log depth in a
depth family; the leave-one-out, B_crit and censoring checks) is `wide_tf.analysis.decision`'s;
its error rates on simulated studies are in the README and docs/power_table.txt
(`python -m wide_tf.analysis.simulate`).

Pure NumPy/SciPy on plain dicts (the result.json schema); no TensorFlow and no file I/O, so every
number the report prints is unit-tested on hand-made tables and calibrated on simulated studies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis import robustness
from wide_tf.analysis.cells import records_for_target, target_labels
from wide_tf.analysis.decision import (  # noqa: F401 (re-exported: the verdict's vocabulary)
    CONTRADICTED,
    DEPTH,
    EDGE_REASON,
    INCONCLUSIVE,
    NO_EFFECT,
    SUPPORTED,
    WIDTH,
    Decision,
    axis_value,
    decide,
)
from wide_tf.analysis.members import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_EPS,
    MemberSummary,
    fmt_interval,
    summarize_members,
)
from wide_tf.analysis.stats import meta

# ----------------------------------------------------------------------------------------------
# The verdict: describing
# ----------------------------------------------------------------------------------------------


def _fmt_slope(sl: meta.MetaSlope) -> str:
    return f"{sl.value:+.2f} (95% CI {sl.low:+.2f} to {sl.high:+.2f}, {sl.df} df)"


def _theory_sentence(ms: Sequence[MemberSummary]) -> str | None:
    """The batch bound at initialisation (the paper's theory measure) beside the measured
    critical batch: its ratio and whether both move the same way across width."""
    pts = [
        (s.info.width, s.batch_bound_init, s.curve.b_crit.value)
        for s in ms
        if s.batch_bound_init and s.curve and s.curve.b_crit and s.info.width
    ]
    if len(pts) < 2:
        return None
    w, bb, bcv = (np.array(v, dtype=float) for v in zip(*pts))
    x = np.log(w) - np.log(w).mean()
    sl_bb = float(np.sum(x * np.log(bb)) / np.sum(x**2))
    sl_bc = float(np.sum(x * np.log(bcv)) / np.sum(x**2))
    ratio = bcv / bb
    same = np.sign(sl_bb) == np.sign(sl_bc)
    return (
        f"The batch bound at initialisation (the theory's measure) is {ratio.min():.1f}x to "
        f"{ratio.max():.1f}x below B_crit and {'rises' if sl_bb > 0 else 'falls'} with width "
        f"(log-log slope {sl_bb:+.2f}, no interval: a description) while B_crit "
        f"{'rises' if sl_bc > 0 else 'falls'} ({sl_bc:+.2f}): "
        + (
            "the same direction."
            if same
            else "opposite directions, so the bound at "
            "initialisation does not predict the trend here."
        )
    )


_MEANING = {
    WIDTH: {
        SUPPORTED: "Wider members tolerate larger batches, as the paper claims.",
        CONTRADICTED: "Wider members tolerate smaller batches, against the paper's claim.",
        NO_EFFECT: "The interval holds 0: this study cannot tell wider from deeper members.",
    },
    DEPTH: {
        SUPPORTED: "At one width, deeper members tolerate larger batches (depth alone).",
        CONTRADICTED: "At one width, deeper members tolerate smaller batches (depth alone).",
        NO_EFFECT: "The interval holds 0: at one width, depth alone has no detectable effect.",
    },
}


def _slope_sentences(d: Decision, eps: float) -> list[str]:
    sl, axis = d.model_free_slope, d.axis
    vals = [axis_value(s, axis) for s in d.members]
    vals = [v for v in vals if v]
    span = max(vals) / min(vals) if vals else float("nan")
    sentence = (
        f"Across {sl.n_members} members whose {axis}s span {span:.1f}x, log B_x{1 + eps:g} (the "
        f"model-free critical batch) changes with log {axis} at slope {_fmt_slope(sl)}, a "
        f"random-effects interval (members scatter about the line by tau = "
        f"{math.sqrt(sl.tau2):.2f} in log units)"
    )
    if d.b_crit_slope is not None:
        sentence += (
            f"; log B_crit (the fitted knee, over the {d.b_crit_slope.n_members} members whose "
            f"B_crit lies inside the batches tried: {', '.join(d.b_crit_members)}) at "
            f"{_fmt_slope(d.b_crit_slope)}"
        )
    parts = [sentence + "."]
    loo = [v for v in sl.loo if v is not None]
    if loo:
        parts.append(
            f"Leaving one member out gives slopes from {min(loo):+.2f} to {max(loo):+.2f}; "
            f"the most influential member carries {sl.max_leverage:.0%} of the weight."
        )
    meaning = _MEANING[axis].get(d.outcome)
    if meaning:
        parts.append(meaning)
    return parts


def _member_list(d: Decision, eps: float) -> str:
    order = "shallowest to deepest" if d.axis == DEPTH else "narrowest to widest"
    return (
        f"Members from {order}: "
        + "; ".join(
            f"{s.info.name} (width {s.info.width:g}"
            + (f", depth {s.info.depth}" if s.info.depth else "")
            + f"): B_x{1 + eps:g} {fmt_interval(s.b_model_free)}, B_crit "
            f"{fmt_interval(s.curve.b_crit if s.curve else None)}"
            + ("" if s.lof_p is None else f", lack-of-fit p = {s.lof_p:.3f}")
            for s in d.members
        )
        + "."
    )


def describe(d: Decision, eps: float, sens: robustness.Sensitivity | None = None) -> str:
    """The verdict paragraph: outcome, slopes, power and sensitivity, members, reasons."""
    ms = d.members
    head = f"Verdict: {d.outcome.upper()}."
    if not ms:
        return head + " No trial has finished yet, so there is nothing to compare."
    parts = [head]
    if d.model_free_slope is not None:
        parts += _slope_sentences(d, eps)
        if sens is not None:
            parts += sens.sentences(d.axis)
    parts.append(_member_list(d, eps))
    theory = _theory_sentence(ms) if d.axis != DEPTH else None
    if theory:
        parts.append(theory)
    if d.reasons:
        parts.append("Inconclusive because: " + "; ".join(d.reasons) + ".")
    if d.caveats:
        parts.append("Caveats: " + "; ".join(d.caveats) + ".")
    return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str
    decision: Decision
    text: str  # one paragraph with the numbers
    sensitivity: robustness.Sensitivity | None = None

    @property
    def reasons(self) -> tuple:
        return self.decision.reasons

    @property
    def caveats(self) -> tuple:
        return self.decision.caveats


def verdict(summaries: Sequence[MemberSummary], eps: float = DEFAULT_EPS, records=None) -> Verdict:
    """The decision and its paragraph. The power line is always simulated; with the study's
    `records` the paragraph also gets the sensitivity lines (overhead, highest leverage)."""
    d = decide(summaries)
    sens = robustness.sensitivity(records, d, eps)
    return Verdict(d.outcome, d, describe(d, eps, sens), sens)


def analyze(
    records: Sequence[dict], eps: float = DEFAULT_EPS, n_boot: int = DEFAULT_BOOTSTRAP
) -> dict:
    """Summaries and one verdict per architecture (a study normally has one) for the study's
    target, with its sensitivity lines, and the verdicts at every further target the runs
    recorded (`per_target`: label -> {arch: Verdict}; power lines only)."""
    summaries = summarize_members(records, eps, n_boot)
    archs = sorted({s.info.arch for s in summaries})
    verdicts = {
        a: verdict(
            [s for s in summaries if s.info.arch == a],
            eps,
            [r for r in records if str(r.get("arch", "")) == a],
        )
        for a in archs
    }
    if not archs:
        verdicts = {"": verdict([], eps)}
    per_target = {}
    for k, label in enumerate(target_labels(records)):
        if k == 0:
            per_target[label] = verdicts
            continue
        sub = summarize_members(records_for_target(records, k), eps, n_boot)
        per_target[label] = {
            a: verdict([s for s in sub if s.info.arch == a], eps)
            for a in sorted({s.info.arch for s in sub})
        }
    return {"summaries": summaries, "verdicts": verdicts, "eps": eps, "per_target": per_target}
