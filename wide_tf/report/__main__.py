"""Owns the report's command line (absl flags, schema/cli.py): `python -m wide_tf.report
--workdir=DIR [--eps=EPS]` prints the path of report.md (exit 0), or one line `error: <problem>;
<fix>` on stderr: exit 2 for bad usage (a missing or unknown flag, a stray argument, an eps out of
range), checked before TensorFlow starts and before anything is written; exit 1 for a workdir that
cannot be reported on. `python -m wide_tf.report --claims WORKDIR...` prints the claims table
(`report/claims_table.py`)."""

from __future__ import annotations

import errno
import os
import sys

from absl import flags

from wide_tf import tf_start
from wide_tf.report.protocol import ReportError, eps_problem
from wide_tf.schema import cli

PROG = "python -m wide_tf.report"
FIX_WORKDIR = "pass the workdir of a study, e.g. --workdir=runs/mlp_local"
HELP = f"""\
Writes a study's report into WORKDIR/report/ (report.md, the figures, the CSV tables, the
TensorBoard events) and prints the path of report.md. A finished study's, or a running one's so far.

  {PROG} --workdir=runs/mlp_local
  {PROG} --workdir=gs://BUCKET/wrn --eps=0.25
  {PROG} --claims WORKDIR [WORKDIR ...]      (the claims table: --claims --help)

Exit status 0; 2 for bad flags (one `error:` line, before TensorFlow starts, nothing written); 1
for a workdir that cannot be reported on."""


def _eps(text) -> float:
    """The eps of B_x(1+eps), by the report's own rule (protocol.eps_problem)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    problem = eps_problem(value)
    if problem:
        raise ValueError(problem.replace(f"eps={value!r}", repr(text), 1))
    return value


_FLAGS = cli.flag_values()
flags.DEFINE_string(
    "workdir", None, "the study's workdir (a local path or gs://...)", flag_values=_FLAGS
)
flags.DEFINE(
    cli.Typed(_eps, "a finite number >= 0.001 and <= 1000"),
    "eps",
    None,
    "eps of the model-free critical batch B_x(1+eps), in [0.001, 1000]; default: the config's, "
    "else 1.0",
    flag_values=_FLAGS,
)


def _fix_for(e: Exception) -> str:
    """The advice for an error whose message has none: another workdir only when the workdir is
    what is wrong, not when the disk is full or the report cannot be written."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that disk and run the same command again (the study is untouched)"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make the workdir writable and run the same command again"
    return FIX_WORKDIR


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]); its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--claims":  # the claims table (report/claims_table.py; no TensorFlow)
        from wide_tf.report import claims_table as claims

        return claims.main(argv[1:])
    return cli.run(_report, _FLAGS, argv, prog=PROG, text=HELP)


def _report(argv) -> int:
    a = cli.values(_FLAGS)
    if not a.workdir:
        cli.fail(f"--workdir is required; {FIX_WORKDIR}")
    if "://" not in a.workdir and not os.path.isdir(a.workdir):  # before TensorFlow (~15 s)
        cli.fail(f"workdir {a.workdir!r} does not exist or is not a directory; {FIX_WORKDIR}", 1)
    tf_start.import_tensorflow(verbose=False)  # only now: its start-up lines, filtered
    import tensorflow as tf

    from wide_tf.report import writer

    try:
        path = writer.write_report(a.workdir, a.eps)
    except (ReportError, tf.errors.OpError, OSError) as e:
        line = " ".join(str(e).split()) or type(e).__name__
        fix = "" if "; " in line else f"; {_fix_for(e)}"
        cli.fail(f"{line}{fix}", 1)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
