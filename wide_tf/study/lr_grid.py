"""Owns the learning-rate protocol of one (member, batch size) cell: which runs come next once the
runs so far have finished. Pure Python on result records (no TensorFlow), so the study and the
study simulator (`wide_tf.analysis.simulate`) make exactly the same decisions.

The protocol:

1. The initial grid (`sweep.lr_multipliers`) runs on the tuning seeds (`sweep.seeds`).
2. The grid is extended by one point, keeping its geometric spacing, while it cannot show an
   optimum inside it (at most `sweep.max_lr_extensions` points):
   * the best rate sits on the largest rate tried -> one step up;
   * the best rate sits on the smallest rate tried -> one step down;
   * no rate reached the target: every run diverged -> down (the rates are too large); no run
     diverged, so they all ran out of budget -> towards the rate that got closest to the target
     (its final training metric): up when that is the largest rate (the usual case: larger rates
     are faster until they diverge), down when it is the smallest (a rate too large for the
     network can stall at chance without diverging); both (small rates too slow, large ones
     diverge) -> no extension: the cell is censored.
3. Once the grid is final, the best rate is re-run on every confirmation seed
   (`sweep.confirm_seeds`), as ordinary trials with role "confirm". A cell's steps-to-target is
   then the median over all its seeds at that rate (`wide_tf.analysis.verdict`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from wide_tf.schema.targets import lower_is_better

TUNE = "tune"
CONFIRM = "confirm"


def role_of(rec: dict) -> str:
    return rec.get("role") or TUNE


def run_steps(rec: dict) -> float | None:
    """Steps to target of one run: the crossing interpolated between the two evaluations that
    bracket it when the run recorded one, else the evaluation at which it was first seen."""
    if rec.get("status") != "reached":
        return None
    v = rec.get("steps_to_target_interp")
    if v is None:
        v = rec.get("steps_to_target")
    return None if v is None else float(v)


def mult_key(v) -> float:
    """Multipliers compared at 6 significant digits, so float noise never splits a grid point."""
    return float(f"{float(v):.6g}")


@dataclasses.dataclass(frozen=True)
class GridPoint:
    multiplier: float
    n_runs: int
    n_reached: int
    n_diverged: int
    median_steps: float | None  # over the tuning seeds, only when every seed reached
    progress: float | None = None  # mean final target metric (larger = closer) when not reached

    @property
    def reached(self) -> bool:
        return self.median_steps is not None


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    k = len(v)
    return v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])


def _progress(rec: dict) -> float | None:
    """How close a run that did not reach the target got to it: its final value of the target
    metric, signed so that larger is closer (None when the run recorded none)."""
    target = rec.get("target") or {}
    metric = target.get("metric") if isinstance(target, dict) else None
    v = (rec.get("final") or {}).get(metric) if metric else None
    if v is None or not math.isfinite(float(v)):
        return None
    return -float(v) if lower_is_better(metric) else float(v)


def grid_points(tuning_records: Sequence[dict]) -> list[GridPoint]:
    """The tuning runs of one cell grouped by multiplier, ascending."""
    by: dict[float, list[dict]] = {}
    for r in tuning_records:
        by.setdefault(mult_key(r.get("lr_multiplier", 1.0)), []).append(r)
    out = []
    for m in sorted(by):
        rs = by[m]
        steps = [run_steps(r) for r in rs]
        ok = all(s is not None for s in steps)
        prog = [p for p in (_progress(r) for r in rs) if p is not None]
        out.append(
            GridPoint(
                m,
                len(rs),
                sum(s is not None for s in steps),
                sum(r.get("status") == "diverged" for r in rs),
                _median(steps) if ok else None,
                sum(prog) / len(prog) if prog else None,
            )
        )
    return out


def best_point(points: Sequence[GridPoint]) -> GridPoint | None:
    """Fewest median steps among rates where every tuning seed reached; ties to the smaller rate."""
    reached = [p for p in points if p.reached]
    return min(reached, key=lambda p: (p.median_steps, p.multiplier)) if reached else None


def extension(
    points: Sequence[GridPoint], base: Sequence[float], max_extensions: int
) -> float | None:
    """The next multiplier to try for this cell, or None when the grid is final."""
    if not points:
        return None
    mults = [p.multiplier for p in points]
    base_keys = sorted({mult_key(b) for b in base})
    if sum(1 for m in mults if m not in base_keys) >= max_extensions:
        return None
    ratio = base_keys[1] / base_keys[0] if len(base_keys) > 1 else 2.0
    best = best_point(points)
    if best is None:
        diverged = sum(p.n_diverged for p in points)
        runs = sum(p.n_runs for p in points)
        if diverged == runs:
            nxt = mults[0] / ratio
        elif diverged == 0:
            prog = [(p.progress, p.multiplier) for p in points if p.progress is not None]
            closest = max(prog)[1] if len(prog) == len(points) else mults[-1]
            nxt = mults[0] / ratio if closest == mults[0] and len(points) > 1 else mults[-1] * ratio
        else:
            return None
    elif len(points) > 1 and best.multiplier == mults[-1]:
        nxt = mults[-1] * ratio
    elif len(points) > 1 and best.multiplier == mults[0]:
        nxt = mults[0] / ratio
    else:
        return None
    nxt = float(f"{nxt:.4g}")  # 0.7071 / 1.414 reads 0.5, not 0.49999
    return None if nxt in mults or not math.isfinite(nxt) or nxt <= 0 else nxt


def next_runs(
    records: Sequence[dict],
    base: Sequence[float],
    tuning_seeds: Sequence[int],
    confirm_seeds: Sequence[int],
    max_extensions: int,
    extend: bool = True,
) -> list[tuple[float, int, str]]:
    """(multiplier, seed, role) of the runs this cell needs next, given all its finished runs.

    The caller runs the initial grid first and calls this only when none of the cell's runs is
    pending; an empty answer means the cell is complete."""
    tuning = [r for r in records if role_of(r) == TUNE]
    points = grid_points(tuning)
    if extend:
        nxt = extension(points, base, max_extensions)
        if nxt is not None:
            return [(nxt, int(s), TUNE) for s in tuning_seeds]
    best = best_point(points)
    if best is None:
        return []
    done = {(mult_key(r.get("lr_multiplier", 1.0)), int(r.get("seed", 0))) for r in records}
    return [
        (best.multiplier, int(s), CONFIRM)
        for s in confirm_seeds
        if (best.multiplier, int(s)) not in done and int(s) not in set(map(int, tuning_seeds))
    ]
