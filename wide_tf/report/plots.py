"""Owns the report's figures: one function per figure, each writing a PNG (DPI dots per inch) and a
vector PDF beside it and returning (file name, caption, PNG bytes), and the small axis helpers
they share: every batch size tried labelled, width ticks thinned so that no two labels overlap,
legends outside the data.

Figures are drawn with matplotlib's object API (`Figure`, no pyplot), so importing the report
neither picks a backend nor needs a display (absent on TPU VMs) nor keeps figures open."""

from __future__ import annotations

import io
import os

import matplotlib
import numpy as np
import tensorflow as tf
from matplotlib import ticker
from matplotlib.figure import Figure

from wide_tf.report.axes import (  # noqa: F401  (MIN_TICK_GAP, spaced_ticks: read by tests)
    MIN_TICK_GAP,
    batch_ticks,
    batches_of,
    legend_outside,
    spaced_ticks,
    width_ticks,
)
from wide_tf.report.marks import (  # noqa: F401  (depth_labels: read by tests)
    bound_side,
    bx_name,
    depth_labels,
    draw_bound,
    separate_labels,
    width_label,
)
from wide_tf.study import lr_grid

Plot = tuple[str, str, bytes]  # (file name, caption, PNG bytes)
BATCH_LABEL = "batch size B (examples per step)"
NOTHING_REACHED = "no learning rate reached the target at any batch size"
DPI = 200  # the PNGs' resolution; the PDFs are vector


# ----------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------


def _colors(n: int):
    # Ordered colours (dark = narrow, bright = wide) so width reads off every plot.
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(0.1 + 0.75 * i / max(n - 1, 1)) for i in range(n)]


def _label(s) -> str:
    w = s.info.width
    return f"{s.info.name} (width {w:g})" if isinstance(w, (int, float)) else s.info.name


def _plain_numbers() -> ticker.FuncFormatter:
    return ticker.FuncFormatter(lambda v, _: f"{v:g}")


def _log2_axis(ax, axis="x"):
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(_plain_numbers())


def _plain_log_axis(ax, axis: str) -> None:
    # Plain-number ticks on a log axis of any range (a narrow range has no decade tick to label).
    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    a.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(_plain_numbers())
    a.set_minor_formatter(ticker.NullFormatter())


def _plain_log_y(ax) -> None:
    # Log axes label "2x10^2" by default; researchers read plain numbers faster. Narrow ranges
    # get labelled 2 and 5 minor ticks, wide ranges only decades.
    if ax.get_yscale() != "log":
        return
    lo, hi = ax.get_ylim()
    fmt = _plain_numbers()
    ax.yaxis.set_major_formatter(fmt)
    if lo > 0 and hi / lo < 30:
        ax.yaxis.set_minor_locator(ticker.LogLocator(base=10, subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(fmt)
    else:
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _no_data(ax, what: str) -> None:
    # An empty log axis cannot be drawn; say why the panel is empty instead.
    ax.set_xscale("linear")
    ax.set_yscale("linear")
    if not any(len(line.get_xdata()) for line in ax.lines) and not ax.collections:
        ax.set_xticks([])  # the ticks of an empty panel would be numbers that mean nothing
        ax.set_yticks([])
    ax.text(
        0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.4"
    )


def _figure(figsize=(7.5, 5)):
    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def _save(fig, outdir: str, filename: str, caption: str) -> Plot:
    """Writes the figure to OUTDIR/FILENAME (PNG at DPI) and the same name .pdf (vector) and
    returns its (file name, caption, PNG bytes)."""
    for ax in fig.axes:
        if ax.get_yscale() == "log" and not isinstance(
            ax.yaxis.get_major_formatter(), ticker.FuncFormatter
        ):
            _plain_log_y(ax)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    data = buf.getvalue()
    with tf.io.gfile.GFile(os.path.join(outdir, filename), "wb") as f:
        f.write(data)
    pdf = io.BytesIO()
    fig.savefig(pdf, format="pdf", bbox_inches="tight")
    with tf.io.gfile.GFile(os.path.join(outdir, os.path.splitext(filename)[0] + ".pdf"), "wb") as f:
        f.write(pdf.getvalue())
    return filename, caption, data


def _finish_batch_plot(
    fig, ax, outdir, filename, caption, ylabel, title, *, nothing, log_y, batches=()
):
    """The common end of the plots against batch size: log2 batch axis with every batch tried
    labelled (or a note saying why the panel is empty), labels, grid, the legend outside the
    data; saves the figure."""
    if nothing is None:
        _log2_axis(ax)
        batch_ticks(ax, batches)
        if log_y:
            ax.set_yscale("log")
    else:
        _no_data(ax, nothing)
    ax.set_xlabel(BATCH_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    return _save(fig, outdir, filename, caption)


def _mark_unreached(ax, s, color, labelled: list):
    # Batches whose median seed did not reach the target within its budget are censored: draw an
    # upward triangle at the budget (S is larger than that). Cells where every run diverged have
    # no value at all: mark them on the x axis.
    cens = [(c.batch_size, c.censored_bound) for c in s.cells if c.censored_bound is not None]
    if cens:
        label = None if "cens" in labelled else "censored: did not reach within budget (S > marker)"
        labelled.append("cens")
        ax.plot(
            *zip(*cens),
            linestyle="none",
            marker="^",
            markersize=8,
            markerfacecolor="none",
            color=color,
            label=label,
        )
    xs = [c.batch_size for c in s.cells if c.median_steps is None and c.censored_bound is None]
    if xs:
        label = None if "none" in labelled else "no value (every run diverged)"
        labelled.append("none")
        ax.plot(
            xs,
            [0.03] * len(xs),
            linestyle="none",
            marker="x",
            markersize=8,
            color=color,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label=label,
        )


def _seed_points(s, epochs: bool):
    """(batch, median, low, high) of the cells with a median; low/high span the seeds."""
    out = []
    for c in s.cells:
        if c.median_steps is None:
            continue
        lo, hi = c.steps_range
        conv = c.epochs if epochs else (lambda v: v)
        out.append((c.batch_size, conv(c.median_steps), conv(lo), conv(hi)))
    return out


def _draw_medians(ax, s, col, epochs: bool) -> None:
    pts = _seed_points(s, epochs)
    if not pts:
        return
    b, m, lo, hi = map(np.array, zip(*pts))
    ax.errorbar(b, m, yerr=[m - lo, hi - m], fmt="o", color=col, capsize=3, label=_label(s))


def _clipped(iv) -> float:
    """An interval's value drawn at the edge of the batches tried when it lies beyond them."""
    return min(max(iv.value, iv.range_lo), iv.range_hi)


# ----------------------------------------------------------------------------------------------
# The figures
# ----------------------------------------------------------------------------------------------


def plot_steps(summaries, colors, outdir, target, nothing) -> Plot:
    """Steps to target vs batch: seed medians and ranges, the fitted curve with its 95% band, and
    the perfect-scaling line from the smallest batch."""
    fig, ax = _figure()
    marked: list = []
    for s, col in zip(summaries, colors):
        _draw_medians(ax, s, col, epochs=False)
        cv = s.curve
        if cv is not None and cv.fit is not None:
            g = cv.band_batches
            ax.plot(
                g, cv.fit.s_min * (1 + cv.fit.b_crit / g), "-", color=col, alpha=0.8, linewidth=1
            )
            ax.fill_between(g, cv.band_low, cv.band_high, color=col, alpha=0.15, linewidth=0)
        pts = _seed_points(s, epochs=False)
        if pts:
            bb = np.array([c.batch_size for c in s.cells], dtype=float)
            ax.plot(bb, pts[0][1] * pts[0][0] / bb, ":", color=col, alpha=0.6)
        _mark_unreached(ax, s, col, marked)
    if any(s.curve is not None and s.curve.fit is not None for s in summaries):
        ax.plot([], [], "k-", alpha=0.8, linewidth=1, label="fit S_min (1 + B_crit / B), 95% band")
    if any(_seed_points(s, epochs=False) for s in summaries):
        ax.plot([], [], "k:", alpha=0.6, label="perfect scaling S ~ 1/B")
    return _finish_batch_plot(
        fig,
        ax,
        outdir,
        "steps_vs_batch.png",
        "Steps to target vs batch size (log-log)",
        "steps to target (median over seeds; bars: seed range)",
        f"Steps to reach {target} vs batch size (best LR per batch)",
        nothing=nothing,
        log_y=True,
        batches=batches_of(summaries),
    )


def _draw_b_model_free(ax, cv, col) -> bool:
    """A member's (1 + eps) x E_ref threshold and B_x(1+eps) on it, with its interval; a
    censored one (no crossing up to the largest batch) as an open marker with an arrow to the
    right edge. Returns whether it was censored."""
    ax.axhline(cv.threshold_epochs, color=col, linestyle=":", alpha=0.6, linewidth=1)
    mb = cv.b_model_free
    if mb is None:
        return False
    side = bound_side(cv, "b_model_free")
    if side is not None:
        draw_bound(ax, _clipped(mb), cv.threshold_epochs, side, col, axis="x")
        return True
    if mb.low is not None:
        ax.errorbar(
            [mb.value],
            [cv.threshold_epochs],
            xerr=[[mb.value - mb.low], [mb.high - mb.value]],
            fmt="*",
            markersize=13,
            color=col,
            capsize=4,
        )
    else:
        ax.plot([mb.value], [cv.threshold_epochs], "*", markersize=13, color=col)
    return False


def plot_epochs(summaries, colors, outdir, eps, nothing) -> Plot:
    """Epochs to target vs batch: flat while scaling is perfect; B_x(1+eps) marked with its
    interval on each member's (1 + eps) threshold (censored: an open marker, an arrow right)."""
    fig, ax = _figure()
    marked: list = []
    censored = crossed = False
    for s, col in zip(summaries, colors):
        _draw_medians(ax, s, col, epochs=True)
        cv = s.curve
        if cv is not None and cv.fit is not None and s.cells and s.cells[0].num_train:
            g = cv.band_batches
            n = s.cells[0].num_train
            ax.plot(
                g, cv.fit.s_min * (g + cv.fit.b_crit) / n, "-", color=col, alpha=0.8, linewidth=1
            )
            ax.fill_between(
                g, cv.band_low * g / n, cv.band_high * g / n, color=col, alpha=0.15, linewidth=0
            )
        if cv is not None and cv.threshold_epochs is not None:
            bound = _draw_b_model_free(ax, cv, col)
            censored |= bound
            crossed |= cv.b_model_free is not None and not bound
        _mark_unreached(ax, s, col, marked)
    ax.plot([], [], "k:", alpha=0.6, label=f"(1 + eps) x E_ref, eps = {eps:g}")
    if crossed:
        ax.plot([], [], "k*", linestyle="none", markersize=10, label=f"{bx_name(eps)}, 95% CI")
    if censored:
        ax.plot(
            [],
            [],
            "k>",
            linestyle="none",
            markerfacecolor="none",
            label=f"{bx_name(eps)} censored: no crossing up to the largest batch (a lower bound)",
        )
    return _finish_batch_plot(
        fig,
        ax,
        outdir,
        "epochs_vs_batch.png",
        "Epochs to target vs batch size",
        "epochs to target (median over seeds; bars: seed range)",
        "Epochs to target vs batch size (flat = perfect scaling)",
        nothing=nothing,
        log_y=True,
        batches=batches_of(summaries),
    )


def _width_panel(ax, summaries, field: str, slope_name: str, verdicts: dict) -> tuple[bool, bool]:
    """One panel of batch_vs_width.png: `field` (b_crit or b_model_free) of every member against its
    width, one colour per architecture, and the architecture's slope line. A censored value is an
    open marker with an arrow to the axes' edge. Returns (anything drawn, any censored value)."""
    drawn = bound = False
    for i, arch in enumerate(sorted({s.info.arch for s in summaries})):
        col = f"C{i}"
        mine = [
            s
            for s in summaries
            if s.info.arch == arch
            and isinstance(s.info.width, (int, float))
            and s.curve is not None
            and getattr(s.curve, field) is not None
        ]
        for s in mine:
            iv = getattr(s.curve, field)
            w, v = float(s.info.width), _clipped(iv)
            side = bound_side(s.curve, field)
            if side is not None:
                draw_bound(ax, w, v, side, col)
                bound = True
            else:
                lo = max(iv.low, iv.range_lo / 2) if iv.low is not None else v
                hi = min(iv.high, iv.range_hi * 2) if iv.high is not None else v
                # Clipped at 0: with one batch per member (a predict study) the range is a point
                # and the clipped ends can fall on the wrong side of the value.
                err = [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]
                ax.errorbar([w], [v], yerr=err, fmt="o", color=col, capsize=4)
            ax.annotate(
                f"depth {s.info.depth}",
                (w, v),
                fontsize=7,
                textcoords="offset points",
                xytext=(6, 4),
                gid="depth-label",
            )
            drawn = True
        sl = getattr(verdicts[arch].decision, slope_name) if verdicts.get(arch) else None
        if sl is not None and mine:
            ws = np.array([float(s.info.width) for s in mine])
            pts = np.log([_clipped(getattr(s.curve, field)) for s in mine])
            c0 = pts.mean() - sl.value * np.log(ws).mean()
            g = np.geomspace(ws.min(), ws.max(), 20)
            ax.plot(
                g,
                np.exp(c0 + sl.value * np.log(g)),
                "--",
                color=col,
                alpha=0.6,
                label=f"{arch}: slope {sl.value:+.2f} [{sl.low:+.2f}, {sl.high:+.2f}]",
            )
    return drawn, bound


def plot_batch_vs_width(summaries, outdir, eps, verdicts) -> Plot:
    """B_crit and B_x(1+eps) against width with 95% intervals; censored values (beyond the batches
    tried, or B_x(1+eps) never crossed inside them) are open markers at the range edge with an
    arrow to the axes' edge; the slope across members in the legend."""
    fig = Figure(figsize=(11.5, 4.6))
    axes = fig.subplots(1, 2)
    panels = (
        ("b_crit", "B_crit (examples per step)", "Critical batch size B_crit", "b_crit_slope"),
        (
            "b_model_free",
            f"{bx_name(eps)} (examples per step)",
            f"{bx_name(eps)}: the batch where epochs to target reach x{1 + eps:g}",
            "model_free_slope",
        ),
    )
    for ax, (field, ylabel, title, slope_name) in zip(axes, panels):
        drawn, bound = _width_panel(ax, summaries, field, slope_name, verdicts)
        if drawn:
            _plain_log_axis(ax, "x")
            _plain_log_axis(ax, "y")
            width_ticks(ax, summaries)
        else:
            _no_data(ax, "undefined for every member (see the tables)")
        ax.set_xlabel(width_label(summaries))
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if bound:
            ax.plot(
                [],
                [],
                "k^",
                markerfacecolor="none",
                linestyle="none",
                label="censored: only a bound (the true value lies along the arrow)",
            )
        legend_outside(ax, below=True, fontsize=7)
    separate_labels(fig)
    return _save(
        fig,
        outdir,
        "batch_vs_width.png",
        f"B_crit and {bx_name(eps)} vs width, with 95% intervals (open markers with arrows: "
        "censored, only a bound)",
    )


def _chosen_rate_accuracy(s, records) -> list[tuple[int, float, float, float]]:
    """(batch, median, lowest, highest) over seeds of the final test accuracy at each cell's
    chosen rate (the runs that observe the cell)."""
    out = []
    for c in s.cells:
        if c.best_multiplier is None:
            continue
        accs = [
            float(r["final"]["test_accuracy"])
            for r in records
            if r.get("member") == s.info.name
            and int(r.get("batch_size", 0)) == c.batch_size
            and lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == c.best_multiplier
            and r.get("status") != "diverged"
            and (r.get("final") or {}).get("test_accuracy") is not None
        ]
        if accs:
            out.append((c.batch_size, float(np.median(accs)), min(accs), max(accs)))
    return out


def plot_test_accuracy(summaries, records, colors, outdir) -> Plot:
    """Test accuracy at the end of the chosen rate's runs vs batch: the median over seeds, the
    seeds' range as a band (the spread one seed to the next, so that noise is not read as a
    trend)."""
    fig, ax = _figure()
    drawn = False
    for s, col in zip(summaries, colors):
        pts = _chosen_rate_accuracy(s, records)
        if pts:
            b, med, lo, hi = map(np.array, zip(*pts))
            ax.plot(b, med, "o-", color=col, label=_label(s), markersize=4)
            ax.fill_between(b, lo, hi, color=col, alpha=0.15, linewidth=0)
            drawn = True
    if drawn:
        ax.fill_between([], [], [], color="0.5", alpha=0.3, label="range over seeds")
    return _finish_batch_plot(
        fig,
        ax,
        outdir,
        "test_accuracy_vs_batch.png",
        "Test accuracy at the chosen learning rate vs batch size (median and range over seeds)",
        "final test accuracy (fraction; median over seeds, band: range)",
        "Test accuracy at the chosen learning rate vs batch size",
        nothing=None if drawn else "no test accuracy recorded at a chosen rate",
        log_y=False,
        batches=batches_of(summaries),
    )


def plot_learning_rate(summaries, colors, outdir, nothing) -> Plot:
    """The chosen learning rate vs batch, with the cells at the edge of their grid ringed."""
    fig, ax = _figure()
    edge_labelled = False
    for s, col in zip(summaries, colors):
        pts = [
            (c.batch_size, c.learning_rate, c.lr_at_grid_edge)
            for c in s.cells
            if c.learning_rate is not None
        ]
        if not pts:
            continue
        b, lr, _ = zip(*pts)
        ax.plot(b, lr, "o-", color=col, label=_label(s))
        eb = [(bi, li) for bi, li, ei in pts if ei]
        if eb:
            ax.plot(
                *zip(*eb),
                "o",
                markersize=13,
                markerfacecolor="none",
                markeredgecolor="red",
                label=None if edge_labelled else "at the edge of the LR grid",
            )
            edge_labelled = True
    return _finish_batch_plot(
        fig,
        ax,
        outdir,
        "learning_rate_vs_batch.png",
        "Chosen learning rate vs batch size",
        "chosen peak learning rate",
        "Learning rate that reaches the target in the fewest steps",
        nothing=nothing,
        log_y=True,
        batches=batches_of(summaries),
    )


def make_plots(
    summaries, records, eps: float, target: str, outdir: str, verdicts: dict | None = None
) -> list[Plot]:
    """Writes the PNGs (and PDFs) into `outdir`; returns (file name, caption, PNG bytes) for
    each. The gradient statistics' figures are report/gradient_plots.py's."""
    if not summaries:
        return []
    colors = _colors(len(summaries))
    any_reached = any(c.median_steps is not None for s in summaries for c in s.cells)
    nothing = None if any_reached else NOTHING_REACHED
    plots = [
        plot_steps(summaries, colors, outdir, target, nothing),
        plot_epochs(summaries, colors, outdir, eps, nothing),
        plot_batch_vs_width(summaries, outdir, eps, verdicts or {}),
        plot_test_accuracy(summaries, records, colors, outdir),
        plot_learning_rate(summaries, colors, outdir, nothing),
    ]
    return plots
