"""Owns the report's figures of the gradient-diversity batch bound: at initialisation against
width, and during training of each member's representative trial (`gradient_plots`: when the
trials measured it), drawn with plots.py's helpers."""

from __future__ import annotations

import numpy as np

from wide_tf.report.axes import legend_outside, width_ticks
from wide_tf.report.marks import width_label
from wide_tf.report.plots import Plot, _colors, _figure, _label, _log2_axis, _save
from wide_tf.study import lr_grid


def plot_batch_bound_vs_width(with_bb, outdir) -> Plot:
    """The gradient-diversity batch bound at initialisation against width, per architecture."""
    fig, ax = _figure()
    for i, arch in enumerate(sorted({s.info.arch for s in with_bb})):
        mine = [
            s for s in with_bb if s.info.arch == arch and isinstance(s.info.width, (int, float))
        ]
        if mine:
            ax.errorbar(
                [s.info.width for s in mine],
                [s.batch_bound_init for s in mine],
                yerr=[s.batch_bound_init_std for s in mine],
                fmt="o-",
                capsize=3,
                color=f"C{i}",
                label=f"{arch} family" if arch else "family",
            )
    _log2_axis(ax, "x")
    width_ticks(ax, with_bb)
    ax.set_yscale("log")
    ax.set_xlabel(width_label(with_bb))
    ax.set_ylabel("batch bound n x diversity at init (examples)")
    ax.set_title(
        "Gradient-diversity batch bound at initialisation vs width (mean +- std over trials)"
    )
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    return _save(fig, outdir, "batch_bound_vs_width.png", "Batch bound at initialisation vs width")


def _representative_trial(s, records):
    """The member's chosen-rate trial at its smallest batch (first seed), else any with history."""
    mine = [
        r
        for r in records
        if r["member"] == s.info.name and ((r.get("gradient") or {}).get("history"))
    ]
    for c in s.cells:
        if c.best_multiplier is None:
            continue
        chosen = [
            r
            for r in mine
            if r["batch_size"] == c.batch_size
            and lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == c.best_multiplier
        ]
        if chosen:
            return min(chosen, key=lambda r: r.get("seed") or 0)
    return min(mine, key=lambda r: (r["batch_size"], r.get("seed") or 0), default=None)


def _bound_history(s, records) -> tuple[dict | None, list[dict]]:
    """The member's representative trial and its batch-bound measurements, in training order."""
    rec = _representative_trial(s, records)
    hist = [
        h
        for h in ((rec or {}).get("gradient") or {}).get("history") or []
        if h.get("batch_bound") is not None and h.get("examples") is not None
    ]
    return rec, sorted(hist, key=lambda h: h["examples"])


def plot_batch_bound_over_training(summaries, records, colors, outdir) -> Plot | None:
    """The batch bound during training of each member's representative trial; None (no figure)
    when no such trial measured it more than once (at initialisation only: nothing to draw)."""
    histories = [_bound_history(s, records) for s in summaries]
    if not any(len(hist) > 1 for _, hist in histories):
        return None
    fig, ax = _figure()
    for s, col, (rec, hist) in zip(summaries, colors, histories):
        if hist:
            x = np.array([h["examples"] for h in hist], dtype=float)
            ax.plot(
                np.maximum(x, 1.0),
                [h["batch_bound"] for h in hist],
                "-",
                color=col,
                label=f"{_label(s)}, B={rec['batch_size']}",
            )
    smallest = min((c.batch_size for s in summaries for c in s.cells), default=1)
    ax.set_xscale("symlog", linthresh=max(1.0, float(smallest)))
    ax.set_yscale("log")
    ax.set_xlabel("training examples seen")
    ax.set_ylabel("batch bound n x diversity (examples)")
    ax.set_title("Batch bound during training (best-LR trial at the smallest batch, first seed)")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    return _save(fig, outdir, "batch_bound_over_training.png", "Batch bound during training")


def gradient_plots(summaries, records, outdir: str) -> list[Plot]:
    """The batch-bound figures, when the trials measured the bound (none otherwise)."""
    with_bb = [s for s in summaries if s.batch_bound_init is not None]
    if not with_bb:
        return []
    out = [plot_batch_bound_vs_width(with_bb, outdir)]
    over_training = plot_batch_bound_over_training(
        summaries, records, _colors(len(summaries)), outdir
    )
    return out + ([over_training] if over_training is not None else [])
