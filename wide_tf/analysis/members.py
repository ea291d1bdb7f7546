"""Owns each member's summary: its cells, its curve estimate (`wide_tf.analysis.critical_batch`:
the model-free critical batch B_x(1+eps), the censored fit of S(B) = S_min (1 + B_crit / B), the
lack-of-fit test and hierarchical intervals), its gradient statistics, and the formatting of an
estimate's interval that the verdict and the report share.

* The model-free critical batch B_x(1+eps) is the first batch whose epochs-to-target exceed
  perfect scaling from the two smallest batches by eps (Zhang et al. 2024's definition at
  eps = 0.2); B_x2 is its default, eps = 1.

Pure NumPy/SciPy; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis import critical_batch as cb
from wide_tf.analysis.cells import MemberInfo, cells_of, members_from_records, observations

# B_x(1+eps) at eps = 1: the batch at which epochs-to-target have doubled over perfect scaling,
# which is McCandlish et al.'s definition of B_crit read off the data without a curve. Zhang et al.
# (2024) use eps = 0.2 (sweep.eps): it sits where epochs are still nearly flat in B, so the same
# noise in log epochs moves its crossing about 3x further (log-log slope ~0.17 there against ~0.5
# at the doubling), and on an S_min (1 + B_crit / B) curve it is about B_crit / 5.
DEFAULT_EPS = 1.0
# Replicates per member: the 2.5% and 97.5% quantiles of 200 replicates rest on their 5th
# values, which costs about 1.5 points of coverage (tests/analysis/test_stats.py).
DEFAULT_BOOTSTRAP = 1000
# A member whose lack-of-fit test rejects the curve at this level gets no B_crit in the slope.
LOF_ALPHA = 0.05


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
        """B_x(1+eps), the model-free critical batch (the measure the verdict decides on)."""
        return None if self.curve is None else self.curve.b_model_free


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
