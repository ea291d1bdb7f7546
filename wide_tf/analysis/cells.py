"""Owns records -> cells: reading result records (parse, dedupe, re-aim at a further target), the
study's members in width order, and each (member, batch size) cell's chosen learning rate and
seed observations.

* A **cell** is one (member, batch size). Its best learning rate is chosen on the tuning seeds
  by `wide_tf.study.lr_grid` (fewest median steps among rates where every tuning seed reached; ties
  to the smaller rate). The chosen rate's runs on every seed (tuning and confirmation) are the
  cell's observations: a finished run gives its steps-to-target; a run that ran out of budget, or
  **diverged**, is **censored** (S > the steps it was given: a seed on which the chosen rate fails
  is evidence that the batch is hard, not a missing value). A cell where no rate reached the
  target is censored at its budget. The cell's value is the median over its seeds (censored seeds
  count as larger than every finished one), with the range kept.

Pure Python on plain dicts (the result.json schema); no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from wide_tf.analysis import critical_batch as cb
from wide_tf.schema import plan as plan_lib
from wide_tf.schema.targets import comparison
from wide_tf.study import lr_grid

STATUSES = ("reached", "not_reached", "diverged")


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


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
    # The seeds of seed_steps and of censored_budgets, in the same order (a seed's runs at
    # different batch sizes share its initialisation and data order: a (member, seed) effect).
    seed_ids: tuple = ()
    censored_seed_ids: tuple = ()

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
    its protocol by the trainer's rule (`wide_tf.schema.plan.budget_steps`), else the
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


def _chosen_runs(records: Sequence[dict], tuning: Sequence[dict], best) -> list[dict]:
    """The runs that observe the cell: the chosen rate's on every seed, or, in a censored cell
    (no rate reached), every tuning seed's longest non-diverged run (S > its budget)."""
    if best is not None:
        return [
            r for r in records if lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == best.multiplier
        ]
    mine = []
    for seed in sorted({int(r.get("seed", 0)) for r in tuning}):
        runs = [
            r for r in tuning if int(r.get("seed", 0)) == seed and r.get("status") == "not_reached"
        ]
        if runs:
            mine.append(max(runs, key=lambda r: r.get("steps") or 0))
    return mine


def _median_or_bound(finished, budgets) -> tuple[float | None, float | None]:
    """(median steps, None), or (None, S > bound) when the median seed is censored."""
    values = sorted(list(finished) + [math.inf] * len(budgets))
    if not values:
        return None, None
    k = len(values)
    med = values[k // 2] if k % 2 else 0.5 * (values[k // 2 - 1] + values[k // 2])
    if math.isfinite(med):
        return float(med), None
    return None, float(min(budgets))


def make_cell(member: str, batch: int, records: Sequence[dict]) -> Cell:
    tuning = [r for r in records if lr_grid.role_of(r) == lr_grid.TUNE]
    points = lr_grid.grid_points(tuning)
    best = lr_grid.best_point(points)
    n_train = next((int(r["num_train"]) for r in records if r.get("num_train")), None)
    mine = _chosen_runs(records, tuning, best)
    done = sorted(
        (lr_grid.run_steps(r), int(r.get("seed", 0)))
        for r in mine
        if lr_grid.run_steps(r) is not None
    )
    finished = [v for v, _ in done]
    cens = [
        (float(r["steps"]), int(r.get("seed", 0)))
        for r in mine
        if r.get("status") == "not_reached" and (r.get("steps") or 0) > 0
    ]
    # A seed that diverged at the chosen rate failed to reach the target within its budget.
    div = [
        (b, int(r.get("seed", 0)))
        for r in mine
        if r.get("status") == "diverged" and (b := budget_steps(r))
    ]
    budgets = tuple(v for v, _ in cens + div)
    div_budgets = tuple(v for v, _ in div)
    median, bound = _median_or_bound(finished, budgets)
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
        seed_ids=tuple(sd for _, sd in done),
        censored_seed_ids=tuple(sd for _, sd in cens + div),
        n_diverged_censored=len(div_budgets),
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
    b, s, c, sd = [], [], [], []
    for cell in cells:
        ids = list(cell.seed_ids) or [None] * len(cell.seed_steps)
        for v, i in zip(cell.seed_steps, ids):
            b.append(cell.batch_size), s.append(max(v, 1e-9)), c.append(False), sd.append(i)
        ids = list(cell.censored_seed_ids) or [None] * len(cell.censored_budgets)
        for v, i in zip(cell.censored_budgets, ids):
            b.append(cell.batch_size), s.append(v), c.append(True), sd.append(i)
    n_train = next((cell.num_train for cell in cells if cell.num_train), None)
    if not b or not n_train:
        return None
    seeds = None if any(i is None for i in sd) else sd
    return cb.Observations.make(b, s, c, n_train, seeds)


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
