"""Owns the verdict on the paper's claim: `headline` (one sentence: outcome, slope, meaning, the
main caveat) and `describe` (it, then a short list: the numbers of a decision by
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
    HEAVIEST_LEVEL,
    INCONCLUSIVE,
    NO_EFFECT,
    SUPPORTED,
    WIDTH,
    Decision,
    axis_value,
    decide,
    heaviest_check,
)
from wide_tf.analysis.members import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_EPS,
    MemberSummary,
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
        SUPPORTED: "so wider members tolerate larger batches, as the paper claims",
        CONTRADICTED: "so wider members tolerate smaller batches, against the paper's claim",
        NO_EFFECT: "so width does not change it within the frozen margin",
    },
    DEPTH: {
        SUPPORTED: "so at one width deeper members tolerate larger batches (depth alone)",
        CONTRADICTED: "so at one width deeper members tolerate smaller batches (depth alone)",
        NO_EFFECT: "so depth alone does not change it within the frozen margin",
    },
}
HEADLINE_WORDS = 60  # the first sentence is read in ten seconds: at most this many words


def _clip(text: str, words: int) -> str:
    w = text.split()
    tail = "... (below)"  # two words of the budget
    return text if len(w) <= words else " ".join(w[: words - 2]) + " " + tail


HEAVY_SHARE = 0.6  # a member with more of the slope's weight than this is named in the headline


def _main_caveat(d: Decision, sens: robustness.Sensitivity | None) -> str | None:
    """The one caveat the headline carries: why it is inconclusive; else the member carrying most
    of the weight, with the rule's check without it (never a 95% verdict without it); else the
    slope at 10 added steps per run when its interval holds 0 there; else the rule's first
    caveat; else, for no effect, the slope the design would have found."""
    sl = d.model_free_slope
    if d.outcome == INCONCLUSIVE and d.reasons:
        return "but the rule cannot decide: " + d.reasons[0]
    if sl is not None and d.heaviest and sl.max_leverage > HEAVY_SHARE and sl.decision:
        rest = d.without_heaviest
        tail = (
            ""
            if rest is None
            else f"; without it the other members give {rest.value:+.2f} "
            f"({HEAVIEST_LEVEL:.0%} CI {rest.low:+.2f} to {rest.high:+.2f})"
        )
        return f"but {d.heaviest} carries {sl.max_leverage:.0%} of the weight{tail}"
    k = robustness.PER_STEP_UPTO
    at_k = sens.curve.at(k) if sens is not None and sens.curve is not None else None
    if sl is not None and sl.decision and at_k is not None and at_k.decision == 0:
        return (
            f"but with {k} steps added to every run it is {at_k.value:+.2f} "
            f"({at_k.low:+.2f} to {at_k.high:+.2f})"
        )
    if d.caveats:
        return "caveat: " + d.caveats[0]
    if d.outcome == NO_EFFECT and sens is not None and sens.min_detectable is not None:
        return f"the design finds slopes of {sens.min_detectable:.2f} or more 80% of the time"
    return None


def headline(d: Decision, eps: float, sens: robustness.Sensitivity | None = None) -> str:
    """The verdict in one sentence: the outcome, the slope and its interval, what it means, the
    main caveat (at most HEADLINE_WORDS words)."""
    out = d.outcome.upper()
    if not d.members:
        return f"{out}: no trial has finished yet, so there is nothing to compare."
    sl = d.model_free_slope
    if sl is None:
        return _clip(f"{out}: " + ("; ".join(d.reasons) or "no slope could be fitted"), 50) + "."
    text = (
        f"{out}: B_x{1 + eps:g} {'rises' if sl.value > 0 else 'falls'} with {d.axis} at a log-log "
        f"slope of {sl.value:+.2f} (95% CI {sl.low:+.2f} to {sl.high:+.2f}) over "
        f"{sl.n_members} members"
    )
    meaning = _MEANING[d.axis].get(d.outcome)
    if meaning:
        text += ", " + meaning
    caveat = _main_caveat(d, sens)
    if caveat:
        text += "; " + caveat
    return _clip(text, HEADLINE_WORDS) + "."


def _rests_on(d: Decision) -> str | None:
    sl = d.model_free_slope
    loo = [v for v in sl.loo if v is not None]
    if not loo:
        return None
    return (
        f"The member it rests on: leaving one member out gives slopes from {min(loo):+.2f} to "
        f"{max(loo):+.2f}; the most influential member carries {sl.max_leverage:.0%} of the "
        f"weight; {heaviest_check(d.heaviest, d.without_heaviest, sl.decision)}."
    )


def _details(d: Decision, eps: float, sens: robustness.Sensitivity | None) -> list[str]:
    """The short list below the headline: power, sensitivity, the member it rests on, the
    interval's kind, B_crit, the theory's measure, the reasons and caveats (each member's numbers
    are in the members table, not here)."""
    sl, items = d.model_free_slope, []
    if sl is not None:
        if sens is not None:
            items += sens.sentences(d)
        items.append(_rests_on(d))
        items.append(
            f"The interval: {_fmt_slope(sl)}, a random-effects interval (members scatter about "
            f"the line by tau = {math.sqrt(sl.tau2):.2f} in log units) of log B_x{1 + eps:g}, the "
            f"model-free critical batch, on log {d.axis}."
        )
        if d.b_crit_slope is not None:
            items.append(
                f"B_crit: log B_crit (the fitted knee, over the {d.b_crit_slope.n_members} "
                f"members whose B_crit lies inside the batches tried) changes at "
                f"{_fmt_slope(d.b_crit_slope)}."
            )
    theory = _theory_sentence(d.members) if d.axis != DEPTH else None
    items.append(theory)
    if d.reasons:
        items.append("Inconclusive because: " + "; ".join(d.reasons) + ".")
    if d.caveats:
        items.append("Caveats: " + "; ".join(d.caveats) + ".")
    order = "shallowest to deepest" if d.axis == DEPTH else "narrowest to widest"
    items.append(f"Each member's B_x{1 + eps:g} and B_crit: the members table ({order}).")
    return [x for x in items if x]


def describe(d: Decision, eps: float, sens: robustness.Sensitivity | None = None) -> str:
    """The verdict as markdown: the headline sentence, then a short list (`_details`)."""
    head = headline(d, eps, sens)
    if not d.members:
        return head
    return head + "\n\n" + "\n".join(f"- {x}" for x in _details(d, eps, sens))


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str
    decision: Decision
    text: str  # markdown: the headline sentence, then a short list
    sensitivity: robustness.Sensitivity | None = None

    @property
    def headline(self) -> str:
        """The verdict in one sentence (the console's last line after a study)."""
        return self.text.split("\n", 1)[0]

    @property
    def reasons(self) -> tuple:
        return self.decision.reasons

    @property
    def caveats(self) -> tuple:
        return self.decision.caveats


def verdict(
    summaries: Sequence[MemberSummary], eps: float = DEFAULT_EPS, records=None, equivalence=None
) -> Verdict:
    """The decision and its paragraph. The power lines are always simulated; with the study's
    `records` the paragraph also gets the overhead curve; `equivalence`: the margin a frozen
    design stated (`wide_tf.analysis.equivalence`)."""
    d = decide(summaries, equivalence)
    sens = robustness.sensitivity(records, d, eps)
    return Verdict(d.outcome, d, describe(d, eps, sens), sens)


def analyze(
    records: Sequence[dict],
    eps: float = DEFAULT_EPS,
    n_boot: int = DEFAULT_BOOTSTRAP,
    equivalence=None,
) -> dict:
    """Summaries and one verdict per architecture (a study normally has one) for the study's
    target, with its sensitivity lines, and the verdicts at every further target the runs
    recorded (`per_target`: label -> {arch: Verdict}; power lines only). `equivalence` applies to
    the study's own (first) target, the one its design was simulated for."""
    summaries = summarize_members(records, eps, n_boot)
    archs = sorted({s.info.arch for s in summaries})
    verdicts = {
        a: verdict(
            [s for s in summaries if s.info.arch == a],
            eps,
            [r for r in records if str(r.get("arch", "")) == a],
            equivalence,
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
