"""Owns the report's command line: `python -m wide_tf.report --workdir=DIR [--eps=EPS]` prints the
path of report.md (exit 0), or one line `error: <problem>; <fix>` on stderr: exit 2 for bad usage
(a missing or unknown flag, a stray argument, an eps out of range), checked before TensorFlow
starts and before anything is written; exit 1 for a workdir that cannot be reported on.
`python -m wide_tf.report --claims WORKDIR...` prints the claims table
(`report/claims_table.py`)."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from wide_tf import tf_start
from wide_tf.report.protocol import ReportError, eps_problem
from wide_tf.schema.cli import UsageParser

PROG = "python -m wide_tf.report"
FIX_WORKDIR = "pass the workdir of a study, e.g. --workdir=runs/mlp_local"


def _eps(text: str) -> float:
    """An argparse type: the eps of B_x(1+eps), by the report's own rule (protocol.eps_problem)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    problem = eps_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem.replace(f"eps={value!r}", repr(text), 1))
    return value


def _fix_for(e: Exception) -> str:
    """The advice for an error whose message has none: another workdir only when the workdir is
    what is wrong, not when the disk is full or the report cannot be written."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that disk and run the same command again (the study is untouched)"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make the workdir writable and run the same command again"
    return FIX_WORKDIR


def _parser() -> UsageParser:
    p = UsageParser(prog=PROG, description="Write a study's report into WORKDIR/report/.")
    p.add_argument("--workdir", help="the study's workdir (a local path or gs://...)")
    p.add_argument(
        "--eps",
        type=_eps,
        help="eps of the model-free critical batch B_x(1+eps), in [0.001, 1000]; default: "
        "the config's, else 1.0",
    )
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--claims":  # the claims table (report/claims_table.py; no TensorFlow)
        from wide_tf.report import claims_table as claims

        return claims.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.workdir:
        parser.fail(f"--workdir is required; {FIX_WORKDIR}")
    if "://" not in args.workdir and not os.path.isdir(args.workdir):  # before TensorFlow (~15 s)
        print(
            f"error: workdir {args.workdir!r} does not exist or is not a directory; {FIX_WORKDIR}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    tf_start.import_tensorflow(verbose=False)  # only now: its start-up lines, filtered
    import tensorflow as tf

    from wide_tf.report import writer

    try:
        path = writer.write_report(args.workdir, args.eps)
    except (ReportError, tf.errors.OpError, OSError) as e:
        line = " ".join(str(e).split()) or type(e).__name__
        fix = "" if "; " in line else f"; {_fix_for(e)}"
        print(f"error: {line}{fix}", file=sys.stderr, flush=True)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
