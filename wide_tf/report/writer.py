"""Owns reading a study's workdir for its report and `write_report`, which writes every part of
the report, in order, into a fresh folder that `publish` swaps into WORKDIR/report/."""

from __future__ import annotations

import json
import os

import tensorflow as tf

from wide_tf.analysis import equivalence, frozen, verdict
from wide_tf.report import prediction_section, publish
from wide_tf.report.gradient_plots import gradient_plots
from wide_tf.report.markdown import render_markdown
from wide_tf.report.plots import make_plots
from wide_tf.report.protocol import (
    ReportError,
    eps_from_config,
    eps_problem,
    target_label,
)
from wide_tf.report.tables import (
    BEST_COLUMNS,
    MEMBER_COLUMNS,
    TRIAL_COLUMNS,
    best_rows,
    member_rows,
    trial_rows,
    write_csv,
)
from wide_tf.report.tensorboard import write_tensorboard
from wide_tf.store import workdir as wd

VERDICT = "verdict.txt"  # the verdict's headline sentence, one line per architecture


def read_workdir(workdir: str) -> tuple[dict | None, list[dict], int]:
    """(config dict or None, whole records, number of unreadable result records). A record that
    is not whole against schema/result_fields.py (a stub, one missing its numbers) is no finished
    trial: it is left out (see `read_workdir_partial`)."""
    config, records, bad, _ = read_workdir_partial(workdir)
    return config, records, bad


def read_workdir_partial(workdir: str) -> tuple[dict | None, list[dict], int, list[str]]:
    """`read_workdir`, and one 'trial_id (why)' per partial record left out."""
    if not tf.io.gfile.isdir(workdir):
        raise ReportError(f"workdir {workdir!r} does not exist or is not a directory")
    cfg_path = wd.join(workdir, wd.CONFIG)
    has_cfg = tf.io.gfile.exists(cfg_path)
    has_res = tf.io.gfile.isdir(wd.join(workdir, wd.RESULTS_DIR))
    if not has_cfg and not has_res:
        raise ReportError(f"{workdir!r} holds neither config.json nor results: not a study workdir")
    config = None
    if has_cfg:
        try:
            config = wd.read_json(cfg_path)
        except json.JSONDecodeError as e:
            raise ReportError(f"{cfg_path} is not valid JSON ({e})") from None
        except wd.NotARegularFile as e:
            raise ReportError(str(e)) from None
        if not isinstance(config, dict):
            raise ReportError(
                f"{cfg_path} holds {type(config).__name__}, not a study's settings (a JSON "
                f"object); restore it from the study, or remove it to report from the results alone"
            )
    records, bad, partial = [], 0, []
    if has_res:  # results/<trial_id>.json, through workdir.py
        found, bad = wd.read_results_counted(workdir)
        for r in found:  # the scheduler's own check: such a trial runs again
            why = wd.record_problem(r)
            if why:
                partial.append(f"{r['trial_id']} ({why})")
            else:
                records.append(r)
    return config, records, bad, partial


def write_report(workdir: str, eps: float | None = None) -> str:
    """Writes WORKDIR/report/ and returns the path of report.md. Raises ReportError on a bad
    workdir or eps, before anything is written.

    The whole report is written into a folder of this writer's own and swapped into place at the
    end (publish.py): a report killed half-way leaves the previous report (or none), never a torn
    one, and two writers at once leave one whole report, not two mixed."""
    if eps is not None and eps_problem(eps):
        raise ReportError(eps_problem(eps))
    config, records, n_bad, partial = read_workdir_partial(workdir)
    if eps is None and eps_problem(eps_from_config(config)):  # a hand-edited config.json
        raise ReportError(
            f"{wd.join(workdir, wd.CONFIG)}: {eps_problem(eps_from_config(config))}; fix it "
            f"there, or pass --eps"
        )
    eps = eps_from_config(config) if eps is None else float(eps)
    publish.refuse_link(wd.join(workdir, wd.REPORT))  # before any work: the swap refuses it too
    tmpdir = publish.new_tmpdir(workdir)
    try:
        _write_into(tmpdir, config, records, (n_bad, partial), eps, workdir)
        outdir = publish.publish(workdir, tmpdir)
    except BaseException:
        publish.discard(tmpdir)
        raise
    return os.path.join(outdir, "report.md")


def _write_into(
    outdir: str, config, records: list[dict], skipped, eps: float, workdir: str
) -> None:
    """Every file of the report, into `outdir`; report.md last. `skipped`: (unreadable records,
    partial ones); `workdir`: where the trials' curves are read for TensorBoard."""
    n_bad, partial = skipped
    result = verdict.analyze(records, eps, equivalence=frozen_equivalence(config, records))
    summaries = result["summaries"]
    write_csv(os.path.join(outdir, "all_trials.csv"), TRIAL_COLUMNS, trial_rows(records))
    write_csv(os.path.join(outdir, "best_per_batch.csv"), BEST_COLUMNS, best_rows(summaries))
    write_csv(os.path.join(outdir, "members.csv"), MEMBER_COLUMNS, member_rows(summaries, eps))
    plots = make_plots(summaries, records, eps, target_label(config), outdir, result["verdicts"])
    plots += gradient_plots(summaries, records, outdir) if summaries else []
    # The noise-scale prediction of B_crit: its section in report.md, its plot here.
    result["prediction"] = (
        prediction_section.compare_study(config, records, result) if records else None
    )
    if result["prediction"] is not None:
        pred_plot = prediction_section.plot_prediction(result["prediction"], outdir, eps)
        plots += [pred_plot] if pred_plot else []
        prediction_section.log_prediction(result["prediction"])
    tbdir = os.path.join(outdir, "tb")
    tb_written = (
        write_tensorboard(workdir, records, plots, tbdir, summaries, eps) if records else False
    )
    md = render_markdown(config, records, n_bad, result, plots, eps, tb_written, partial)
    heads = [
        (f"{a}: " if len(result["verdicts"]) > 1 else "") + v.headline
        for a, v in result["verdicts"].items()
    ]
    wd.write_text_atomic(os.path.join(outdir, VERDICT), "".join(h + "\n" for h in heads))
    wd.write_text_atomic(os.path.join(outdir, "report.md"), md)


def frozen_equivalence(config, records) -> equivalence.Equivalence | None:
    """The equivalence margin a frozen design stated for this study read alone, when every record
    carries its stamp (`wide_tf.analysis.frozen.study_equivalence`); None for an exploratory
    study, and for one study of a design read pooled with its replicates."""
    return equivalence.Equivalence.from_dict(frozen.study_equivalence(config, records))


def verdict_line(workdir: str) -> str:
    """The verdict's headline sentence(s) of the workdir's report (report/verdict.txt), for the
    console's last line after a study."""
    path = wd.join(workdir, wd.REPORT, VERDICT)
    if not tf.io.gfile.exists(path):
        return ""
    try:
        return wd.read_checked(path).decode("utf-8", errors="replace").strip()
    except wd.read_errors():
        return ""
