"""Owns what a failed command shows: one line on stderr, `error: <the problem>; <the fix>`, and its
exit status (2 for a usage error: the command or the config; 1 for a runtime error: the machine,
the data, the workdir; 130 after Ctrl-C). `error_line` maps any exception to that line and status;
`parse_flags` does it for absl's and ml_collections' errors while the flags are parsed.

Nothing here imports TensorFlow at module level: the flags' errors come before it starts, and the
error classes of the modules that need it are looked up once an error has happened."""

from __future__ import annotations

import errno
import os
import re
import sys

from wide_tf.checks import loader, validate
from wide_tf.schema import families


def one_line(text) -> str:
    """The message of an exception as one line (ml_collections and TensorFlow write several)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Traceback", "File ", "Pass --help"))]
    return re.sub(r"\s+", " ", " ".join(lines[:3])).strip()[:600]


def fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


_HELP = ("-h", "--help", "-help", "--helpshort", "--helpfull", "--helpxml", "-?")


def _verbose_in(argv) -> bool:
    return any(
        a in ("--verbose", "-verbose", "--verbose=true", "--verbose=True", "--verbose=1")
        for a in argv
    )


def _config_spec(argv) -> str | None:
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        for prefix in ("--config=", "-config="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
        if arg in ("--config", "-config") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def parse_flags(argv, parse):
    """absl's flag parsing (`parse`: main's flags.FLAGS), with every error as one line (exit 2):
    the config file and variant, and the override paths, are checked first, with the closest
    valid name suggested."""
    verbose, config = _verbose_in(argv), None
    try:
        spec = _config_spec(argv)
        suite = any(a.startswith(("--suite=", "-suite=")) or a == "--suite" for a in argv)
        if spec is None and not suite and not any(a in _HELP for a in argv):
            raise validate.UsageError(
                "--config is required, e.g. --config=configs/mlp.py:local (configs/mlp.py, "
                "configs/wrn.py, configs/theory.py; the variant follows the colon), or "
                "--suite=configs/answer.py"
            )
        if spec is not None:
            config = loader.load_config(spec)
            validate.check_overrides(config, validate.override_paths(argv))
        return parse(argv)
    except validate.Problem as e:
        if verbose:
            raise
        fail(str(e), e.exit_code)
    except Exception as e:  # flags.Error, and ml_collections' errors while applying an override
        if verbose:
            raise
        fail(flag_error_line(e, config), 2)


def flag_error_line(e, config) -> str:
    """The line for an error raised while the flags are parsed (flags.Error, and ml_collections'
    errors while applying an override); `config` is the loaded config, or None."""
    message = one_line(e)
    if "is not supported for overriding" in message:
        field = re.search(r"field config\.(\S+) is", message)
        name = field.group(1) if field else "that field"
        message = (
            f"--config.{name}: this field cannot be set on the command line; change it in the "
            f"config file (or add a variant); lists are tuples, e.g. --config.sweep.seeds='(0,1)'"
        )
    return _type_hint(message.replace("FATAL Flags parsing error: ", ""), config)


def _type_hint(message: str, config) -> str:
    """Adds the type a --config.<field> value must have to ml_collections' parse error."""
    m = re.match(r"flag --config\.([\w.]+)=", message)
    if not m or config is None:
        return message
    value = config
    for part in m.group(1).split("."):
        try:
            value = value[part]
        except (KeyError, TypeError):
            return message
    kinds = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}
    kind = kinds.get(type(value))
    if kind is None:
        return message
    return f"{message}; --config.{m.group(1)} takes {kind}, e.g. --config.{m.group(1)}={value}"


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
    if isinstance(e, validate.Problem):  # (no TensorFlow needed; a failed worker's is one too)
        return one_line(e), e.exit_code
    usage_errors, runtime_errors, op_error = _error_classes()
    if isinstance(e, usage_errors):
        return one_line(e), 2
    if isinstance(e, runtime_errors):
        return one_line(e), 1
    if isinstance(e, op_error):
        return _tf_error_line(e), 1
    if isinstance(e, OSError):
        return f"{one_line(e)}; check the path and its permissions (--workdir, data.data_dir)", 1
    return (
        f"{type(e).__name__}: {one_line(e)} (unexpected: run the same command with --verbose "
        f"for the traceback, and report it)",
        1,
    )


def _error_classes():
    """(usage errors, runtime errors, TensorFlow's OpError): their classes live in modules that
    import TensorFlow, so they are looked up only once an error has happened."""
    import tensorflow as tf

    from wide_tf.engine import train
    from wide_tf.engine.tf import data, strategy
    from wide_tf.engine.tf import step as steps
    from wide_tf.report.protocol import ReportError
    from wide_tf.study import trials

    usage_errors = (
        families.FamilyError,
        trials.StudyError,
        train.ConfigError,
        steps.BatchSplitError,
        validate.UsageError,
    )
    runtime_errors = (
        data.DataUnavailableError,
        strategy.StrategyError,
        validate.RuntimeProblem,  # also a failed worker (study/workers.WorkerFailed)
        ReportError,  # the report at the end of a study (e.g. its lock held too long)
    )
    return usage_errors, runtime_errors, tf.errors.OpError


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
