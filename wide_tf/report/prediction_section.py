"""Owns the report's section "Does the gradient noise scale predict the critical batch?" and its
plot (predicted against measured, log-log, with the diagonal), and its lines on the log. The
numbers come from `wide_tf.analysis.prediction`; this module only lays them out (docs/prediction.md
says how to read them). The section speaks of its own study only: what the prediction has been
worth on other studies is docs/local_agreement.md."""

from __future__ import annotations

import numpy as np
from absl import logging

from wide_tf.analysis import members
from wide_tf.analysis import prediction as pr
from wide_tf.report import plots as plots_lib

PLOT_FILE = "noise_scale_vs_b_crit.png"
PLOT_CAPTION = "Noise scale at the target vs measured critical batch"


def compare_study(config, records, result) -> pr.Comparison:
    """The prediction check of a study from `analysis.analyze`'s result."""
    verdicts = result.get("verdicts") or {}
    b_crit_slope = model_free_slope = None
    if len(verdicts) == 1:
        decision = next(iter(verdicts.values())).decision
        b_crit_slope, model_free_slope = decision.b_crit_slope, decision.model_free_slope
    return pr.compare(records, result["summaries"], config, b_crit_slope, model_free_slope)


def _err(center: float, e) -> tuple[float, float]:
    if e is None or e.low is None or e.high is None:
        return 0.0, 0.0
    return max(center - e.low, 0.0), max(e.high - center, 0.0)


def plot_prediction(c: pr.Comparison, outdir: str, eps: float = 1.0):
    """The plot (file name, caption, PNG bytes), or None when no member has both sides."""
    pts = [
        m for m in c.members if m.at_target is not None and m.b_crit is not None and m.b_crit.value
    ]
    if not pts:
        return None
    fig, ax = plots_lib._figure((6.5, 6))
    colors = plots_lib._colors(len(c.members))
    col = {m.name: colors[i] for i, m in enumerate(c.members)}
    xs, ys = [], []
    for m in pts:
        x, y = m.b_crit.value, m.at_target.value
        xerr = _err(x, pr.interval_estimate(m.b_crit))
        ax.errorbar(
            [x],
            [y],
            xerr=np.array([[xerr[0]], [xerr[1]]]),
            yerr=np.array([[v] for v in _err(y, m.at_target)]),
            fmt="o",
            color=col[m.name],
            capsize=3,
            label=f"{m.name} (width {m.width:g}): at target",
        )
        xs.append(x), ys.append(y)
        if m.run_average is not None:
            ax.plot([x], [m.run_average.value], "s", mfc="none", color=col[m.name])
            ys.append(m.run_average.value)
        if m.at_init is not None:  # the value at initialisation, to show how far it rises
            ax.plot([x], [m.at_init.value], "x", color=col[m.name])
            ys.append(m.at_init.value)
        if m.b_model_free is not None and m.b_model_free.value:
            ax.plot([m.b_model_free.value], [y], "^", mfc="none", color=col[m.name])
            xs.append(m.b_model_free.value)
    lo = min(xs + ys) / 3
    hi = max(xs + ys) * 3
    line = np.array([lo, hi])
    ax.plot(line, line, "k-", lw=1, label="predicted = measured")
    for f, style in ((2, "--"), (10, ":")):
        ax.plot(line, line * f, "k" + style, lw=0.7, label=f"x{f} and /{f}")
        ax.plot(line, line / f, "k" + style, lw=0.7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    plots_lib._plain_log_axis(ax, "x")
    plots_lib._plain_log_axis(ax, "y")
    ax.set_xlabel(f"measured B_crit (sweep fit, 95% CI; triangles: {plots_lib.bx_name(eps)})")
    ax.set_ylabel("B_simple at the target (95% CI over seeds); squares: run average; x: at init")
    ax.set_title("Does the gradient noise scale predict the critical batch?")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside: never on a point
    return plots_lib._save(fig, outdir, PLOT_FILE, PLOT_CAPTION)


def _ratio(e) -> str:
    return pr.fmt_est(e) if e is not None else "-"


METHOD = (
    "B_simple = tr(Sigma)/|G|^2 is measured exactly on the probe set (n x diversity - 1) along "
    "training, read at each run's target crossing (log-linear in steps between the two "
    "measurements around it) and averaged over the run, on the chosen learning rate's runs "
    "of each member's smallest batch. Values are geometric means over seeds with 95% t "
    "intervals; a ratio's interval combines the seeds' interval with the sweep's bootstrap "
    "interval. McCandlish et al. (2018) found B_simple within about 10x of the critical batch "
    "on ten tasks; Merrill et al. (2025) found it under the critical batch by orders of "
    "magnitude for Adam-trained language models."
)
HEADER = (
    "member",
    "width",
    "batch (runs)",
    "B_simple at init",
    "B_simple at target (predicted B_crit)",
    "B_simple run average",
    "two-batch estimate (final)",
    "measured B_crit",
    "B_x",
    "at target / B_crit",
    "at target / B_x",
    "run average / B_crit",
)
# A predict study measured one batch per member: nothing to compare with, so no such columns.
N_PREDICT_COLUMNS = 7


def _member_row(m) -> list:
    return [
        m.name,
        plots_lib._plain_numbers()(m.width, None) if m.width is not None else "-",
        f"{m.batch_size} ({len(m.runs)})" if m.batch_size else "-",
        pr.fmt_est(m.at_init),
        pr.fmt_est(m.at_target),
        pr.fmt_est(m.run_average),
        pr.fmt_est(m.two_batch),
        members.fmt_interval(m.b_crit),
        members.fmt_interval(m.b_model_free) if m.b_model_free is not None else "-",
        _ratio(m.ratio_b_crit),
        _ratio(m.ratio_model_free),
        _ratio(m.ratio_avg_b_crit),
    ]


def md_member_table(c: pr.Comparison, eps: float = 1.0) -> list[str]:
    """The table of predicted against measured, one row per member."""
    bx = plots_lib.bx_name(eps)
    header = [h.replace("B_x", bx) for h in HEADER]
    rows = [_member_row(m) for m in c.members]
    if not c.sweep:
        header, rows = header[:N_PREDICT_COLUMNS], [row[:N_PREDICT_COLUMNS] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]


def md_notes(c: pr.Comparison, eps: float = 1.0) -> list[str]:
    """The bullets under the table: slopes, extrapolated runs, missing values, the plot, cost."""
    lines = [
        f"- Width slope of log B_simple at the target (random effects over members): "
        f"{pr.fmt_slope(c.slope_predicted)}",
    ]
    if c.sweep:
        lines.append(
            f"- The sweep's width slope of log {plots_lib.bx_name(eps)} (the verdict's): "
            f"{pr.fmt_slope(c.slope_model_free)}; of log B_crit: {pr.fmt_slope(c.slope_measured)}"
        )
    n_ex = c.n_extrapolated
    if n_ex:
        lines.append(
            f"- {n_ex} run(s) ended after their last measurement: B_simple at the target was "
            "extrapolated from the last two (by at most one measurement interval)."
        )
    missing = [m.name for m in c.members if m.runs and all(r.at_target is None for r in m.runs)]
    if missing:
        lines.append(
            f"- No B_simple at the target for {', '.join(missing)}: the measurements do not reach "
            "the crossing; " + pr.cadence_fix(c)
        )
    if any(m.at_target is not None for m in c.members):
        lines += [f"- The plot: [{PLOT_CAPTION}]({PLOT_FILE})"] if c.sweep else []
    sp = c.spent
    lines.append(
        f"- This study's finished runs: {sp['runs']} runs, {sp['examples']:.3g} training examples "
        f"and {sp['probe_examples']:.3g} exact-probe examples (about 2 training examples each), "
        f"{sp['wall_s'] / 60:.1f} minutes of run time summed over runs; "
        "`python -m wide_tf.analysis.predict_study --config=<the study>` compares a predict "
        "study's plan with the full sweep's."
    )
    return lines


def md_prediction(c: pr.Comparison | None, eps: float = 1.0) -> list[str]:
    """The section's lines (nothing when there is no comparison)."""
    if c is None:
        return []
    lines = ["## Does the gradient noise scale predict the critical batch?", ""]
    lines += [pr.sentence(c), ""]
    if not c.has_history:
        return lines
    lines += [METHOD, ""] + md_member_table(c, eps) + [""] + md_notes(c, eps)
    return lines + [""]


def log_prediction(c: pr.Comparison) -> None:
    """The prediction on the log at the end of a study (a predict study has no other verdict).
    A study that measured no B_simple along training gets one debug line, not a line per member
    that reports nothing."""
    if not c.has_history:
        logging.debug("Noise-scale prediction: %s", pr.sentence(c))
        return
    logging.info("Noise-scale prediction: %s", pr.sentence(c))
    for m in c.members:
        if m.at_target is None:
            continue
        logging.info(
            "  %s (width %s): predicted B_crit (B_simple at target) %s; measured %s",
            m.name,
            m.width,
            pr.fmt_est(m.at_target),
            members.fmt_interval(m.b_crit) if m.b_crit is not None else "- (no sweep)",
        )
    if c.slope_predicted is not None:
        logging.info("  width slope of log B_simple: %s", pr.fmt_slope(c.slope_predicted))
