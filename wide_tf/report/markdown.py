"""Owns report.md: one function per section (header and verdict, protocol, members, grid edges,
cells, plots, tables and TensorBoard, how to read), each returning its lines, and their assembly."""

from __future__ import annotations

import math

from wide_tf.analysis import cells, decision, frozen, members
from wide_tf.report import cost, prediction_section
from wide_tf.report.protocol import config_value, protocol_rows


def _f(v, fmt="{:.4g}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return fmt.format(v) if isinstance(v, float) else str(v)


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


_LEVEL = decision.HEAVIEST_LEVEL  # the check without the heaviest member

HOW_TO_READ = f"""\
## How to read this report

- **Cells.** Each (member, batch size) tried a grid of learning rates on the tuning seeds; the
  rate whose median over those seeds reached the target in the fewest steps was kept (the grid
  was extended past an edge that won, upwards when runs ran out of budget, downwards when they
  diverged, up to a cap the protocol table states) and re-run on the confirmation seeds. A cell's
  steps-to-target is the **median over its seeds** (the crossing of the target interpolated
  between the two evaluations around it); the range spans the seeds. A run that ran out of budget,
  or diverged at the chosen rate, is **censored** (S > its budget: a triangle in the plots), never
  given the budget as a value.
- **B_x(1+eps)**, the primary measure, is model-free: the batch at which epochs-to-target,
  interpolated in log-log between cells, first rises (1 + eps)-fold above the geometric mean of
  the two smallest batches' epochs (perfect scaling keeps epochs constant). A cell's epochs here
  are the geometric mean over its seeds (less noisy than the median the tables show), or the
  median where a seed is censored. At eps = 1 it is McCandlish et al.'s definition of the
  critical batch (epochs doubled) read off the data; Zhang et al. (2024) use eps = 0.2, about
  B_crit / 5 on the same curve. ">= B" means no crossing up to the largest batch tried B: a
  lower bound, drawn in the figures as an open marker with an arrow.
- **B_crit** comes from fitting S(B) = S_min (1 + B_crit / B) in log space to every seed, censored
  runs counted one-sidedly. Its fit is tested by a **lack-of-fit F test** (cell means against the
  seed-to-seed spread within cells; a small p says the curve misses the cells by more than seed
  noise, or the cells differ by more than their seeds: learning-rate luck). Intervals of both
  measures come from hierarchical replicates (a cell effect and seed noise, their variances drawn
  from their sampling distributions; bias-corrected percentiles). A value outside the batches
  tried is a bound ("> 176"), not a number.
- **The verdict** is a random-effects meta-regression of log B_x(1+eps) on log width across the
  members (on log depth in a depth family, whose width is constant; each member's own variance plus
  the members' scatter about the line; a Knapp-Hartung interval, its scale floored at 1, on members
  minus 2 degrees of freedom): *supported* when it lies above 0, *contradicted* below, *no
  detectable effect* when it holds 0 and the study was frozen with an equivalence margin that its
  interval's end lies inside (the design's simulated power >= 80% at a zero truth, size <= 5% at the
  margin), and *inconclusive* when it holds 0 otherwise, when the decisive direction rests on one
  member (a leave-one-out slope of the other sign), when the members other than the one of the
  highest leverage do not show it (their own slope's {_LEVEL:.0%} interval holds 0), when the B_crit
  slope (over the members whose B_crit lies inside the batches tried) points the other way, when a
  member whose value is a lower bound sits where its true value would pull the slope back to 0, or
  when a learning-rate cell is still at its grid's edge. A bound enters the slope at its bound,
  named; a member that fails the lack-of-fit test is named as a caveat. The power lines simulate
  this study's design at its own noise (the slope found 80% of the time, and how often a true slope
  equal to the observed one is decided); the overhead line gives the slope and its interval with k
  steps added to every run (a curve in k, not one "k that erases it"); the member it rests on is
  read by the rule's own check ({_LEVEL:.0%}), never by a verdict of its own without that member. On
  simulated studies, including ones whose curves differ from the fitted model, the rule's error
  rates are in docs/power_table.txt (`python -m wide_tf.analysis.simulate`).
"""


def _cell_steps(c) -> str:
    if c.median_steps is not None:
        rng = c.steps_range
        # The range at the median's precision: "23.9 (24-46)" read as a median below its range.
        spread = f" ({rng[0]:.1f}-{rng[1]:.1f})" if rng and c.n_seeds > 1 else ""
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


def fmt_b_x(cv) -> str:
    """B_x(1+eps) with its interval; one that never crossed inside the batches tried reads as the
    lower bound it is (">= 256"), not as "256 (95% CI 256 to 256)"."""
    iv = cv.b_model_free
    if cv.b_model_free_status == 1 and not iv.above_range:
        return (
            f">= {members.fmt_num(iv.range_hi)} (lower bound: no crossing up to the largest batch)"
        )
    return members.fmt_interval(iv)


def md_members(summaries, eps: float) -> list[str]:
    lines = [f"## Members: the critical batch, model-free (B_x{1 + eps:g}) and fitted (B_crit)", ""]
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
                fmt_b_x(cv)
                if cv and cv.b_model_free
                else f"- ({cv.b_model_free_reason if cv else 'no data'})",
                members.fmt_interval(cv.b_crit)
                if cv and cv.b_crit
                else f"- ({cv.fit_reason if cv else 'no data'})",
                members.fmt_interval(cv.s_min) if cv and cv.s_min else "-",
                "-" if s.lof_p is None else f"{s.lof_p:.3f}" + (" (fails)" if s.fails_lof else ""),
                _f(f.r2_log_epochs, "{:.2f}") if f else "-",
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
            f"B_x{1 + eps:g} (95% CI)",
            "B_crit (95% CI)",
            "S_min steps (95% CI)",
            "lack-of-fit p",
            "R^2 of log E (description)",
            "E_ref epochs",
            "runs fitted",
            "batch bound at init",
            "noise scale (EMA)",
        ],
        rows,
    )
    return lines + [""]


def md_transients(summaries, records) -> list[str]:
    """S_min against the optimizer's own ramp, so a reader can tell a slow problem from a slow
    start (momentum's 1 / (1 - m) steps)."""
    ramps = {r.get("momentum_ramp_steps") for r in records if "momentum_ramp_steps" in r}
    s_mins = [s.curve.s_min.value for s in summaries if s.curve and s.curve.s_min]
    if not s_mins or not ramps:
        return []
    lo = min(s_mins)
    if ramps == {None}:
        text = (
            f"S_min ranges from {lo:.0f} to {max(s_mins):.0f} steps; the optimizer has no "
            "momentum, so no momentum ramp enters the steps to target."
        )
    else:
        ramp = max(v for v in ramps if v is not None)
        text = (
            f"S_min ranges from {lo:.0f} to {max(s_mins):.0f} steps, {lo / ramp:.1f}x or more "
            f"the momentum ramp 1 / (1 - momentum) = {ramp:.0f} steps"
            + (
                "."
                if lo >= 10 * ramp
                else ": close enough that the ramp can shape the curve; compare a run with "
                "optim.momentum_warmup_steps or optim.name=nesterov."
            )
        )
    return ["## S_min against the optimizer's transient", "", text, ""]


def md_targets(per_target: dict) -> list[str]:
    """The verdict at every target the runs recorded (the same runs, learning rates chosen again
    per target)."""
    if len(per_target) < 2:
        return []
    rows = []
    for label, verdicts in per_target.items():
        for arch, v in verdicts.items():
            d = v.decision
            p, b = d.model_free_slope, d.b_crit_slope
            rows.append(
                [
                    label + (f" ({arch})" if len(verdicts) > 1 else ""),
                    v.outcome,
                    "-" if p is None else f"{p.value:+.2f} ({p.low:+.2f} to {p.high:+.2f})",
                    "-" if b is None else f"{b.value:+.2f} ({b.low:+.2f} to {b.high:+.2f})",
                    "; ".join(d.reasons) or "-",
                ]
            )
    head = [
        "target",
        "verdict",
        "B_x slope (95% CI)",
        "B_crit slope (95% CI)",
        "why inconclusive",
    ]
    intro = (
        "The same runs judged at each target the study recorded (the first is the study's "
        "target; learning rates are chosen again per target from the tuning runs)."
    )
    return ["## The verdict at every target", "", intro, ""] + _md_table(head, rows) + [""]


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


def _partial_note(partial) -> str:
    """The records that are not whole (schema/result_fields.py): left out; a re-run runs them."""
    if not partial:
        return ""
    more = f" and {len(partial) - 5} more" if len(partial) > 5 else ""
    return (
        f" {len(partial)} partial record(s) left out: {'; '.join(partial[:5])}{more} (the same "
        "command that ran the study runs their trials again)."
    )


def md_header(config, records, n_bad, verdicts, partial=()) -> list[str]:
    """The title, the question, the count of finished trials and the verdict."""
    name = config_value(config, "name") or config_value(config, "study") or ""
    counts = {s: sum(1 for r in records if r.get("status") == s) for s in cells.STATUSES}
    lines = [
        f"# Batch-size study report{': ' + str(name) if name else ''}",
        "",
        "Does a wider network (at a fixed parameter budget) train with larger batches before it "
        "needs more epochs? (Chen et al., NeurIPS 2018.)",
        "",
        f"Finished trials: {len(records)} ({counts['reached']} reached the target, "
        f"{counts['not_reached']} not reached, {counts['diverged']} diverged)."
        + (f" {n_bad} unreadable result record(s) were skipped." if n_bad else "")
        + _partial_note(partial),
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
        pdf = fname.rsplit(".", 1)[0] + ".pdf"
        lines += [
            f"- [{caption}]({fname}) (vector: [{pdf}]({pdf}))",
            "",
            f"![{caption}]({fname})",
            "",
        ]
    return lines


def md_tables(tb_written: bool) -> list[str]:
    """Links to the CSV tables, and how to open TensorBoard."""
    lines = [
        "## Tables and TensorBoard",
        "",
        "- [best_per_batch.csv](best_per_batch.csv): the chosen learning rate and seeds per "
        "(member, batch)",
        "- [all_trials.csv](all_trials.csv): every finished trial",
        "- [members.csv](members.csv): B_crit, S_min and B_x(1+eps) (columns b_x, b_x_low, "
        "b_x_high, b_x_censored) with 95% intervals, gradient statistics",
    ]
    if tb_written:
        lines.append(
            "- TensorBoard: `tensorboard --logdir=report/tb` (Time Series: one session per "
            "(member, batch) at its chosen rate, accuracy and loss of train, train_set and test "
            "overlaid, and again under examples/ against the training examples seen; HParams tab: "
            "one row per session, filtered and plotted by depth, width, batch and rate, Show "
            "Metrics reaches its curves; each member's <member>/member session holds its B_x and "
            "B_crit with their interval ends (member/ metrics); Images tab: these plots; every "
            "trial's curves: `tensorboard --logdir=trials`)"
        )
    else:
        lines.append(
            "- TensorBoard HParams not written: the `tensorboard` package is not installed."
        )
    return lines + [""]


def render_markdown(config, records, n_bad, result, plots, eps, tb_written, partial=()) -> str:
    """The whole of report.md. `partial`: one 'trial_id (why)' per record left out as not whole."""
    summaries = result["summaries"]
    lines = md_header(config, records, n_bad, result["verdicts"], partial)
    lines += [f"**Design:** {frozen.label(config, records)}.", ""]
    lines += md_protocol(config, records, eps)
    if records:
        lines += md_targets(result.get("per_target") or {})
        lines += md_members(summaries, eps)
        lines += md_transients(summaries, records)
        lines += md_edges(summaries)
        lines += md_cells(summaries)
        lines += prediction_section.md_prediction(result.get("prediction"), eps)
        lines += cost.md_time(records)
        lines += md_plots(plots)
        lines += md_tables(tb_written)
    return "\n".join(lines + [HOW_TO_READ])
