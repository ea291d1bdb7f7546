"""Owns the report figures' axes and legends: which ticks are labelled (every batch size tried,
member widths thinned so that no two labels overlap) and legends placed outside the data."""

from __future__ import annotations

import numpy as np
from matplotlib import ticker

# The smallest gap between two labelled width ticks, as a fraction of the log-width axis.
MIN_TICK_GAP = 0.08


def spaced_ticks(values, min_gap: float = MIN_TICK_GAP) -> list[float]:
    """The values to label on a log axis: the smallest and the largest, and in between each one at
    least `min_gap` of the axis (in log units) from the last labelled, so labels never overlap."""
    vs = sorted({float(v) for v in values if v and v > 0})
    if len(vs) < 3:
        return vs
    span = np.log(vs[-1] / vs[0])
    keep = [vs[0]]
    for v in vs[1:-1]:
        if np.log(v / keep[-1]) >= min_gap * span and np.log(vs[-1] / v) >= min_gap * span:
            keep.append(v)
    return keep + [vs[-1]]


def width_ticks(ax, summaries) -> None:
    # Family widths are rarely powers of two: tick the members' widths, every one marked (minor
    # ticks) and as many labelled as fit without overlapping.
    ws = sorted({float(s.info.width) for s in summaries if isinstance(s.info.width, (int, float))})
    if 0 < len(ws) <= 24:
        ax.set_xticks(spaced_ticks(ws))
        ax.xaxis.set_minor_locator(ticker.FixedLocator(ws))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def batch_ticks(ax, batches) -> None:
    """Every batch size tried labelled (thinned only where two would overlap)."""
    bs = sorted({float(b) for b in batches or ()})
    if bs:
        ax.set_xticks(spaced_ticks(bs, MIN_TICK_GAP / 2))
        ax.xaxis.set_minor_locator(ticker.FixedLocator(bs))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def batches_of(summaries) -> list[int]:
    return sorted({c.batch_size for s in summaries for c in s.cells})


def legend_outside(ax, below: bool = False, fontsize: int = 8) -> None:
    """The legend beside the axes (or below them), never over the data."""
    if not ax.get_legend_handles_labels()[0]:
        return
    if below:
        ax.legend(fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    else:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
