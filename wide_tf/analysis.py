"""Owns the analysis of a study's trial records: cells (best learning rate and seeds per member and
batch), each member's curve estimate with intervals, and the verdict on the paper's claim.

Pure NumPy on plain dicts (the result.json schema); no TensorFlow and no file I/O beyond parsing
text, so every number the report prints is unit-tested on hand-made tables and calibrated on
simulated studies (`wide_tf.simulate`). The rules, which the report repeats:

* A **cell** is one (member, batch size). Its best learning rate is chosen on the tuning seed(s)
  by `wide_tf.lr_grid` (fewest median steps among rates where every tuning seed reached; ties to
  the smaller rate). The chosen rate's runs on every seed (tuning and confirmation) are the cell's
  observations: a finished run gives its steps-to-target, a run that ran out of budget is
  **censored** (S > the steps it ran), a diverged run is excluded and counted. A cell where no
  rate reached the target is censored at its budget. The cell's value is the median over its
  seeds (censored seeds count as larger than every finished one), with the range kept.
* Each member's **curve** (`wide_tf.critical_batch`): the censored fit of
  S(B) = S_min (1 + B_crit / B) in log space, max_batch(eps) as the first crossing of
  (1 + eps) x E_ref, bootstrap intervals for both, and R^2 of log epochs as the fit quality.
* The **verdict** is decided by the slope of log B_crit against log width across the members,
  with a 95% bootstrap interval: *supported* above 0, *contradicted* below 0, *no detectable
  effect* otherwise (quoting the smallest slope the design detects 80% of the time). The slope of
  log max_batch(eps) is reported beside it. The rule's error rates on simulated studies with a
  known answer are in the README (`python -m wide_tf.simulate`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence

import numpy as np

from wide_tf import critical_batch as cb
from wide_tf import lr_grid
from wide_tf.lr_grid import lower_is_better  # noqa: F401  (re-exported: the report uses it)

STATUSES = ("reached", "not_reached", "diverged")
# Numeric status code for TensorBoard HParams (which only takes numbers as metrics).
STATUS_CODE = {"reached": 1.0, "not_reached": 0.0, "diverged": -1.0}
DEFAULT_EPS = 0.25
DEFAULT_BOOTSTRAP = 400

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
NO_EFFECT = "no detectable effect"
INCONCLUSIVE = "inconclusive"
# Below this R^2 of log epochs-to-target the knee shape does not describe a member's curve.
POOR_FIT_R2 = 0.5


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


def parse_results(text: str) -> tuple[list[dict], int]:
    """Parses JSON-lines text into records; returns (records, number of unparseable lines).

    The last record of a trial_id wins. Unparseable lines (a torn last line) are skipped and
    counted, not fatal."""
    records, bad = [], 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(rec, dict) or "member" not in rec or "batch_size" not in rec:
            bad += 1
            continue
        records.append(rec)
    return dedupe_records(records), bad


def dedupe_records(records: Iterable[dict]) -> list[dict]:
    """Keeps the last record per trial_id (records without a trial_id are all kept)."""
    out: dict = {}
    for i, rec in enumerate(records):
        out[rec.get("trial_id", ("no-id", i))] = rec
    return list(out.values())


@dataclasses.dataclass(frozen=True)
class MemberInfo:
    """One architecture of the study (a family member)."""

    name: str
    arch: str
    depth: int | None
    width: float | None
    params: int | None


def members_from_records(records: Sequence[dict]) -> list[MemberInfo]:
    """Distinct members, narrowest first (width ascending; at equal width, deepest first)."""
    seen: dict[str, MemberInfo] = {}
    for rec in records:
        name = rec["member"]
        if name not in seen:
            seen[name] = MemberInfo(
                name=name,
                arch=str(rec.get("arch", "")),
                depth=rec.get("depth"),
                width=rec.get("width"),
                params=rec.get("params"),
            )
    return order_by_width(seen.values())


def order_by_width(members: Iterable[MemberInfo]) -> list[MemberInfo]:
    """Narrowest first. In a fixed-budget family the widest member is the shallowest one, so depth
    (descending) breaks ties and orders members whose width is missing."""

    def key(m: MemberInfo):
        w = m.width if m.width is not None else -math.inf
        d = m.depth if m.depth is not None else 0
        return (w, -d, m.name)

    return sorted(members, key=key)


# ----------------------------------------------------------------------------------------------
# Cells
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (member, batch size): its learning-rate grid, the chosen rate and its seeds."""

    member: str
    batch_size: int
    num_train: int | None
    grid: tuple  # lr_grid.GridPoints of the tuning runs, ascending multiplier
    best_multiplier: float | None  # None: no rate reached the target on the tuning seeds
    learning_rate: float | None  # the peak learning rate of the chosen multiplier
    lr_at_grid_edge: bool  # the chosen rate is the smallest or largest tried
    seed_steps: tuple  # finished seeds' steps at the chosen rate, ascending
    censored_budgets: tuple  # the steps run by seeds that ran out of budget (S > each)
    n_diverged_excluded: int  # seeds at the chosen rate that diverged (excluded)
    median_steps: float | None  # None when the median seed is censored (or nothing ran)
    censored_bound: float | None  # the cell is censored: S > this
    n_trials: int
    n_reached: int
    n_not_reached: int
    n_diverged: int
    best_test_accuracy_any_lr: float | None

    @property
    def n_seeds(self) -> int:
        return len(self.seed_steps) + len(self.censored_budgets)

    @property
    def steps_range(self) -> tuple[float, float] | None:
        return (self.seed_steps[0], self.seed_steps[-1]) if self.seed_steps else None

    def epochs(self, steps: float | None) -> float | None:
        if steps is None or not self.num_train:
            return None
        return steps * self.batch_size / self.num_train

    @property
    def epochs_to_target(self) -> float | None:
        return self.epochs(self.median_steps)


def _finite(v) -> float | None:
    return float(v) if v is not None and isinstance(v, (int, float)) and math.isfinite(v) else None


def _lr_of(records: Sequence[dict], mult: float) -> float | None:
    for r in records:
        if (
            lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == mult
            and r.get("learning_rate") is not None
        ):
            return float(r["learning_rate"])
    return None


def make_cell(member: str, batch: int, records: Sequence[dict]) -> Cell:
    tuning = [r for r in records if lr_grid.role_of(r) == lr_grid.TUNE]
    points = lr_grid.grid_points(tuning)
    best = lr_grid.best_point(points)
    n_train = next((int(r["num_train"]) for r in records if r.get("num_train")), None)
    if best is not None:
        mine = [
            r for r in records if lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == best.multiplier
        ]
    else:  # censored cell: every tuning seed's longest non-diverged run says S > its budget
        mine = []
        for seed in sorted({int(r.get("seed", 0)) for r in tuning}):
            runs = [
                r
                for r in tuning
                if int(r.get("seed", 0)) == seed and r.get("status") == "not_reached"
            ]
            if runs:
                mine.append(max(runs, key=lambda r: r.get("steps") or 0))
    finished = sorted(lr_grid.run_steps(r) for r in mine if lr_grid.run_steps(r) is not None)
    budgets = tuple(
        float(r["steps"])
        for r in mine
        if r.get("status") == "not_reached" and (r.get("steps") or 0) > 0
    )
    n_div = sum(1 for r in mine if r.get("status") == "diverged")
    values = list(finished) + [math.inf] * len(budgets)
    median = bound = None
    if values:
        values.sort()
        k = len(values)
        med = values[k // 2] if k % 2 else 0.5 * (values[k // 2 - 1] + values[k // 2])
        if math.isfinite(med):
            median = float(med)
        else:
            bound = float(min(budgets))
    counts = {s: sum(1 for r in records if r.get("status") == s) for s in STATUSES}
    accs = [_finite(r.get("best_test_accuracy")) for r in records if r.get("status") != "diverged"]
    accs = [a for a in accs if a is not None]
    mults = [p.multiplier for p in points]
    return Cell(
        member=member,
        batch_size=int(batch),
        num_train=n_train,
        grid=tuple(points),
        best_multiplier=None if best is None else best.multiplier,
        learning_rate=None if best is None else _lr_of(records, best.multiplier),
        lr_at_grid_edge=best is not None and best.multiplier in (mults[0], mults[-1]),
        seed_steps=tuple(finished),
        censored_budgets=budgets,
        n_diverged_excluded=n_div,
        median_steps=median,
        censored_bound=bound,
        n_trials=len(records),
        n_reached=counts["reached"],
        n_not_reached=counts["not_reached"],
        n_diverged=counts["diverged"],
        best_test_accuracy_any_lr=max(accs) if accs else None,
    )


def cells_of(records: Sequence[dict]) -> list[Cell]:
    """Every (member, batch size) cell, sorted by member then batch size."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["member"], int(r["batch_size"])), []).append(r)
    return [make_cell(m, b, rs) for (m, b), rs in sorted(groups.items())]


def observations(cells: Sequence[Cell]) -> cb.Observations | None:
    """The seed-level observations of one member's cells (None when there are none)."""
    b, s, c = [], [], []
    for cell in cells:
        for v in cell.seed_steps:
            b.append(cell.batch_size), s.append(max(v, 1e-9)), c.append(False)
        for v in cell.censored_budgets:
            b.append(cell.batch_size), s.append(v), c.append(True)
    n_train = next((cell.num_train for cell in cells if cell.num_train), None)
    if not b or not n_train:
        return None
    return cb.Observations.make(b, s, c, n_train)


# ----------------------------------------------------------------------------------------------
# Members
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemberSummary:
    info: MemberInfo
    cells: tuple  # Cells by batch ascending
    curve: cb.CurveEstimate | None  # None: no finished run at all
    batch_bound_init: float | None  # mean over trials of the batch bound at initialisation
    batch_bound_init_std: float | None
    noise_scale_ema: float | None  # median over trials of the final two-batch noise scale

    @property
    def edge_cells(self) -> tuple:
        return tuple(c for c in self.cells if c.lr_at_grid_edge)

    @property
    def n_diverged_excluded(self) -> int:
        return sum(c.n_diverged_excluded for c in self.cells)

    @property
    def poor_fit(self) -> bool:
        f = self.curve.fit if self.curve else None
        return f is not None and f.r2_log_epochs is not None and f.r2_log_epochs < POOR_FIT_R2


def batch_bound_at_init(records: Sequence[dict]) -> list[float]:
    """The batch bound of each record's first gradient-history entry (step 0 = initialisation)."""
    out = []
    for rec in records:
        hist = ((rec.get("gradient") or {}).get("history")) or []
        hist = [h for h in hist if h.get("batch_bound") is not None]
        if hist:
            first = min(hist, key=lambda h: (h.get("step", 0), h.get("examples", 0)))
            if first.get("step", 0) == 0 and np.isfinite(first["batch_bound"]):
                out.append(float(first["batch_bound"]))
    return out


def summarize_members(
    records: Sequence[dict], eps: float = DEFAULT_EPS, n_boot: int = DEFAULT_BOOTSTRAP
) -> list[MemberSummary]:
    """Everything the report needs per member, narrowest member first."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    cells = cells_of(records)
    out = []
    for k, info in enumerate(members_from_records(records)):
        mine = tuple(c for c in cells if c.member == info.name)
        obs = observations(mine)
        curve = cb.estimate(obs, eps, n_boot=n_boot, seed=k) if obs is not None else None
        recs = [r for r in records if r["member"] == info.name]
        bb = batch_bound_at_init(recs)
        ns = [
            float(v)
            for v in ((r.get("gradient") or {}).get("noise_scale_ema") for r in recs)
            if v is not None and np.isfinite(v)
        ]
        out.append(
            MemberSummary(
                info=info,
                cells=mine,
                curve=curve,
                batch_bound_init=float(np.mean(bb)) if bb else None,
                batch_bound_init_std=float(np.std(bb)) if bb else None,
                noise_scale_ema=float(np.median(ns)) if ns else None,
            )
        )
    return out


# ----------------------------------------------------------------------------------------------
# Formatting of estimates (shared with the report)
# ----------------------------------------------------------------------------------------------


def fmt_num(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def fmt_interval(iv: cb.Interval | None) -> str:
    """'412 (95% CI 280-590)'; a value beyond the batches tried reads as a bound ('> 4,096')."""
    if iv is None:
        return "-"
    if iv.above_range:
        head = f"> {fmt_num(iv.range_hi)}"
    elif iv.below_range:
        head = f"< {fmt_num(iv.range_lo)}"
    else:
        head = fmt_num(iv.value)
    if iv.low is None or iv.high is None:
        return head
    lo = f"< {fmt_num(iv.range_lo)}" if iv.low_open else fmt_num(iv.low)
    hi = f"> {fmt_num(iv.range_hi)}" if iv.high_open else fmt_num(iv.high)
    return f"{head} (95% CI {lo} to {hi})"


# ----------------------------------------------------------------------------------------------
# The verdict: deciding
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    outcome: str  # SUPPORTED | CONTRADICTED | NO_EFFECT | INCONCLUSIVE
    b_crit_slope: cb.Slope | None
    max_batch_slope: cb.Slope | None
    reasons: tuple  # why inconclusive (empty otherwise)
    caveats: tuple  # notes that do not decide the outcome
    members: tuple  # MemberSummaries used, narrowest first


def _slope_of(ms: Sequence[MemberSummary], which: str) -> cb.Slope | None:
    if which == "b_crit":
        use = [s for s in ms if s.curve and s.curve.log_b_crit_reps is not None]
        points = [s.curve.log_b_crit_clipped for s in use]
        reps = [s.curve.log_b_crit_reps for s in use]
    else:
        use = [
            s
            for s in ms
            if s.curve
            and s.curve.log_max_batch_reps is not None
            and s.curve.log_max_batch_reps.size
        ]
        points = [s.curve.log_max_batch_clipped for s in use]
        reps = [s.curve.log_max_batch_reps for s in use]
    if len(use) < 2:
        return None
    return cb.slope(np.log([float(s.info.width) for s in use]), np.asarray(points), reps)


def decide(summaries: Sequence[MemberSummary]) -> Decision:
    """The outcome from the slope of log B_crit on log width (see the module docstring)."""
    by_name = {s.info.name: s for s in summaries}
    ms = tuple(by_name[m.name] for m in order_by_width(s.info for s in summaries))
    reasons, caveats = [], []
    if not ms:
        return Decision(INCONCLUSIVE, None, None, ("no finished trials",), (), ())
    widths = [s.info.width for s in ms]
    if len(ms) < 2:
        reasons.append("only one member: the claim compares members of different width")
    elif any(w is None or not w > 0 for w in widths) or len(set(widths)) < 2:
        reasons.append("the members do not differ in width")
    no_fit = [s for s in ms if not (s.curve and s.curve.fit)]
    for s in no_fit:
        why = s.curve.fit_reason if s.curve else "no run finished"
        reasons.append(f"{s.info.name} has no B_crit fit ({why})")
    fitted = [s for s in ms if s.curve and s.curve.fit]
    sl_b = _slope_of(fitted, "b_crit") if not reasons else None
    sl_m = _slope_of(ms, "max_batch") if len(set(widths)) >= 2 and None not in widths else None
    if fitted and not reasons:
        if all(s.curve.b_crit.above_range for s in fitted):
            reasons.append(
                "every member's B_crit lies above the largest batch tried (all still "
                "scale perfectly): extend the sweep to larger batches"
            )
        elif all(s.curve.b_crit.below_range for s in fitted):
            reasons.append(
                "every member's B_crit lies below the smallest batch tried: extend the "
                "sweep to smaller batches"
            )
    poor = [s for s in fitted if s.poor_fit]
    if poor:
        caveats.append(
            f"the knee S_min (1 + B_crit / B) describes these members poorly (R^2 of log "
            f"epochs < {POOR_FIT_R2:g}): "
            + ", ".join(f"{s.info.name} ({s.curve.fit.r2_log_epochs:.2f})" for s in poor)
        )
    bounds = [s.info.name for s in fitted if s.curve.b_crit.is_bound]
    if bounds and not reasons:
        caveats.append(
            "B_crit beyond the batches tried for "
            + ", ".join(bounds)
            + " (counted at the edge of the range, which can only shrink the slope)"
        )
    edges = [(s.info.name, c.batch_size) for s in ms for c in s.edge_cells]
    if edges:
        caveats.append(
            f"the best learning rate sat on the edge of its grid in {len(edges)} cell(s) "
            "after extension (their steps are upper bounds)"
        )
    n_div = sum(s.n_diverged_excluded for s in ms)
    if n_div:
        caveats.append(f"{n_div} diverged seed run(s) at chosen learning rates were excluded")
    params = [s.info.params for s in ms if s.info.params]
    if len(params) >= 2 and max(params) > 1.10 * min(params):
        caveats.append(
            f"the members do not share a parameter budget ({min(params):,} to "
            f"{max(params):,} params)"
        )
    outcome = INCONCLUSIVE
    if not reasons and sl_b is not None:
        outcome = {1: SUPPORTED, -1: CONTRADICTED, 0: NO_EFFECT}[sl_b.decision]
        if sl_m is not None and sl_m.decision and sl_m.decision != sl_b.decision:
            caveats.append("the max_batch slope points the other way")
    elif not reasons:
        reasons.append("fewer than two members have a B_crit estimate")
    return Decision(outcome, sl_b, sl_m, tuple(reasons), tuple(caveats), ms)


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


def _fmt_slope(sl: cb.Slope) -> str:
    return f"{sl.value:+.2f} (95% CI {sl.low:+.2f} to {sl.high:+.2f})"


def describe(d: Decision, eps: float) -> str:
    ms = d.members
    head = f"Verdict: {d.outcome.upper()}."
    if not ms:
        return head + " No trial has finished yet, so there is nothing to compare."
    widths = [s.info.width for s in ms if s.info.width]
    parts = [head]
    if d.b_crit_slope is not None:
        sl = d.b_crit_slope
        span = max(widths) / min(widths) if widths and min(widths) > 0 else float("nan")
        sentence = (
            f"Across {sl.n_members} members whose widths span {span:.1f}x at a fixed "
            f"parameter budget, log B_crit changes with log width at slope {_fmt_slope(sl)}"
        )
        if d.max_batch_slope is not None:
            sentence += f" and log max_batch(eps={eps:g}) at {_fmt_slope(d.max_batch_slope)}"
        sentence += "."
        parts.append(sentence)
        meaning = {
            SUPPORTED: "Wider members tolerate larger batches, as the paper claims.",
            CONTRADICTED: "Wider members tolerate smaller batches, against the paper's claim.",
            NO_EFFECT: "The interval holds 0: this study cannot tell wider from deeper members.",
        }.get(d.outcome)
        if meaning:
            parts.append(meaning)
        parts.append(
            f"This design detects a slope of {sl.min_detectable:.2f} or more (either "
            "sign) 80% of the time (2.8 bootstrap standard errors)."
        )
    parts.append(
        "Members from narrowest to widest: "
        + "; ".join(
            f"{s.info.name} (width {s.info.width:g}): B_crit "
            f"{fmt_interval(s.curve.b_crit if s.curve else None)}, max_batch "
            f"{fmt_interval(s.curve.max_batch if s.curve else None)}"
            for s in ms
        )
        + "."
    )
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
    """Summaries and one verdict per architecture (a study normally has one)."""
    summaries = summarize_members(records, eps, n_boot)
    archs = sorted({s.info.arch for s in summaries})
    verdicts = {a: verdict([s for s in summaries if s.info.arch == a], eps) for a in archs}
    if not archs:
        verdicts = {"": verdict([], eps)}
    return {"summaries": summaries, "verdicts": verdicts, "eps": eps}
