"""Owns the report's command line: `python -m wide_tf.report --workdir=DIR [--eps=EPS]` prints the
path of report.md (exit 0), or one error line `report: ...` (exit 1 for a workdir that cannot be
reported on, 2 without --workdir)."""

from __future__ import annotations

import sys

import tensorflow as tf
from absl import app, flags

from wide_tf.report import ReportError, write_report

_WORKDIR = flags.DEFINE_string("workdir", None, "Study workdir (local path or gs://...).")
_EPS = flags.DEFINE_float(
    "eps", None, "eps of the model-free critical batch B_x(1+eps); default: the config's, else 1.0."
)


def _run(argv) -> int:
    del argv  # flags only
    if not _WORKDIR.value:
        sys.stderr.write("report: --workdir is required\n")
        return 2
    try:
        path = write_report(_WORKDIR.value, _EPS.value)
    except (ReportError, tf.errors.OpError) as e:
        sys.stderr.write(f"report: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    app.run(_run)
