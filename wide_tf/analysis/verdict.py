"""Owns the verdict on the paper's claim: `decide` (the outcome from the members' slopes) and
`describe` (the paragraph with the numbers), and `analyze`, which runs records -> cells
(`wide_tf.analysis.cells`) -> member curves (`wide_tf.analysis.members`) -> the verdict at every
target the runs recorded.

* The **verdict** (`decide`) compares members by a **random-effects meta-regression** of log
  B_x(1+eps) (the model-free critical batch) on log width (`wide_tf.analysis.stats.meta`: each
  member's own variance plus the members' scatter about the line, a t interval on m - 2 df). It
  is *supported* / *contradicted* only when that interval excludes 0, every leave-one-member-out
  slope has the same sign, the B_crit slope (over the members whose curve passes the lack-of-fit
  test) has the same sign, and no member has a learning-rate cell left at its grid's edge; *no
  detectable effect* when the interval holds 0; *inconclusive* otherwise, with the reason (which
  member it rests on, which cells are unresolved). Its error rates on simulated studies,
  including studies whose curves differ from the fitted model, are in the README
  (`python -m wide_tf.analysis.simulate`).

Pure NumPy/SciPy on plain dicts (the result.json schema); no TensorFlow and no file I/O, so every
number the report prints is unit-tested on hand-made tables and calibrated on simulated studies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis.cells import order_by_width, records_for_target, target_labels
from wide_tf.analysis.members import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_EPS,
    MemberSummary,
    fmt_interval,
    summarize_members,
)
from wide_tf.analysis.stats import meta

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
NO_EFFECT = "no detectable effect"
INCONCLUSIVE = "inconclusive"
# The grid is extended (up to sweep.max_lr_extensions) for the study's target; at a further target
# the best of the same runs can sit at an edge that was never extended.
EDGE_REASON = "the best learning rate is at the edge of the rates tried in "


# ----------------------------------------------------------------------------------------------
# The verdict: deciding
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    outcome: str  # SUPPORTED | CONTRADICTED | NO_EFFECT | INCONCLUSIVE
    model_free_slope: meta.MetaSlope | None  # log B_x(1+eps) on log width: decides
    b_crit_slope: meta.MetaSlope | None  # log B_crit on log width: must agree in sign
    reasons: tuple  # why inconclusive (empty otherwise)
    caveats: tuple  # notes that do not decide the outcome
    members: tuple  # MemberSummaries used, narrowest first
    model_free_members: tuple = ()  # names of the members in the model-free slope
    b_crit_members: tuple = ()  # names of the members in the B_crit slope


def _meta_slope(ms: Sequence[MemberSummary], which: str):
    """(slope, members used, members left out with why) of log B_x(1+eps) or log B_crit on log
    width. A member whose value is a bound beyond the batches tried is left out: placed at the
    edge of the range it could move the slope either way."""
    use, out = [], []
    for s in ms:
        cv = s.curve
        iv = None if cv is None else (cv.b_model_free if which == "model_free" else cv.b_crit)
        reps = (
            None
            if cv is None
            else (cv.log_b_model_free_reps if which == "model_free" else cv.log_b_crit_reps)
        )
        if iv is None or reps is None or reps.size < 2:
            out.append((s.info.name, "no estimate"))
        elif iv.is_bound or (which == "model_free" and cv.b_model_free_status == 1):
            out.append((s.info.name, "beyond the batches tried"))
        elif which == "b_crit" and s.fails_lof:
            out.append((s.info.name, f"fails the lack-of-fit test, p = {s.lof_p:.3f}"))
        else:
            use.append((s, math.log(iv.value), meta.variance_from_replicates(reps)))
    if len(use) < 3:
        return None, tuple(u[0].info.name for u in use), tuple(out)
    x = np.log([float(u[0].info.width) for u in use])
    sl = meta.random_effects_slope(x, [u[1] for u in use], [u[2] for u in use])
    return sl, tuple(u[0].info.name for u in use), tuple(out)


def _fmt_left_out(out) -> str:
    return ", ".join(f"{name} ({why})" for name, why in out)


def _design_reasons(ms: Sequence[MemberSummary]) -> list[str]:
    """Why no slope across these members can be read at all (empty when one can)."""
    widths = [s.info.width for s in ms]
    if len(ms) < 3:
        return [f"{len(ms)} member(s): a slope with the members' own scatter needs at least 3"]
    if any(w is None or not w > 0 for w in widths) or len(set(widths)) < 2:
        return ["the members do not differ in width"]
    return []


def _member_caveats(ms: Sequence[MemberSummary], mf_out, bc_out) -> list[str]:
    """Notes on the members that do not decide the outcome: who is left out of which slope,
    diverged seeds, and parameter counts that differ."""
    caveats = []
    if mf_out:
        caveats.append("not in the model-free slope: " + _fmt_left_out(mf_out))
    if bc_out:
        caveats.append("not in the B_crit slope: " + _fmt_left_out(bc_out))
    n_div = sum(s.n_diverged_censored for s in ms)
    if n_div:
        caveats.append(
            f"{n_div} seed run(s) diverged at their cell's chosen learning rate (counted as "
            "not reaching the target within the budget)"
        )
    params = [s.info.params for s in ms if s.info.params]
    if len(params) >= 2 and max(params) > 1.10 * min(params):
        caveats.append(
            f"the members do not share a parameter budget ({min(params):,} to "
            f"{max(params):,} params)"
        )
    return caveats


def _slope_outcome(mf, mf_names, bc, bc_names, edges) -> tuple[str, list[str]]:
    """(outcome, reasons) from the model-free slope, checked against the learning-rate edges,
    the leave-one-out slopes and the B_crit slope."""
    reasons = []
    if mf.decision == 0:
        if edges:
            reasons.append(EDGE_REASON + "; ".join(edges))
        return (INCONCLUSIVE if reasons else NO_EFFECT), reasons
    if edges:
        reasons.append(EDGE_REASON + "; ".join(edges) + ": those cells' steps are upper bounds")
    if not mf.loo_agree:
        flips = [
            f"without {n}: {v:+.2f}"
            for n, v in zip(mf_names, mf.loo)
            if v is not None and np.sign(v) != np.sign(mf.value)
        ]
        reasons.append(
            "the slope rests on single members (leave-one-out slopes " + ", ".join(flips) + ")"
        )
    if bc is None:
        reasons.append(
            f"only {len(bc_names)} member(s) have a B_crit that passes the lack-of-fit test "
            "inside the batches tried: the two measures cannot be compared"
        )
    elif np.sign(bc.value) != np.sign(mf.value):
        reasons.append(
            f"the B_crit slope ({bc.value:+.2f}) points the other way from the model-free slope"
        )
    outcome = {1: SUPPORTED, -1: CONTRADICTED}[mf.decision]
    return (INCONCLUSIVE if reasons else outcome), reasons


def decide(summaries: Sequence[MemberSummary]) -> Decision:
    """The outcome from the random-effects slopes across members (see the module docstring)."""
    by_name = {s.info.name: s for s in summaries}
    ms = tuple(by_name[m.name] for m in order_by_width(s.info for s in summaries))
    if not ms:
        return Decision(INCONCLUSIVE, None, None, ("no finished trials",), (), ())
    reasons = _design_reasons(ms)
    if reasons:
        return Decision(INCONCLUSIVE, None, None, tuple(reasons), (), ms)
    mf, mf_names, mf_out = _meta_slope(ms, "model_free")
    bc, bc_names, bc_out = _meta_slope(ms, "b_crit")
    caveats = _member_caveats(ms, mf_out, bc_out)
    if mf is None:
        reasons.append(
            f"only {len(mf_names)} member(s) have a model-free critical batch inside the "
            "batches tried (3 needed): extend the batch range"
        )
        return Decision(
            INCONCLUSIVE, None, bc, tuple(reasons), tuple(caveats), ms, mf_names, bc_names
        )
    if mf.max_leverage > 0.6:
        heavy = mf_names[int(np.argmax(mf.leverage))]
        caveats.append(f"{heavy} carries {mf.max_leverage:.0%} of the slope's weight")
    edges = [
        f"{s.info.name} (B = {', '.join(str(c.batch_size) for c in s.edge_cells)})"
        for s in ms
        if s.edge_cells
    ]
    outcome, reasons = _slope_outcome(mf, mf_names, bc, bc_names, edges)
    return Decision(outcome, mf, bc, tuple(reasons), tuple(caveats), ms, mf_names, bc_names)


# ----------------------------------------------------------------------------------------------
# The verdict: describing
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str
    decision: Decision
    text: str  # one paragraph with the numbers

    @property
    def reasons(self) -> tuple:
        return self.decision.reasons

    @property
    def caveats(self) -> tuple:
        return self.decision.caveats


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


def describe(d: Decision, eps: float) -> str:
    ms = d.members
    head = f"Verdict: {d.outcome.upper()}."
    if not ms:
        return head + " No trial has finished yet, so there is nothing to compare."
    widths = [s.info.width for s in ms if s.info.width]
    parts = [head]
    sl = d.model_free_slope
    if sl is not None:
        span = max(widths) / min(widths) if widths and min(widths) > 0 else float("nan")
        sentence = (
            f"Across {sl.n_members} members whose widths span {span:.1f}x, log B_x{1 + eps:g} (the "
            f"model-free critical batch) changes with log width at slope {_fmt_slope(sl)}, a "
            f"random-effects interval (members scatter about the line by tau = "
            f"{math.sqrt(sl.tau2):.2f} in log units)"
        )
        if d.b_crit_slope is not None:
            sentence += f"; log B_crit (the fitted knee) at {_fmt_slope(d.b_crit_slope)}"
        sentence += "."
        parts.append(sentence)
        loo = [v for v in sl.loo if v is not None]
        if loo:
            parts.append(
                f"Leaving one member out gives slopes from {min(loo):+.2f} to {max(loo):+.2f}; "
                f"the most influential member carries {sl.max_leverage:.0%} of the weight."
            )
        meaning = {
            SUPPORTED: "Wider members tolerate larger batches, as the paper claims.",
            CONTRADICTED: "Wider members tolerate smaller batches, against the paper's claim.",
            NO_EFFECT: "The interval holds 0: this study cannot tell wider from deeper members.",
        }.get(d.outcome)
        if meaning:
            parts.append(meaning)
        parts.append(
            f"This design detects a slope of {sl.min_detectable:.2f} or more (either sign) "
            "80% of the time."
        )
    parts.append(
        "Members from narrowest to widest: "
        + "; ".join(
            f"{s.info.name} (width {s.info.width:g}): B_x{1 + eps:g} "
            f"{fmt_interval(s.b_model_free)}, B_crit "
            f"{fmt_interval(s.curve.b_crit if s.curve else None)}"
            + ("" if s.lof_p is None else f", lack-of-fit p = {s.lof_p:.3f}")
            for s in ms
        )
        + "."
    )
    theory = _theory_sentence(ms)
    if theory:
        parts.append(theory)
    if d.reasons:
        parts.append("Inconclusive because: " + "; ".join(d.reasons) + ".")
    if d.caveats:
        parts.append("Caveats: " + "; ".join(d.caveats) + ".")
    return " ".join(parts)


def verdict(summaries: Sequence[MemberSummary], eps: float = DEFAULT_EPS) -> Verdict:
    d = decide(summaries)
    return Verdict(d.outcome, d, describe(d, eps))


def analyze(
    records: Sequence[dict], eps: float = DEFAULT_EPS, n_boot: int = DEFAULT_BOOTSTRAP
) -> dict:
    """Summaries and one verdict per architecture (a study normally has one) for the study's
    target, and the verdicts at every further target the runs recorded (`per_target`: label ->
    {arch: Verdict})."""
    summaries = summarize_members(records, eps, n_boot)
    archs = sorted({s.info.arch for s in summaries})
    verdicts = {a: verdict([s for s in summaries if s.info.arch == a], eps) for a in archs}
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
