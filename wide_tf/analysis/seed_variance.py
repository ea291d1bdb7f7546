"""Owns the reading of a study's seed variance (its noise between runs, not the gradient noise
scale) from its records: the pooled seed sigma of log steps within cells, the cell effect beyond the
seeds (from the lack-of-fit mean square about each member's fitted curve) and its F ratio, the share
of the seed variance that a seed carries across batch sizes, and the curvature of the learning-rate
response at interior best rates. The command line and the comparison with simulated studies are
`wide_tf.analysis.calibration`'s; the design simulation reads a study's scale with it
(`--scale_from`). Pure NumPy on records; no TensorFlow."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis.members import summarize_members
from wide_tf.study import lr_grid


@dataclasses.dataclass(frozen=True)
class NoiseSummary:
    sigma: float  # pooled seed sigma of log steps within complete cells
    # The cell effect beyond the seeds: sqrt((MS_lof - (1 - share) sigma^2) / k), floored at 0.
    # A seed's shared effect is the same in every cell of its member, so the fitted curve's
    # level absorbs it and only the unshared part of the seed noise reaches the cell means.
    cell_sd: float
    f: float  # pooled MS_lof / sigma^2 (1: cells scatter about the curves as their seeds say)
    seed_share: float  # mean over members of the (member, seed) share of the seed variance
    lr_curv: float  # median curvature of log steps in log rate at interior best rates
    n_cells: int  # cells whose curvature could be read

    def line(self) -> str:
        return (
            f"sigma {self.sigma:.3f}, cell sd {self.cell_sd:.3f} (F {self.f:.2f}), "
            f"seed share {self.seed_share:.2f}, learning-rate curvature {self.lr_curv:.2f} "
            f"({self.n_cells} cells)"
        )


def _curvatures(records: Sequence[dict]) -> list[float]:
    """Per cell: the parabola's curvature of log median tuning steps in log multiplier through
    the best rate and its two neighbours, where all three finished on every tuning seed."""
    grid = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        if lr_grid.role_of(r) == lr_grid.TUNE:
            cell = grid[(r["member"], r["batch_size"])]
            cell[lr_grid.mult_key(r.get("lr_multiplier", 1.0))].append(lr_grid.run_steps(r))
    out = []
    for cell in grid.values():
        ms = sorted(cell)
        med = {m: float(np.median(v)) for m, v in cell.items() if None not in v}
        if len(med) < 3:
            continue
        i = ms.index(min(med, key=med.get))
        if 0 < i < len(ms) - 1 and ms[i - 1] in med and ms[i + 1] in med:
            h = math.log(ms[i + 1] / ms[i])
            ym, y0, yp = (math.log(med[ms[k]]) for k in (i - 1, i, i + 1))
            out.append((ym + yp - 2 * y0) / (2 * h * h))
    return out


def summarize(records: Sequence[dict]) -> NoiseSummary:
    """The noise summary of one study's records (its study target)."""
    ss_w = df_w = 0.0
    lof_ss = lof_df = 0.0
    ks, shares = [], []
    for s in summarize_members(records, n_boot=20):
        comp = None if s.curve is None else s.curve.components
        if comp is None or comp.sigma2 is None:
            continue
        ss_w += comp.sigma2 * comp.df_within
        df_w += comp.df_within
        shares.append(comp.seed_share)
        if comp.ms_lof is not None:
            lof_ss += comp.ms_lof * comp.df_lof
            lof_df += comp.df_lof
            ks.append(comp.k_mean)
    if not df_w or not lof_df:
        raise ValueError("no member has replicated complete cells and a fitted curve")
    s2, ms, share = ss_w / df_w, lof_ss / lof_df, float(np.mean(shares))
    curv = _curvatures(records)
    return NoiseSummary(
        sigma=math.sqrt(s2),
        cell_sd=math.sqrt(max(0.0, (ms - (1.0 - share) * s2) / float(np.mean(ks)))),
        f=ms / s2,
        seed_share=share,
        lr_curv=float(np.median(curv)) if curv else float("nan"),
        n_cells=len(curv),
    )


def read_records(workdir: str) -> list[dict]:
    import glob
    import os

    from wide_tf.store import workdir as wd

    recs = []
    for path in sorted(glob.glob(os.path.join(workdir, "results", "*.json"))):
        recs.append(wd.read_json(path))
    if not recs:
        raise OSError(f"no results/*.json in {workdir}")
    return recs
