"""Owns how the report's figures mark what they measure: the model-free critical batch's one name
(B_x2 at eps = 1), a censored value drawn as what it is (an open marker at the edge of the batches
tried and an arrow to the axes' edge), the width axis named per architecture, and depth labels
moved apart until no two text boxes overlap."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg

# What "width" means per architecture: each figure names only the kinds it draws.
WIDTH_NAMES = {
    "mlp": "width (units per hidden layer)",
    "wrn": "widening factor k (channels 16k, 32k, 64k)",
}


def width_label(summaries) -> str:
    """The width axis's name for the architectures drawn (an MLP plot never mentions WRN)."""
    arches = sorted({str(s.info.arch) for s in summaries if s.info.arch})
    if len(arches) == 1:
        return WIDTH_NAMES.get(arches[0], "width")
    return "; ".join(f"{a}: {WIDTH_NAMES.get(a, 'width')}" for a in arches) or "width"


def bx_name(eps: float) -> str:
    """The model-free critical batch's one name in every output: B_x2 at eps = 1."""
    return f"B_x{1 + eps:g}"


def bound_side(curve, field: str) -> str | None:
    """'above' when `field` of the member's curve is only a lower bound, 'below' when only an
    upper bound, None when measured. B_x(1+eps) with no crossing up to the largest batch sits AT
    that batch (not beyond it), so its status, not the range test, says it is censored."""
    iv = getattr(curve, field)
    if field == "b_model_free" and curve.b_model_free_status == 1:
        return "above"
    if iv.above_range:
        return "above"
    return "below" if iv.below_range else None


def draw_bound(ax, x: float, y: float, side: str, color, axis: str = "y") -> None:
    """A censored value as what it is: an open marker at the edge of the batches tried and an
    arrow from it to the edge of the axes (along y, or along x for a batch on the x axis)."""
    up = side == "above"
    marker = {("y", True): "^", ("y", False): "v", ("x", True): ">", ("x", False): "<"}[(axis, up)]
    ax.plot(
        [x],
        [y],
        linestyle="none",
        marker=marker,
        markersize=10,
        markerfacecolor="none",
        markeredgewidth=1.5,
        color=color,
        gid="censored",
    )
    end = 1.0 if up else 0.0
    xy, coords = (
        ((x, end), ("data", "axes fraction"))
        if axis == "y"
        else ((end, y), ("axes fraction", "data"))
    )
    ax.annotate(
        "",
        xy=xy,
        xycoords=coords,
        xytext=(x, y),
        textcoords="data",
        arrowprops=dict(arrowstyle="-|>", color=color, linewidth=1.2, shrinkA=6, shrinkB=0),
        gid="censored-arrow",
    )


def depth_labels(ax) -> list:
    return [t for t in ax.texts if t.get_gid() == "depth-label"]


def separate_labels(fig, pad_px: float = 1.0, max_rounds: int = 200) -> None:
    """Moves the depth labels of each axes apart until no two text boxes overlap (members of close
    widths and batches crowd the narrow end): each label, in order of its point, steps down below
    the ones already placed that it meets, by its own height."""
    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)
    canvas.draw()  # settles the limits and the tick labels, on which the boxes depend
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        labels = sorted(depth_labels(ax), key=lambda t: tuple(ax.transData.transform(t.xy)))
        placed = []
        for t in labels:
            for _ in range(max_rounds):
                box = t.get_window_extent(renderer)
                hit = next((p for p in placed if box.overlaps(p)), None)
                if hit is None:
                    break
                step_pt = (box.y1 - hit.y0 + pad_px) * 72.0 / fig.dpi
                dx, dy = t.xyann
                t.xyann = (dx, dy - step_pt)
            placed.append(t.get_window_extent(renderer).padded(pad_px / 2))
