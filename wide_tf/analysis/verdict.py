"""Owns the analysis of a study's trial records: cells (best learning rate and seeds per member and
batch), each member's curve estimate with intervals, and the verdict on the paper's claim.

Pure NumPy/SciPy on plain dicts (the result.json schema); no TensorFlow and no file I/O beyond
parsing text, so every number the report prints is unit-tested on hand-made tables and calibrated
on simulated studies (`wide_tf.analysis.simulate`). The rules, which the report repeats:

* A **cell** is one (member, batch size). Its best learning rate is chosen on the tuning seeds
  by `wide_tf.study.lr_grid` (fewest median steps among rates where every tuning seed reached; ties
  to the smaller rate). The chosen rate's runs on every seed (tuning and confirmation) are the
  cell's observations: a finished run gives its steps-to-target; a run that ran out of budget, or
  **diverged**, is **censored** (S > the steps it was given: a seed on which the chosen rate fails
  is evidence that the batch is hard, not a missing value). A cell where no rate reached the
  target is censored at its budget. The cell's value is the median over its seeds (censored seeds
  count as larger than every finished one), with the range kept.
* Each member's **curve** (`wide_tf.analysis.critical_batch`): the model-free critical batch
B_x(1+eps) (the
  first batch whose epochs-to-target exceed perfect scaling from the two smallest batches by eps;
  Zhang et al. 2024's definition at eps = 0.2), the censored fit of S(B) = S_min (1 + B_crit / B),
  a lack-of-fit F test of that fit, and hierarchical intervals for both.
* The **verdict** (`decide`) compares members by a **random-effects meta-regression** of log
  B_x(1+eps) on log width (`wide_tf.analysis.stats.meta`: each member's own variance plus the
  members' scatter about the line, a t interval on m - 2 df). It is *supported* / *contradicted*
  only when that interval excludes 0, every leave-one-member-out slope has the same sign, the B_crit
  slope (over the members whose curve passes the lack-of-fit test) has the same sign, and no member
  has a learning-rate cell left at its grid's edge; *no detectable effect* when the interval holds
  0;
  *inconclusive* otherwise, with the reason (which member it rests on, which cells are unresolved).
  Its error rates on simulated studies, including studies whose curves differ from the fitted
  model, are in the README (`python -m wide_tf.analysis.simulate`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence

import numpy as np

from wide_tf.analysis import critical_batch as cb
from wide_tf.analysis.stats import meta
from wide_tf.spec import plan as plan_lib
from wide_tf.spec.targets import comparison
from wide_tf.study import lr_grid

STATUSES = ("reached", "not_reached", "diverged")
# Numeric status code for TensorBoard HParams (which only takes numbers as metrics).
STATUS_CODE = {"reached": 1.0, "not_reached": 0.0, "diverged": -1.0}
# B_x(1+eps) at eps = 1: the batch at which epochs-to-target have doubled over perfect scaling,
# which is McCandlish et al.'s definition of B_crit read off the data without a curve. Zhang et al.
# (2024) use eps = 0.2 (sweep.eps): it sits where epochs are still nearly flat in B, so the same
# noise in log epochs moves its crossing about 3x further (log-log slope ~0.17 there against ~0.5
# at the doubling), and on an S_min (1 + B_crit / B) curve it is about B_crit / 5.
DEFAULT_EPS = 1.0
# Replicates per member: the 2.5% and 97.5% quantiles of 200 replicates rest on their 5th
# values, which costs about 1.5 points of coverage (tests/test_stats.py).
DEFAULT_BOOTSTRAP = 1000

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
NO_EFFECT = "no detectable effect"
INCONCLUSIVE = "inconclusive"
# The grid is extended (up to sweep.max_lr_extensions) for the study's target; at a further target
# the best of the same runs can sit at an edge that was never extended.
EDGE_REASON = "the best learning rate is at the edge of the rates tried in "
# A member whose lack-of-fit test rejects the curve at this level gets no B_crit in the slope.
LOF_ALPHA = 0.05


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
    # The budgets of seeds that ran out of them or diverged (S > each).
    censored_budgets: tuple
    n_diverged_censored: int  # seeds at the chosen rate that diverged (censored at their budget)
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


def budget_steps(rec: dict) -> float | None:
    """The steps a run was given: recorded by simulated runs (`budget_steps`), else recomputed from
    its protocol by the trainer's rule (`wide_tf.spec.plan.budget_steps`), else the
    steps it ran."""
    if rec.get("budget_steps"):
        return float(rec["budget_steps"])
    p = rec.get("protocol") or {}
    n, b = rec.get("num_train"), rec.get("batch_size")
    if p.get("max_steps"):
        return float(p["max_steps"])
    if p.get("max_epochs") and n and b:
        return float(
            plan_lib.budget_steps(
                max_steps=0,
                max_epochs=p["max_epochs"],
                min_steps=p.get("min_steps") or 0,
                num_train=n,
                batch=b,
            )
        )
    steps = rec.get("steps")
    return float(steps) if steps else None


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
    # A seed that diverged at the chosen rate failed to reach the target within its budget.
    div_budgets = tuple(
        b for b in (budget_steps(r) for r in mine if r.get("status") == "diverged") if b
    )
    budgets += div_budgets
    n_div = len(div_budgets)
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
        n_diverged_censored=n_div,
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
    def n_diverged_censored(self) -> int:
        return sum(c.n_diverged_censored for c in self.cells)

    @property
    def lof_p(self) -> float | None:
        """The lack-of-fit test's p-value of the B_crit curve (None: not enough cells)."""
        return None if self.curve is None else self.curve.lof_p

    @property
    def fails_lof(self) -> bool:
        return self.lof_p is not None and self.lof_p < LOF_ALPHA

    @property
    def b_model_free(self) -> cb.Interval | None:
        """B_x(1+eps), the model-free critical batch (the study's primary measure)."""
        return None if self.curve is None else self.curve.max_batch


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
    primary_slope: meta.MetaSlope | None  # log B_x(1+eps) on log width: decides
    b_crit_slope: meta.MetaSlope | None  # log B_crit on log width: must agree in sign
    reasons: tuple  # why inconclusive (empty otherwise)
    caveats: tuple  # notes that do not decide the outcome
    members: tuple  # MemberSummaries used, narrowest first
    primary_members: tuple = ()  # names of the members in the primary slope
    b_crit_members: tuple = ()  # names of the members in the B_crit slope

    @property
    def max_batch_slope(self) -> meta.MetaSlope | None:  # the report's older name
        return self.primary_slope


def _meta_slope(ms: Sequence[MemberSummary], which: str):
    """(slope, members used, members left out with why) of log B_x(1+eps) or log B_crit on log
    width. A member whose value is a bound beyond the batches tried is left out: placed at the
    edge of the range it could move the slope either way."""
    use, out = [], []
    for s in ms:
        cv = s.curve
        iv = None if cv is None else (cv.max_batch if which == "primary" else cv.b_crit)
        reps = (
            None
            if cv is None
            else (cv.log_max_batch_reps if which == "primary" else cv.log_b_crit_reps)
        )
        if iv is None or reps is None or reps.size < 2:
            out.append((s.info.name, "no estimate"))
        elif iv.is_bound or (which == "primary" and cv.max_batch_status == 1):
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


def decide(summaries: Sequence[MemberSummary]) -> Decision:
    """The outcome from the random-effects slopes across members (see the module docstring)."""
    by_name = {s.info.name: s for s in summaries}
    ms = tuple(by_name[m.name] for m in order_by_width(s.info for s in summaries))
    reasons, caveats = [], []
    if not ms:
        return Decision(INCONCLUSIVE, None, None, ("no finished trials",), (), ())
    widths = [s.info.width for s in ms]
    if len(ms) < 3:
        reasons.append(
            f"{len(ms)} member(s): a slope with the members' own scatter needs at least 3"
        )
    elif any(w is None or not w > 0 for w in widths) or len(set(widths)) < 2:
        reasons.append("the members do not differ in width")
    if reasons:
        return Decision(INCONCLUSIVE, None, None, tuple(reasons), (), ms)
    prim, prim_names, prim_out = _meta_slope(ms, "primary")
    bc, bc_names, bc_out = _meta_slope(ms, "b_crit")
    if prim_out:
        caveats.append("not in the model-free slope: " + _fmt_left_out(prim_out))
    if bc_out:
        caveats.append("not in the B_crit slope: " + _fmt_left_out(bc_out))
    edges = [
        f"{s.info.name} (B = {', '.join(str(c.batch_size) for c in s.edge_cells)})"
        for s in ms
        if s.edge_cells
    ]
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
    if prim is None:
        reasons.append(
            f"only {len(prim_names)} member(s) have a model-free critical batch inside the "
            "batches tried (3 needed): extend the batch range"
        )
        return Decision(
            INCONCLUSIVE, None, bc, tuple(reasons), tuple(caveats), ms, prim_names, bc_names
        )
    if prim.max_leverage > 0.6:
        heavy = prim_names[int(np.argmax(prim.leverage))]
        caveats.append(f"{heavy} carries {prim.max_leverage:.0%} of the slope's weight")
    if prim.decision == 0:
        outcome = NO_EFFECT
        if edges:
            reasons.append(EDGE_REASON + "; ".join(edges))
    else:
        if edges:
            reasons.append(EDGE_REASON + "; ".join(edges) + ": those cells' steps are upper bounds")
        if not prim.loo_agree:
            flips = [
                f"without {n}: {v:+.2f}"
                for n, v in zip(prim_names, prim.loo)
                if v is not None and np.sign(v) != np.sign(prim.value)
            ]
            reasons.append(
                "the slope rests on single members (leave-one-out slopes " + ", ".join(flips) + ")"
            )
        if bc is None:
            reasons.append(
                f"only {len(bc_names)} member(s) have a B_crit that passes the lack-of-fit test "
                "inside the batches tried: the two measures cannot be compared"
            )
        elif np.sign(bc.value) != np.sign(prim.value):
            reasons.append(
                f"the B_crit slope ({bc.value:+.2f}) points the other way from the model-free slope"
            )
        outcome = {1: SUPPORTED, -1: CONTRADICTED}[prim.decision]
    if reasons:
        outcome = INCONCLUSIVE
    return Decision(outcome, prim, bc, tuple(reasons), tuple(caveats), ms, prim_names, bc_names)


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
    sl = d.primary_slope
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


def target_labels(records: Sequence[dict]) -> list[str]:
    """The targets the runs recorded ("train_accuracy >= 0.95", ...), the primary one first
    (runs written before several targets existed recorded one)."""
    for r in records:
        ts = r.get("targets")
        if ts:
            return [target_label(t) for t in ts]
    return []


def target_label(t: dict) -> str:
    return f"{t.get('metric')} {comparison(str(t.get('metric')))} {t.get('value'):g}"


def records_for_target(records: Sequence[dict], k: int) -> list[dict]:
    """The records as if target k had been the study's target: the same runs, with that target's
    status and steps in the fields the analysis reads. Learning rates are chosen again for it on
    the tuning runs; runs without that target are left out."""
    out = []
    for r in records:
        ts = r.get("targets") or []
        if k >= len(ts):
            continue
        t = ts[k]
        rr = dict(r)
        rr["status"] = t.get("status")
        rr["steps_to_target"] = t.get("steps_to_target")
        rr["steps_to_target_interp"] = t.get("steps_to_target_interp")
        rr["epochs_to_target"] = t.get("epochs_to_target")
        rr["target"] = {"metric": t.get("metric"), "value": t.get("value")}
        out.append(rr)
    return out


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
