"""A study's report from its WORKDIR alone: report.md, CSV tables, PNG plots, TensorBoard HParams
and images, written into WORKDIR/report/.

Reads WORKDIR/config.json and WORKDIR/results/ (or a legacy results.jsonl) through tf.io.gfile (so
gs:// works). Never imports train.py: a report can be made on a laptop from a TPU study's bucket.

    python -m wide_tf.report --workdir=runs/mlp_local [--eps=0.25]

The package, one owner each:

    __init__     reading the workdir and `write_report`, which writes everything in order
    protocol     the protocol table and the settings the report takes from config.json
    tables       the CSV tables
    plots        the PNG figures, one function each
    tensorboard  HParams and the plots as images
    markdown     report.md, one function per section
    prediction   the section and plot of the noise-scale prediction, and its log lines
    agreement    a finished study's entry of docs/local_agreement.md (its own command line)
    __main__     the command line
"""

from __future__ import annotations

import json
import os

# The CLI's output should be the report path or one error line, not TensorFlow's C++ start-up log;
# setdefault leaves a user's own choice alone, and has no effect once TensorFlow is loaded.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from wide_tf.analysis import verdict as analysis  # noqa: E402
from wide_tf.report import prediction  # noqa: E402
from wide_tf.report.markdown import render_markdown  # noqa: E402
from wide_tf.report.plots import make_plots  # noqa: E402
from wide_tf.report.protocol import (  # noqa: E402
    eps_from_config,
    protocol_rows,
    target_label,
)
from wide_tf.report.tables import (  # noqa: E402
    BEST_COLUMNS,
    MEMBER_COLUMNS,
    TRIAL_COLUMNS,
    best_rows,
    member_rows,
    trial_rows,
    write_csv,
)
from wide_tf.report.tensorboard import METRIC_DOCS, write_tensorboard  # noqa: E402
from wide_tf.store import workdir as wd  # noqa: E402

__all__ = [
    "BEST_COLUMNS",
    "MEMBER_COLUMNS",
    "METRIC_DOCS",
    "REPORT_DIR",
    "TRIAL_COLUMNS",
    "ReportError",
    "best_rows",
    "eps_from_config",
    "make_plots",
    "member_rows",
    "protocol_rows",
    "read_workdir",
    "render_markdown",
    "trial_rows",
    "write_report",
    "write_tensorboard",
]

REPORT_DIR = wd.REPORT  # the workdir layout has one owner: wide_tf/workdir.py


class ReportError(RuntimeError):
    """The workdir cannot be reported on (missing, or holds no study)."""


def read_workdir(workdir: str) -> tuple[dict | None, list[dict], int]:
    """(config dict or None, records, number of unreadable result records)."""
    if not tf.io.gfile.isdir(workdir):
        raise ReportError(f"workdir {workdir!r} does not exist or is not a directory")
    cfg_path = wd.join(workdir, wd.CONFIG)
    has_cfg = tf.io.gfile.exists(cfg_path)
    has_res = tf.io.gfile.exists(wd.join(workdir, wd.RESULTS)) or tf.io.gfile.isdir(
        wd.join(workdir, wd.RESULTS_DIR)
    )
    if not has_cfg and not has_res:
        raise ReportError(f"{workdir!r} holds neither config.json nor results: not a study workdir")
    config = None
    if has_cfg:
        try:
            config = wd.read_json(cfg_path)
        except json.JSONDecodeError as e:
            raise ReportError(f"{cfg_path} is not valid JSON ({e})") from None
    records, bad = [], 0
    if has_res:  # results/<trial_id>.json (and a legacy results.jsonl), through workdir.py
        found, bad = wd.read_results_counted(workdir)
        records = [r for r in found if "member" in r and "batch_size" in r]
        bad += len(found) - len(records)
    return config, records, bad


def write_report(workdir: str, eps: float | None = None) -> str:
    """Writes WORKDIR/report/ and returns the path of report.md. Raises ReportError on a bad
    workdir.

    report.md is written last and atomically, like the CSV tables: a report killed half-way leaves
    the previous report.md (or none), never a torn one."""
    config, records, n_bad = read_workdir(workdir)
    eps = eps_from_config(config) if eps is None else float(eps)
    outdir = os.path.join(workdir, REPORT_DIR)
    tf.io.gfile.makedirs(outdir)
    result = analysis.analyze(records, eps)
    summaries = result["summaries"]
    write_csv(os.path.join(outdir, "all_trials.csv"), TRIAL_COLUMNS, trial_rows(records))
    write_csv(os.path.join(outdir, "best_per_batch.csv"), BEST_COLUMNS, best_rows(summaries))
    write_csv(os.path.join(outdir, "members.csv"), MEMBER_COLUMNS, member_rows(summaries, eps))
    plots = make_plots(summaries, records, eps, target_label(config), outdir, result["verdicts"])
    # The noise-scale prediction of B_crit (issue 18): its section in report.md, its plot here.
    result["prediction"] = prediction.compare_study(config, records, result) if records else None
    if result["prediction"] is not None:
        pred_plot = prediction.plot_prediction(result["prediction"], outdir)
        plots += [pred_plot] if pred_plot else []
        prediction.log_prediction(result["prediction"])
    tb_written = write_tensorboard(records, plots, os.path.join(outdir, "tb")) if records else False
    md = render_markdown(config, records, n_bad, result, plots, eps, tb_written)
    path = os.path.join(outdir, "report.md")
    wd.write_text_atomic(path, md)
    return path
