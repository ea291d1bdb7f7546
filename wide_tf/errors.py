"""Owns what a failed command shows: one line on stderr, `error: <the problem>; <the fix>`, and its
exit status. `error_line` maps any exception to that line and status by its base: a usage error
(schema/problems.UsageError, which every layer's usage errors subclass) exits 2, a runtime problem
(RuntimeProblem) 1, Ctrl-C 130; a full disk, a damaged checkpoint, an unreachable TPU,
TensorFlow's own errors and a path get their advice, anything else is named as unexpected (1).

Imports nothing above the lowest layer and never TensorFlow: TensorFlow's errors are recognised
only when TensorFlow is already loaded."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys

from wide_tf.schema.problems import Problem, one_line


def fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


@contextlib.contextmanager
def problems_in_one_line(verbose: bool):
    """A Problem raised inside ends the command in its one `error:` line and exit status (its
    traceback instead under --verbose)."""
    try:
        yield
    except Problem as e:
        if verbose:
            raise
        fail(str(e), e.exit_code)


def error_line(e: BaseException, config) -> tuple[str, int]:
    """The one line and the exit status for an error raised once the checks have passed (and
    TensorFlow has started): a damaged checkpoint, an unreachable TPU, the usage errors (2), the
    runtime errors, TensorFlow's own, a path, and anything unexpected (1)."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted; run the same command again to resume where it stopped", 130
    storage = _storage_cause(e)  # before the damaged checkpoint: a full disk is not damage
    if storage:
        return storage, 1
    damaged = _damaged_checkpoint(e)
    if damaged is not None:
        folder = os.path.dirname(damaged) if damaged else "the run's checkpoints/ folder"
        return (
            f"checkpoint {damaged or ''} cannot be read ({type(e).__name__}: {one_line(e)}): "
            f"it is damaged (truncated or partly copied); restore the files, or move {folder} "
            f"aside (kept, not read) and run the same command again to run that trial from the "
            f"start",
            1,
        )
    # TensorFlow's own TPU modules only: a bare "/tpu/" also matched any checkout in a folder
    # named tpu (every error then read as "cannot reach the TPU").
    if _raised_in(e, "/distribute/cluster_resolver/", "/tensorflow/python/tpu/"):
        return (
            f"cannot reach the TPU (runtime.tpu={config.runtime.tpu!r}; "
            f"{type(e).__name__}: {one_line(e)}); check --config.runtime.tpu (the TPU's name, "
            f"or 'local' on a TPU VM) and that this machine may reach it, or use "
            f"--config.runtime.strategy=auto",
            1,
        )
    if isinstance(e, Problem):  # every layer's usage errors and runtime problems subclass it
        return one_line(e), e.exit_code
    # An OpError means TensorFlow was loaded; a module another thread is still importing lacks
    # its attributes (the report's import runs beside a study's last groups: study/workers.py).
    op_error = getattr(getattr(sys.modules.get("tensorflow"), "errors", None), "OpError", None)
    if op_error is not None and isinstance(e, op_error):
        return _tf_error_line(e), 1
    if isinstance(e, OSError):
        return f"{one_line(e)}; check the path and its permissions (--workdir, data.data_dir)", 1
    return (
        f"{type(e).__name__}: {one_line(e)} (unexpected: run the same command with --verbose "
        f"for the traceback, and report it)",
        1,
    )


def _tf_error_line(e) -> str:
    message = one_line(getattr(e, "message", e))
    line = f"TensorFlow {type(e).__name__}: {message}"
    damaged = re.search(r"checkpoint|ckpt|\.index|DATA_LOSS|table file", message, re.IGNORECASE)
    if damaged or type(e).__name__ == "DataLossError":
        line += (
            "; a checkpoint in the workdir is damaged (truncated or partly copied): restore the "
            "files, or move that run's checkpoints/ folder aside (kept, not read) and run the "
            "same command again to run it from the start"
        )
    elif type(e).__name__ in ("PermissionDeniedError", "UnauthenticatedError"):
        line += "; check that this machine may write to --workdir (and read data.data_dir)"
    return line


_FULL = ("no space left on device", "disk quota exceeded", "enospc")


def _chain(e: BaseException):
    seen = []
    while e is not None and e not in seen and len(seen) < 10:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _storage_cause(e) -> str:
    """The line for a full disk, or for a folder removed while a save wrote into it; '' for
    anything else. Neither is damage: the run's checkpoints stay, and a re-run resumes."""
    for x in _chain(e):
        text = one_line(getattr(x, "message", x))
        if getattr(x, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
            w in text.lower() for w in _FULL
        ):
            return (
                f"the disk (or quota) holding the workdir is full ({type(x).__name__}: {text}); "
                "free space elsewhere (keep the run's checkpoints/: they are whole and resumable)"
                " and run the same command again to resume"
            )
    for x in _chain(e):
        missing = isinstance(x, FileNotFoundError) or type(x).__name__ == "NotFoundError"
        if missing and _raised_in_function(x, ("save", "write")):
            return (
                f"a file or folder of the workdir disappeared while it was being written "
                f"({type(x).__name__}: {one_line(getattr(x, 'message', x))}): something removed "
                "it (a cleanup, another command?); stop that, then run the same command again: "
                "the run resumes from its last whole checkpoint"
            )
    return ""


def _raised_in_function(e, words) -> bool:
    """True when a function of `e`'s traceback has one of `words` in its name."""
    tb = e.__traceback__
    while tb is not None:
        if any(w in tb.tb_frame.f_code.co_name.lower() for w in words):
            return True
        tb = tb.tb_next
    return False


def _damaged_checkpoint(e) -> str | None:
    """The path of the checkpoint that `e` was raised reading, or '' if unknown; None when `e` did
    not come from reading a checkpoint (a truncated file raises anything from IndexError to
    DataLossError there)."""
    path = getattr(e, "checkpoint_path", "")  # set by engine/restore.py when every one failed
    tb, found = e.__traceback__, bool(path)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/checkpoint/" in name or "checkpoint_reader" in name or "checkpoint_management" in name:
            found = True
            save_path = tb.tb_frame.f_locals.get("save_path")
            if isinstance(save_path, (str, bytes)) and not path:
                path = save_path.decode() if isinstance(save_path, bytes) else save_path
        tb = tb.tb_next
    return path if found else None


def _raised_in(e, *parts) -> bool:
    """True when a frame of `e`'s traceback is in a file whose path holds one of `parts`."""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if any(p in name for p in parts):
            return True
        tb = tb.tb_next
    return False
