"""Analysis of a study's trial records: seed aggregation, best LR per batch, max_batch(eps), B_crit, verdict.

Pure NumPy on plain dicts (the results.jsonl schema); no TensorFlow, no file I/O beyond parsing text,
so every number the report prints can be unit-tested on hand-made tables.

Choices made here (the report repeats them):

* A *setting* is (member, batch_size, learning rate). Seeds of a setting are aggregated: the setting
  counts as **reached only if every seed reached** the target (one failing seed means the learning
  rate is not reliable at that batch size), and its steps-to-target is the **arithmetic mean over
  seeds** (the expected cost of one run). Epochs-to-target is mean steps * B / n_train.
* Best learning rate per (member, batch): among reached settings, the one with the fewest mean
  steps; ties go to the smaller learning rate (the more conservative choice). Diverged and
  not-reached runs are kept and counted, never dropped and never replaced by the budget.
* ``lr_at_grid_edge``: the best learning rate is the smallest or largest learning rate *tried*
  (including diverged ones) for that (member, batch); with a one-point grid it is always at the edge.
  Then the optimum may lie outside the grid and S(B) is only an upper bound.
* ``max_batch(eps)`` follows SCIENCE.md literally: the largest B whose best epochs-to-target is at
  most (1 + eps) x the best epochs-to-target at the member's smallest batch size; batch sizes below
  it that fail the test are reported as ``gaps``. When it equals the largest batch tried the true
  value may be larger (``at_ceiling``: a censored value).
* The critical batch size fit S(B) = S_min (1 + B_crit / B) is linear in x = 1/B:
  S = a + b x with a = S_min, b = S_min B_crit. It is solved by weighted linear least squares with
  weights 1/S_i^2, i.e. minimising *relative* residuals (S_fit - S)/S. That is the first-order
  equivalent of a fit in log space: points at small and large batch count alike, although S spans
  orders of magnitude (an unweighted fit would be decided by the smallest batches alone).
  Quality: R^2 of log S and the relative RMS residual.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Iterable, Sequence

import numpy as np

STATUSES = ("reached", "not_reached", "diverged")
# Numeric status code for TensorBoard HParams (which only takes numbers as metrics).
STATUS_CODE = {"reached": 1.0, "not_reached": 0.0, "diverged": -1.0}
DEFAULT_EPS = 0.25

SUPPORTED = "supported"
NOT_SUPPORTED = "not supported"
INCONCLUSIVE = "inconclusive"


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------

def parse_results(text: str) -> tuple[list[dict], int]:
    """Parses results.jsonl text into records; returns (records, number of unparseable lines).

    A trial re-run after an interruption may have appended its line twice: the last line of a
    trial_id wins. Unparseable lines (a torn last line) are skipped and counted, not fatal.
    """
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


def _lr_key(rec: dict) -> tuple:
    # The grid is indexed by lr_multiplier; learning_rate (the peak lr actually used) is the value.
    # Rounding to 6 significant digits makes float noise in the scaled lr not split a setting.
    mult = rec.get("lr_multiplier")
    lr = rec.get("learning_rate")
    return (None if mult is None else float(f"{float(mult):.6g}"),
            None if lr is None else float(f"{float(lr):.6g}"))


@dataclasses.dataclass(frozen=True)
class MemberInfo:
    """One architecture of the study (a family member)."""
    name: str
    arch: str
    depth: int | None
    width: float | None
    params: int | None


def members_from_records(records: Sequence[dict]) -> list[MemberInfo]:
    """Distinct members, ordered narrowest first (width ascending; at equal width, deepest first)."""
    seen: dict[str, MemberInfo] = {}
    for rec in records:
        name = rec["member"]
        if name not in seen:
            seen[name] = MemberInfo(name=name, arch=str(rec.get("arch", "")), depth=rec.get("depth"),
                                    width=rec.get("width"), params=rec.get("params"))
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
# Seed aggregation and best learning rate
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Setting:
    """One (member, batch_size, learning rate), aggregated over its seeds."""
    member: str
    batch_size: int
    lr_multiplier: float | None
    learning_rate: float | None
    n_seeds: int
    n_reached: int
    n_not_reached: int
    n_diverged: int
    reached: bool                     # every seed reached the target
    steps_to_target: float | None     # mean over seeds, only when reached
    steps_std: float | None           # std over seeds (ddof=0), only when reached
    epochs_to_target: float | None    # steps_to_target * B / n_train
    best_test_accuracy: float | None  # mean over seeds of each run's best test accuracy
    final_train_accuracy: float | None
    final_test_accuracy: float | None
    num_train: int | None
    trial_ids: tuple = ()


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def aggregate_settings(records: Sequence[dict]) -> list[Setting]:
    """Aggregates records over seeds per (member, batch_size, lr). Sorted by member, batch, lr."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["member"], int(rec["batch_size"])) + _lr_key(rec), []).append(rec)
    out = []
    for (member, batch, mult, lr), recs in groups.items():
        counts = {s: sum(1 for r in recs if r.get("status") == s) for s in STATUSES}
        reached = counts["reached"] == len(recs) and all(
            r.get("steps_to_target") is not None for r in recs)
        steps = std = epochs = None
        n_train = next((int(r["num_train"]) for r in recs if r.get("num_train")), None)
        if reached:
            s = np.array([float(r["steps_to_target"]) for r in recs])
            steps, std = float(s.mean()), float(s.std())
            if n_train:
                epochs = steps * batch / n_train
            else:  # no n_train recorded: fall back on the trials' own epochs
                epochs = _mean(r.get("epochs_to_target") for r in recs)
        out.append(Setting(
            member=member, batch_size=batch, lr_multiplier=mult, learning_rate=lr,
            n_seeds=len(recs), n_reached=counts["reached"], n_not_reached=counts["not_reached"],
            n_diverged=counts["diverged"], reached=reached, steps_to_target=steps, steps_std=std,
            epochs_to_target=epochs,
            best_test_accuracy=_mean(r.get("best_test_accuracy") for r in recs),
            final_train_accuracy=_mean((r.get("final") or {}).get("train_accuracy") for r in recs),
            final_test_accuracy=_mean((r.get("final") or {}).get("test_accuracy") for r in recs),
            num_train=n_train,
            trial_ids=tuple(sorted(str(r.get("trial_id", "")) for r in recs))))
    return sorted(out, key=lambda s: (s.member, s.batch_size, _lr_sort(s)))


def _lr_sort(s: Setting) -> tuple:
    lr = s.learning_rate if s.learning_rate is not None else math.inf
    mult = s.lr_multiplier if s.lr_multiplier is not None else math.inf
    return (lr, mult)


@dataclasses.dataclass(frozen=True)
class BestCell:
    """The tuned result of one (member, batch_size): best setting plus what else was tried."""
    member: str
    batch_size: int
    best: Setting | None              # None: no learning rate reached the target on every seed
    grid: tuple                       # all settings tried, by learning rate ascending
    lr_at_grid_edge: bool             # best lr is the smallest or largest lr tried
    n_trials: int
    n_reached: int                    # trial counts per status, over all lrs and seeds
    n_not_reached: int
    n_diverged: int
    best_test_accuracy_any_lr: float | None  # max over non-diverged settings of the seed mean

    @property
    def steps_to_target(self) -> float | None:
        return self.best.steps_to_target if self.best else None

    @property
    def epochs_to_target(self) -> float | None:
        return self.best.epochs_to_target if self.best else None

    @property
    def learning_rate(self) -> float | None:
        return self.best.learning_rate if self.best else None

    @property
    def lr_multiplier(self) -> float | None:
        return self.best.lr_multiplier if self.best else None

    @property
    def grid_lrs(self) -> tuple:
        return tuple(s.learning_rate for s in self.grid)


def select_best(settings: Sequence[Setting]) -> list[BestCell]:
    """Best learning rate per (member, batch): fewest mean steps among reached settings; ties go to
    the smaller learning rate. Sorted by member then batch size."""
    cells: dict[tuple, list[Setting]] = {}
    for s in settings:
        cells.setdefault((s.member, s.batch_size), []).append(s)
    out = []
    for (member, batch), grid in cells.items():
        grid = sorted(grid, key=_lr_sort)
        reached = [(s.steps_to_target, i) for i, s in enumerate(grid) if s.reached]
        best_i = min(reached)[1] if reached else None
        edge = best_i is not None and (best_i == 0 or best_i == len(grid) - 1)
        accs = [s.best_test_accuracy for s in grid
                if s.best_test_accuracy is not None and s.n_diverged < s.n_seeds]
        out.append(BestCell(
            member=member, batch_size=batch, best=grid[best_i] if best_i is not None else None,
            grid=tuple(grid), lr_at_grid_edge=edge,
            n_trials=sum(s.n_seeds for s in grid), n_reached=sum(s.n_reached for s in grid),
            n_not_reached=sum(s.n_not_reached for s in grid),
            n_diverged=sum(s.n_diverged for s in grid),
            best_test_accuracy_any_lr=max(accs) if accs else None))
    return sorted(out, key=lambda c: (c.member, c.batch_size))


# ----------------------------------------------------------------------------------------------
# max_batch(eps)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MaxBatch:
    value: int | None                  # None: undefined, see reason
    reason: str                        # why undefined, or a short description when defined
    eps: float
    reference_batch: int | None        # the member's smallest batch size
    reference_epochs: float | None     # its best epochs-to-target
    threshold: float | None            # (1 + eps) * reference_epochs
    largest_batch: int | None          # the largest batch tried for the member
    at_ceiling: bool                   # value == largest batch tried: a lower bound only
    gaps: tuple = ()                   # batches below value that fail the test


def max_batch(cells: Sequence[BestCell], eps: float = DEFAULT_EPS) -> MaxBatch:
    """max_batch(eps) of one member from its BestCells (any order)."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    cells = sorted(cells, key=lambda c: c.batch_size)
    if not cells:
        return MaxBatch(None, "no trials", eps, None, None, None, None, False)
    ref, largest = cells[0], cells[-1].batch_size
    if ref.epochs_to_target is None:
        return MaxBatch(None, f"the smallest batch size B={ref.batch_size} never reached the target "
                        f"({ref.n_trials} trials: {ref.n_not_reached} not reached, "
                        f"{ref.n_diverged} diverged)", eps, ref.batch_size, None, None, largest, False)
    e0 = ref.epochs_to_target
    thr = (1.0 + eps) * e0
    tol = 1e-9 * thr  # float slack so a hand-computed boundary case counts as within
    ok = [c.batch_size for c in cells if c.epochs_to_target is not None and c.epochs_to_target <= thr + tol]
    value = max(ok)
    gaps = tuple(c.batch_size for c in cells if c.batch_size < value and c.batch_size not in ok)
    reason = (f"largest B with epochs <= (1+{eps:g}) x {e0:.4g} = {thr:.4g}"
              + (" (the largest batch tried: a lower bound)" if value == largest else ""))
    return MaxBatch(value, reason, eps, ref.batch_size, e0, thr, largest, value == largest, gaps)


# ----------------------------------------------------------------------------------------------
# Critical batch size
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CritFit:
    s_min: float | None
    b_crit: float | None
    r2_log: float | None     # R^2 of log S (fit vs data); nan when log S has no spread
    rel_rms: float | None    # sqrt(mean(((S_fit - S) / S)^2))
    n_points: int
    reason: str | None       # None when the fit is valid


def fit_critical_batch(batch_sizes: Sequence[float], steps: Sequence[float]) -> CritFit:
    """Fits S(B) = S_min (1 + B_crit / B) by relative (1/S^2-weighted) linear least squares in 1/B.

    Needs >= 3 points with distinct batch sizes; returns a CritFit with b_crit None and a reason
    when the fit is not possible or gives S_min <= 0 or B_crit <= 0.
    """
    b = np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    keep = np.isfinite(b) & np.isfinite(s) & (b > 0) & (s > 0)
    b, s = b[keep], s[keep]
    n = int(b.size)
    if n < 3 or np.unique(b).size < 3:
        return CritFit(None, None, None, None, n, f"needs >= 3 batch sizes that reached the target, has {n}")
    x = 1.0 / b
    w = 1.0 / s  # sqrt of the weights 1/S^2: rows scaled so residuals are relative
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, slope), *_ = np.linalg.lstsq(design, s * w, rcond=None)
    if not a > 0:
        return CritFit(None, None, None, None, n,
                       f"fit gives S_min = {a:.3g} <= 0 (steps fall faster than 1/B: noisy or inconsistent data)")
    if not slope > 0:
        return CritFit(float(a), None, None, None, n,
                       f"fit gives B_crit = {slope / a:.3g} <= 0 (steps do not fall with batch size: "
                       "already past the critical batch at the smallest batch)")
    fit = a + slope * x
    rel = (fit - s) / s
    ls, lf = np.log(s), np.log(fit)
    sst = float(np.sum((ls - ls.mean()) ** 2))
    r2 = 1.0 - float(np.sum((ls - lf) ** 2)) / sst if sst > 0 else float("nan")
    return CritFit(float(a), float(slope / a), r2, float(np.sqrt(np.mean(rel ** 2))), n, None)


# ----------------------------------------------------------------------------------------------
# Per-member summary and gradient statistics
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MemberSummary:
    info: MemberInfo
    cells: tuple                 # BestCells by batch ascending
    max_batch: MaxBatch
    crit: CritFit
    batch_bound_init: float | None       # mean over trials of the batch bound at the first record
    batch_bound_init_std: float | None
    noise_scale_ema: float | None        # median over trials of the final noise-scale estimate

    @property
    def edge_cells(self) -> tuple:
        return tuple(c for c in self.cells if c.lr_at_grid_edge)


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


def summarize_members(records: Sequence[dict], eps: float = DEFAULT_EPS) -> list[MemberSummary]:
    """Everything the report needs per member, narrowest member first."""
    cells = select_best(aggregate_settings(records))
    out = []
    for info in members_from_records(records):
        mine = tuple(c for c in cells if c.member == info.name)
        got = [c for c in mine if c.steps_to_target is not None]
        crit = fit_critical_batch([c.batch_size for c in got], [c.steps_to_target for c in got])
        recs = [r for r in records if r["member"] == info.name]
        bb = batch_bound_at_init(recs)
        ns = [float(v) for v in ((r.get("gradient") or {}).get("noise_scale_ema") for r in recs)
              if v is not None and np.isfinite(v)]
        out.append(MemberSummary(
            info=info, cells=mine, max_batch=max_batch(mine, eps), crit=crit,
            batch_bound_init=float(np.mean(bb)) if bb else None,
            batch_bound_init_std=float(np.std(bb)) if bb else None,
            noise_scale_ema=float(np.median(ns)) if ns else None))
    return out


# ----------------------------------------------------------------------------------------------
# Verdict on the paper's claim
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str          # SUPPORTED | NOT_SUPPORTED | INCONCLUSIVE
    reasons: tuple        # why inconclusive (empty otherwise)
    caveats: tuple        # notes that do not decide the outcome
    text: str             # one paragraph with the numbers


def _fmt_b(v) -> str:
    return "undefined" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _trend(values: Sequence[float]) -> str:
    d = np.diff(np.asarray(values, dtype=float))
    if np.all(d == 0):
        return "flat"
    if np.all(d >= 0):
        return "increasing"
    if np.all(d <= 0):
        return "decreasing"
    return "mixed"


def verdict(summaries: Sequence[MemberSummary], eps: float = DEFAULT_EPS, *,
            ignore_grid_edges: bool = False) -> Verdict:
    """Verdict on "for a fixed parameter budget, wider members keep epochs-to-target flat up to
    larger batches", from max_batch(eps) across width (B_crit is secondary evidence).

    supported: max_batch non-decreasing in width and widest > narrowest.
    not supported: narrowest > widest.
    inconclusive: no data, < 2 members, members of equal width, a member without max_batch, best
    learning rates at a grid edge (unless ignore_grid_edges), every member at its largest batch
    (ceiling), equal max_batch at both ends, or a mixed trend.
    """
    ms = [s for s in summaries]
    by_name = {s.info.name: s for s in ms}
    ms = [by_name[m.name] for m in order_by_width(s.info for s in ms)]
    reasons, caveats = [], []

    def member_str(s: MemberSummary) -> str:
        parts = [f"width {_fmt_b(s.info.width)}"]
        if s.info.depth is not None:
            parts.append(f"depth {s.info.depth}")
        if s.info.params:
            parts.append(f"{s.info.params:,} params")
        mb = s.max_batch
        val = _fmt_b(mb.value) + ("+" if mb.at_ceiling else "")
        return f"{s.info.name} ({', '.join(parts)}): max_batch {val}, B_crit {_fmt_b(s.crit.b_crit)}"

    if not ms:
        return Verdict(INCONCLUSIVE, ("no finished trials",), (),
                       "Verdict: INCONCLUSIVE - no trial has finished yet, so there is nothing to compare.")
    if len(ms) < 2:
        reasons.append("only one member: the claim compares members of different width")
    widths = [s.info.width for s in ms]
    if len(ms) >= 2 and (any(w is None for w in widths) or len(set(widths)) < 2):
        reasons.append("the members do not differ in width")
    missing = [s for s in ms if s.max_batch.value is None]
    for s in missing:
        reasons.append(f"{s.info.name} has no max_batch ({s.max_batch.reason})")
    edges = [(s.info.name, c.batch_size) for s in ms for c in s.edge_cells]
    if edges:
        msg = ("best learning rate at the edge of the grid tried for "
               + ", ".join(f"{m} B={b}" for m, b in edges)
               + " (the optimum may lie outside the grid)")
        (caveats if ignore_grid_edges else reasons).append(msg)
    params = [s.info.params for s in ms if s.info.params]
    if len(params) >= 2 and max(params) > 1.10 * min(params):
        caveats.append(f"the members do not share a parameter budget ({min(params):,} to "
                       f"{max(params):,} params): this is not the paper's fixed-budget comparison")
    vals = [s.max_batch.value for s in ms]
    if len(ms) >= 2 and not missing and all(s.max_batch.at_ceiling for s in ms):
        reasons.append("every member keeps epochs flat up to the largest batch tried (ceiling "
                       "effect): extend the sweep to larger batches")
    gaps = [f"{s.info.name} (B={', '.join(map(str, s.max_batch.gaps))})" for s in ms if s.max_batch.gaps]
    if gaps:
        caveats.append("non-monotone epochs curves: batches below max_batch that fail the test for "
                       + "; ".join(gaps))

    outcome = INCONCLUSIVE
    trend = None
    if len(ms) >= 2 and not missing and len(set(widths)) >= 2 and None not in widths:
        trend = _trend(vals)
        narrow, wide = vals[0], vals[-1]
        if narrow > wide:
            decided = NOT_SUPPORTED
        elif wide > narrow and trend == "increasing":
            decided = SUPPORTED
        elif wide == narrow:
            decided = None
            reasons.append(f"narrowest and widest members have the same max_batch ({narrow})")
        else:
            decided = None
            reasons.append(f"max_batch is not monotone in width ({', '.join(map(str, vals))})")
        if decided is not None and not reasons:
            outcome = decided
        elif decided is not None:
            caveats.insert(0, f"without the reasons above the numbers would say '{decided}'")
    crits = [s.crit.b_crit for s in ms]
    if len(ms) >= 2 and all(c is not None for c in crits):
        crit_note = f"B_crit is {_trend(crits)} with width"
    elif len(ms) >= 2:
        crit_note = ("B_crit is unavailable for "
                     + ", ".join(f"{s.info.name} ({s.crit.reason})" for s in ms if s.crit.b_crit is None))
    else:
        crit_note = ""

    text = [f"Verdict: {outcome.upper()}.",
            f"The claim: at a fixed parameter budget, wider members keep epochs-to-target within "
            f"(1 + eps) of the small-batch value up to larger batch sizes (eps = {eps:g}).",
            "Members from narrowest to widest: " + "; ".join(member_str(s) for s in ms) + "."]
    if trend is not None:
        text.append(f"max_batch is {trend} with width.")
    if crit_note:
        text.append(f"Secondary evidence: {crit_note}.")
    if reasons:
        text.append("Inconclusive because: " + "; ".join(reasons) + ".")
    if caveats:
        text.append("Caveats: " + "; ".join(caveats) + ".")
    if any(s.max_batch.at_ceiling for s in ms):
        text.append("A '+' marks a max_batch equal to the largest batch tried (a lower bound).")
    return Verdict(outcome, tuple(reasons), tuple(caveats), " ".join(text))


def analyze(records: Sequence[dict], eps: float = DEFAULT_EPS, *,
            ignore_grid_edges: bool = False) -> dict:
    """Summaries and one verdict per architecture (a study normally has one)."""
    summaries = summarize_members(records, eps)
    archs = sorted({s.info.arch for s in summaries})
    verdicts = {a: verdict([s for s in summaries if s.info.arch == a], eps,
                           ignore_grid_edges=ignore_grid_edges) for a in archs}
    if not archs:
        verdicts = {"": verdict([], eps)}
    return {"summaries": summaries, "verdicts": verdicts, "eps": eps}
