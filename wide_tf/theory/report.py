"""Owns the theory check's write-up: the verdict paragraph computed from the slopes, theory.md,
theory.png and theory.csv, from the points and trends of `wide_tf.theory.bound`."""

from __future__ import annotations

import csv
import io
import math

import numpy as np

from wide_tf.theory import bound

AXES = {
    "width": "width",
    "depth": "depth",
    "budget": "depth at a fixed budget",
    "input_dim": "input dimension",
}


def _median_and_agreeing(summary: dict, sweep: str, label: str):
    """(the curve's median trend, the other statistics whose trend has the same word), or None."""
    t = summary.get(sweep, {}).get(label, {})
    m = t.get("median")
    if m is None:
        return None
    agree = [s for s in ("mean", "ratio") if t.get(s) is not None and t[s].word == m.word]
    return m, agree


def _curve_sentences(summary: dict, cfg) -> tuple[list[str], dict]:
    """One sentence per scored curve, and the width sweep's median trends by label."""
    parts, width_words = [], {}
    for sweep, label, _, _ in bound.scored_curves(cfg):
        got = _median_and_agreeing(summary, sweep, label)
        if got is None:
            continue
        m, agree = got
        others = [s for s in ("mean", "ratio") if s not in agree]
        if not others:
            note = "the mean and the ratio of expectations agree"
        elif not agree:
            note = "the mean and the ratio of expectations do not"
        else:
            names = bound.STAT_NAMES
            note = f"the {names[agree[0]]} agrees, the {names[others[0]]} does not"
        parts.append(f"{label}: with {AXES[sweep]} it {m.describe()}; {note}.")
        if sweep == "width":
            width_words[label] = m
    return parts, width_words


def _linear_sentence(lin: list, budget_lin) -> str:
    """What the linear networks say about the paper's theory (wider: larger bound; deeper at a
    fixed budget: smaller)."""
    if (
        lin
        and all(m.word == "grows" for m in lin)
        and budget_lin is not None
        and budget_lin.word == "falls"
    ):
        return (
            "For linear networks this agrees in direction with the paper's theory (wider: larger "
            "bound; deeper at a fixed budget: smaller)."
        )
    if lin and (
        any(m.word == "falls" for m in lin)
        or (budget_lin is not None and budget_lin.word == "grows")
    ):
        return "For linear networks this contradicts the paper's theory."
    return "For linear networks the paper's theory is not confirmed at this sample size."


def verdict(summary: dict, cfg) -> str:
    """One paragraph computed from the slopes (never hard-coded), with magnitudes. The median is
    the headline statistic: deep ReLU networks have heavy-tailed batch bounds whose mean is decided
    by a few draws; the mean and the ratio of expectations are reported beside it."""
    parts = [
        f"Median batch bound at initialisation (d = {cfg.input_dim} inputs, "
        f"n = {cfg.n_samples} examples):"
    ]
    sentences, width_words = _curve_sentences(summary, cfg)
    parts += sentences
    lin = [m for label, m in width_words.items() if "linear" in label]
    relu = [m for label, m in width_words.items() if "ReLU" in label]
    budget_lin = (summary.get("budget", {}).get(f"linear (~{int(cfg.budget):,} params)") or {}).get(
        "median"
    )
    dim_lin = (summary.get("input_dim", {}).get(bound.curve_label("linear", 2)) or {}).get("median")
    parts.append(_linear_sentence(lin, budget_lin))
    if relu:
        parts.append(
            f"For the 2-layer ReLU network (the paper's non-linear case) the median bound "
            f"{relu[0].word} with width."
        )
    if lin and dim_lin is not None:
        biggest = max(lin, key=lambda m: abs(math.log(m.fold)))
        parts.append(
            f"Magnitude: width changes the linear networks' bound by at most {biggest.fold:.2f}x "
            f"over a {biggest.x_range:g}x width range, while the input dimension changes the "
            f"2-layer linear bound by {dim_lin.fold:.2f}x over a {dim_lin.x_range:g}x range."
        )
    return " ".join(parts)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _design_lines(cfg) -> list[str]:
    return [
        "## Design",
        "",
        f"- input dimension d = {cfg.input_dim} (except in the input-dimension sweep), one output, "
        f"n = {cfg.n_samples} examples per draw, {cfg.n_inits} independent draws (teacher, data, "
        f"initialisation) per point, seed {cfg.seed}, label noise {cfg.get('label_noise', 0.0)};",
        f"- width sweep: widths {list(cfg.widths)} at depth 2 (linear and ReLU) and depth "
        f"{cfg.deep_depth} (linear); the parameter count grows with the width;",
        f"- depth sweep: depths {list(cfg.depths)} at width {cfg.fixed_width};",
        f"- fixed budget: P = d w + (L - 2) w^2 + w ~ {int(cfg.budget):,} parameters, width solved "
        f"per depth L in {list(cfg.depths)} (L = 2: the 2-layer network); deep ReLU networks are "
        f"beyond the paper's theory and shown for comparison;",
        f"- input-dimension sweep: d in {list(cfg.get('input_dims', []))} for 2-layer networks at "
        f"width {cfg.fixed_width} (the bound tracks d: a width effect must be read against it);",
        "- statistics per point: the median (headline: deep ReLU bounds are heavy-tailed), "
        "the mean (95% CI: mean +- 1.96 sd / sqrt(draws)) and the ratio of expectations "
        "n E[sum|g_i|^2] / E[|sum g_i|^2] (95% CI: bootstrap over draws);",
        f"- trends: the log-log slope of each statistic along the sweep, with a 95% bootstrap "
        f"interval ({bound.N_RESAMPLES} resamples of the draws within every point); "
        "'grows'/'falls' when the interval excludes 0; the fold change over the sweep's range "
        "gives the magnitude.",
        "",
    ]


def _slope_lines(summary: dict) -> list[str]:
    lines = [
        "## Slopes (log-log, 95% bootstrap intervals)",
        "",
        "| sweep | network | median | mean | ratio of expectations |",
        "|---|---|---|---|---|",
    ]
    for sweep, by_label in summary.items():
        for label, stats in by_label.items():
            cells = [
                (
                    "-"
                    if stats[s] is None
                    else f"{stats[s].slope:+.3f} [{stats[s].low:+.3f}, "
                    f"{stats[s].high:+.3f}], {stats[s].fold:.2f}x"
                )
                for s in bound.STATISTICS
            ]
            lines.append(f"| {sweep} | {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def _point_lines(sel: list[bound.Point], title: str) -> list[str]:
    """One sweep's table: every point with its three statistics and their intervals."""
    lines = [
        f"## {title}",
        "",
        "| network | depth L | width w | input d | params | median (95% CI) | mean (95% CI) "
        "| ratio of expectations (95% CI) |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for p in sel:
        r = p.row()
        lines.append(
            f"| {p.kind} | {p.depth} | {p.width} | {p.input_dim} | {p.params:,} | "
            f"{_fmt(r['batch_bound_median'])} [{_fmt(r['median_ci95_low'])}, "
            f"{_fmt(r['median_ci95_high'])}] | {_fmt(r['batch_bound_mean'])} "
            f"[{_fmt(r['ci95_low'])}, {_fmt(r['ci95_high'])}] | "
            f"{_fmt(r['ratio_of_expectations'])} [{_fmt(r['ratio_ci95_low'])}, "
            f"{_fmt(r['ratio_ci95_high'])}] |"
        )
    return lines + [""]


def render_markdown(points: list[bound.Point], cfg, summary: dict, elapsed_s: float) -> str:
    lines = [
        "# Theory check: batch bound at random initialisation",
        "",
        "Batch bound n * sum_i |g_i|^2 / |sum_i g_i|^2 (Yin et al. 2018) of bias-free "
        "fully-connected networks at random initialisation (LeCun normal for linear layers, "
        "He normal before a ReLU), with Gaussian inputs, a linear teacher y = beta.x and the "
        "squared loss; exact analytic per-example gradients, no training.",
        "",
    ]
    lines += _design_lines(cfg)
    lines += ["## Verdict", "", verdict(summary, cfg), ""]
    titles = {
        "width": "Width sweep at fixed depth",
        "depth": f"Depth sweep at width {cfg.fixed_width}",
        "budget": f"Fixed parameter budget (~{int(cfg.budget):,})",
        "input_dim": f"Input-dimension sweep (2-layer, width {cfg.fixed_width})",
    }
    lines += _slope_lines(summary)
    for sweep in ("width", "depth", "budget", "input_dim"):
        sel = [p for p in points if p.sweep == sweep]
        if sel:
            lines += _point_lines(sel, titles[sweep])
    lines += [f"Computed in {elapsed_s:.1f} s. Data: theory.csv; plot: theory.png.", ""]
    return "\n".join(lines)


def _plot_specs(cfg) -> list[tuple]:
    """(sweep, [(kind, depth or None)], x label, title) of each panel."""
    return [
        (
            "width",
            [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))],
            "width w",
            "fixed depth: width sweep",
        ),
        (
            "depth",
            [(k, None) for k in cfg.kinds],
            "depth L",
            f"fixed width {cfg.fixed_width}: depth sweep",
        ),
        (
            "budget",
            [(k, None) for k in cfg.kinds],
            "depth L (width solved for the budget)",
            f"fixed budget ~{int(cfg.budget):,} parameters",
        ),
        (
            "input_dim",
            [("linear", 2), ("relu", 2)],
            "input dimension d",
            f"2-layer, width {cfg.fixed_width}: input-dimension sweep",
        ),
    ]


def _draw_curves(ax, points: list[bound.Point], sweep: str, groups) -> None:
    """Each network's median (with its 95% interval) and mean along one sweep."""
    for gi, (kind, depth) in enumerate(groups):
        g = bound.curve_points(points, sweep, kind, depth)
        if not g:
            continue
        xs = [bound.x_value(p, sweep) for p in g]
        label = bound.curve_label(kind, depth) if depth is not None else kind
        med = np.array([p.median for p in g])
        lo = np.array([p.median_ci()[0] for p in g])
        hi = np.array([p.median_ci()[1] for p in g])
        line = ax.errorbar(
            xs, med, yerr=[med - lo, hi - med], marker="o", capsize=3, label=f"{label}: median"
        )
        ax.plot(
            xs,
            [p.mean for p in g],
            "x--",
            color=line[0].get_color(),
            alpha=0.6,
            label=f"{label}: mean",
        )
        if sweep == "budget" and gi == 0:  # the widths are the same for every kind
            for p, x in zip(g, xs):
                ax.annotate(
                    f"w={p.width}",
                    (x, p.median),
                    textcoords="offset points",
                    xytext=(3, 4),
                    fontsize=7,
                )


def render_plot(points: list[bound.Point], cfg) -> bytes:
    # Lazy: the theory's numbers need NumPy only (its tests import this module in a second);
    # matplotlib loads only to draw, with a file backend (no display on a TPU VM).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax, (sweep, groups, xlabel, title) in zip(axes, _plot_specs(cfg)):
        _draw_curves(ax, points, sweep, groups)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(fmt)
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(fmt)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("batch bound (median with 95% CI; mean)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Batch bound at random initialisation (n={cfg.n_samples}, {cfg.n_inits} draws per point)"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_csv(points: list[bound.Point]) -> str:
    buf = io.StringIO()
    rows = [p.row() for p in points]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
