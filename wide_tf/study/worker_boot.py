"""Owns a worker process's first instructions: it arranges to die with its parent before anything
else is imported (Linux: PR_SET_PDEATHSIG, SIGTERM), leaves at once when the parent is already
gone, and only then runs `wide_tf.main` as the worker. The parent of `--workers=N` starts each
worker as `python -m wide_tf.study.worker_boot <its own flags>`; a `--suite` starts each study so.

Nothing of wide_tf, absl or TensorFlow is imported before the death signal is set: a parent
killed (even by SIGKILL) at any moment after a worker's start leaves no worker behind."""

import os
import sys

PARENT_ENV = "WIDE_TF_PARENT_PID"


def die_with_parent() -> None:
    """SIGTERM this process when its parent dies; exit now when it already has."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG = 1, SIGTERM = 15
    except (OSError, AttributeError):  # not Linux: the parent's cleanup still stops workers
        pass
    parent = os.environ.get(PARENT_ENV)
    if parent and parent.isdigit() and os.getppid() != int(parent):
        # The parent died before the signal was set: this worker was re-parented.
        sys.exit(143)


def main() -> None:
    die_with_parent()
    import runpy

    sys.argv[0] = "wide_tf.main"
    runpy.run_module("wide_tf.main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
