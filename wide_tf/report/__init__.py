"""A study's report from its WORKDIR alone: report.md, CSV tables, PNG plots, TensorBoard HParams
and images, written into WORKDIR/report/.

Reads WORKDIR/config.json and WORKDIR/results/ through tf.io.gfile (so gs:// works). Never imports
train.py: a report can be made on a laptop from a TPU study's bucket.

    python -m wide_tf.report --workdir=runs/mlp_local [--eps=0.25]

The package, one owner each:

    writer       reading the workdir and `write_report`, which writes everything in order
    publish      one writer at a time: the report's own folder, swapped into place under a lock
    protocol     the protocol table, the settings the report takes from config.json, ReportError
    tables       the CSV tables
    plots        the figures (PNG and PDF), one function each
    axes         the figures' ticks (every batch labelled, widths that never overlap), legends
    tensorboard  a session per (member, batch): its curves and HParams; the plots as images
    markdown     report.md, one function per section
    prediction   the section and plot of the noise-scale prediction, and its log lines
    agreement    a finished study's entry of docs/local_agreement.md (its own command line)
    __main__     the command line

This package's own names are lazy (PEP 562): `python -m wide_tf.report` imports it before
__main__, which checks its flags before TensorFlow starts (writer.py imports it).
"""

from __future__ import annotations

import importlib

# Each name of the package and the module that owns it.
_HOMES = {
    "BEST_COLUMNS": "tables",
    "MEMBER_COLUMNS": "tables",
    "TRIAL_COLUMNS": "tables",
    "best_rows": "tables",
    "member_rows": "tables",
    "trial_rows": "tables",
    "OUTCOME_DOCS": "tensorboard",
    "write_tensorboard": "tensorboard",
    "read_workdir": "writer",
    "write_report": "writer",
    "verdict_line": "writer",
    "ReportError": "protocol",
    "eps_from_config": "protocol",
    "protocol_rows": "protocol",
    "make_plots": "plots",
    "render_markdown": "markdown",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        module = importlib.import_module(f"{__name__}.{_HOMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
