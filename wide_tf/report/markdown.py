"""Owns report.md: one function per section (header and verdict, protocol, members, grid edges,
cells, plots, tables and TensorBoard, how to read), each returning its lines, and their assembly."""

from __future__ import annotations

import math

from wide_tf import analysis
from wide_tf.report import prediction
from wide_tf.report.protocol import config_value, protocol_rows


def _f(v, fmt="{:.4g}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return fmt.format(v) if isinstance(v, float) else str(v)


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


HOW_TO_READ = """\
## How to read this report

- **Cells.** Each (member, batch size) tried a grid of learning rates on the tuning seed; the
  rate that reached the target in the fewest steps was kept (the grid was extended past an edge
  that won, upwards when runs ran out of budget, downwards when they diverged) and re-run on the
  confirmation seeds. A cell's steps-to-target is the **median over its seeds** (the crossing of
  the target interpolated between the two evaluations around it); the range spans the seeds. A run
  that ran out of budget is **censored** (S > its budget: a triangle in the plots), never given the
  budget as a value; a diverged run is excluded and counted.
- **B_crit** comes from fitting S(B) = S_min (1 + B_crit / B) in log space to every seed, censored
  runs included one-sidedly. Its 95% interval is a two-level bootstrap (cell effects and seeds
  within cells). A B_crit outside the batches tried is a bound ("> 1,024"), not a number. The fit
  quality is R^2 of log *epochs*-to-target, which has no trivial trend and fails (low or negative)
  when the curve does not have the knee shape.
- **max_batch(eps)** is where the median epochs-to-target curve, interpolated in log-log, first
  rises above (1 + eps) x E_ref (E_ref: the smallest batch's epochs), with its bootstrap interval;
  "> B" means no crossing up to the largest batch tried.
- **The verdict** is the slope of log B_crit against log width across the members, with a 95%
  bootstrap interval: *supported* when it lies above 0, *contradicted* below, *no detectable effect*
  when it holds 0. The minimum detectable slope (2.8 standard errors) says how large an effect this
  study could have seen. Values beyond the batches tried count at the range edge, which can only
  shrink a slope. On simulated studies with a known answer the rule is decisive in at most 10% of
  studies without an effect (`python -m wide_tf.simulate`; the README has the table).
"""


def _cell_steps(c) -> str:
    if c.median_steps is not None:
        rng = c.steps_range
        spread = f" ({rng[0]:.0f}-{rng[1]:.0f})" if rng and c.n_seeds > 1 else ""
        return f"{c.median_steps:.1f}{spread}"
    if c.censored_bound is not None:
        return f"> {c.censored_bound:.0f} (censored)"
    return "-"


def _cell_epochs(c) -> str:
    if c.median_steps is not None:
        rng = c.steps_range
        spread = (
            f" ({c.epochs(rng[0]):.3g}-{c.epochs(rng[1]):.3g})" if rng and c.n_seeds > 1 else ""
        )
        return f"{c.epochs_to_target:.3g}{spread}"
    if c.censored_bound is not None and c.num_train:
        return f"> {c.epochs(c.censored_bound):.3g}"
    return "-"


def md_members(summaries, eps: float) -> list[str]:
    lines = [
        f"## Members: critical batch size and largest batch without slow-down (eps = {eps:g})",
        "",
    ]
    rows = []
    for s in summaries:
        cv = s.curve
        f = cv.fit if cv else None
        rows.append(
            [
                s.info.name,
                _f(s.info.depth),
                _f(s.info.width),
                f"{s.info.params:,}" if s.info.params else "-",
                analysis.fmt_interval(cv.b_crit)
                if cv and cv.b_crit
                else f"- ({cv.fit_reason if cv else 'no data'})",
                analysis.fmt_interval(cv.s_min) if cv and cv.s_min else "-",
                _f(f.r2_log_epochs, "{:.2f}") if f else "-",
                analysis.fmt_interval(cv.max_batch)
                if cv and cv.max_batch
                else f"- ({cv.max_batch_reason if cv else 'no data'})",
                _f(cv.reference_epochs, "{:.3g}") if cv else "-",
                (f"{f.n_obs} ({f.n_censored} censored)" if f else "-"),
                _f(s.batch_bound_init),
                _f(s.noise_scale_ema),
            ]
        )
    lines += _md_table(
        [
            "member",
            "depth",
            "width",
            "params",
            "B_crit (95% CI)",
            "S_min steps (95% CI)",
            "fit R^2 (log E)",
            f"max_batch({eps:g}) (95% CI)",
            "E_ref epochs",
            "runs fitted",
            "batch bound at init",
            "noise scale (EMA)",
        ],
        rows,
    )
    return lines + [""]


def md_cells(summaries) -> list[str]:
    lines = ["## Best learning rate and seeds per batch size", ""]
    for s in summaries:
        lines += [f"### {s.info.name}", ""]
        rows = []
        for c in s.cells:
            lr = (
                "-"
                if c.learning_rate is None
                else f"{_f(c.learning_rate)} (x{c.best_multiplier:g})"
            )
            rows.append(
                [
                    c.batch_size,
                    lr + (" (edge)" if c.lr_at_grid_edge else ""),
                    " ".join(f"{p.multiplier:g}" for p in c.grid),
                    c.n_seeds,
                    _cell_steps(c),
                    _cell_epochs(c),
                    f"{c.n_reached} / {c.n_not_reached} / {c.n_diverged}",
                    _f(c.best_test_accuracy_any_lr, "{:.4f}"),
                ]
            )
        lines += _md_table(
            [
                "batch",
                "chosen LR (multiplier)",
                "multipliers tried",
                "seeds",
                "steps to target: median (seed range)",
                "epochs to target",
                "trials reached / not reached / diverged",
                "best test acc.",
            ],
            rows,
        )
        lines.append("")
    return lines


def md_edges(summaries) -> list[str]:
    edges = [(s.info.name, c) for s in summaries for c in s.edge_cells]
    lines = ["## Grid-edge warnings", ""]
    if edges:
        for m, c in edges:
            lines.append(
                f"- {m}, B={c.batch_size}: chosen multiplier x{c.best_multiplier:g} is at the "
                f"edge of the grid tried ({', '.join(f'x{p.multiplier:g}' for p in c.grid)}), "
                "after extension: its steps are an upper bound."
            )
    else:
        lines.append("None: every chosen learning rate has a tried learning rate on each side.")
    return lines + [""]


def md_header(config, records, n_bad, verdicts) -> list[str]:
    """The title, the question, the count of finished trials and the verdict."""
    name = config_value(config, "name") or config_value(config, "study") or ""
    counts = {s: sum(1 for r in records if r.get("status") == s) for s in analysis.STATUSES}
    lines = [
        f"# Batch-size study report{': ' + str(name) if name else ''}",
        "",
        "Does a wider network (at a fixed parameter budget) train with larger batches before it "
        "needs more epochs? (Chen et al., NeurIPS 2018.)",
        "",
        f"Finished trials: {len(records)} ({counts['reached']} reached the target, "
        f"{counts['not_reached']} not reached, {counts['diverged']} diverged)."
        + (f" {n_bad} unreadable result record(s) were skipped." if n_bad else ""),
        "",
        "## Verdict",
        "",
    ]
    if not records:
        return lines + ["No trials finished yet. Re-run the report when trials have finished.", ""]
    for arch, v in verdicts.items():
        if len(verdicts) > 1:
            lines.append(f"**{arch}**: ")
        lines += [v.text, ""]
    return lines


def md_protocol(config, records, eps: float) -> list[str]:
    rows = [[k, str(v).replace("|", "\\|")] for k, v in protocol_rows(config, records, eps)]
    intro = (
        "How the trials ran, from the settings each trial recorded in its result.json (a setting "
        "where trials differ says so); then the study's design, from config.json."
    )
    return ["## Protocol", "", intro, ""] + _md_table(["setting", "value"], rows) + [""]


def md_plots(plots) -> list[str]:
    lines = ["## Plots", ""]
    for fname, caption, _ in plots:
        lines += [f"- [{caption}]({fname})", "", f"![{caption}]({fname})", ""]
    return lines


def md_tables(tb_written: bool) -> list[str]:
    """Links to the CSV tables, and how to open TensorBoard."""
    lines = [
        "## Tables and TensorBoard",
        "",
        "- [best_per_batch.csv](best_per_batch.csv): the chosen learning rate and seeds per "
        "(member, batch)",
        "- [all_trials.csv](all_trials.csv): every finished trial",
        "- [members.csv](members.csv): B_crit, S_min, max_batch with 95% intervals, gradient "
        "statistics",
    ]
    if tb_written:
        lines.append(
            "- TensorBoard: `tensorboard --logdir=report/tb` (HParams tab: one row per trial; "
            "Images tab: these plots)"
        )
    else:
        lines.append(
            "- TensorBoard HParams not written: the `tensorboard` package is not installed."
        )
    return lines + [""]


def render_markdown(config, records, n_bad, result, plots, eps, tb_written) -> str:
    """The whole of report.md."""
    summaries = result["summaries"]
    lines = md_header(config, records, n_bad, result["verdicts"])
    lines += md_protocol(config, records, eps)
    if records:
        lines += md_members(summaries, eps)
        lines += md_edges(summaries)
        lines += md_cells(summaries)
        lines += prediction.md_prediction(result.get("prediction"))
        lines += md_plots(plots)
        lines += md_tables(tb_written)
    return "\n".join(lines + [HOW_TO_READ])
