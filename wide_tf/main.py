"""Owns the command line: reads the absl flags (the only module that does), runs the checks, and
makes one call: a study, a single run or the theory check.

  python -m wide_tf.main --config=configs/mlp.py:local --workdir=runs/mlp_local

Bad input ends in one line on stderr (wide_tf/errors.py), with exit status 2 for a usage error and
1 for a runtime error; `--verbose` shows the traceback instead. The config, the overrides and the
workdir are checked (wide_tf/config/validate.py) before TensorFlow is imported, and TensorFlow's
C++ start-up lines are kept out of the output (wide_tf/tf_start.py).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

# None of these imports TensorFlow: the config is checked before TensorFlow starts, and the
# modules that need it are imported in _run() once the checks have passed.
from wide_tf import errors, tf_start
from wide_tf.config import validate
from wide_tf.study import workers

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file, with an optional variant after a colon: configs/mlp.py:local. "
    "Override any field with --config.a.b=value.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the study writes (local path or gs://).")
_SHARD = flags.DEFINE_string(
    "shard",
    None,
    "Run shard i of n of the study's trials: --shard=0/2. "
    "Shards may share one workdir; every trial runs exactly once.",
)
_WORKERS = flags.DEFINE_string(
    "workers",
    None,
    "Run the study in N processes on this machine, each pinned to its cores (or its GPU), which "
    "claim (member, batch size) groups as they become free. Default: one per CPU core, one per "
    "GPU on a GPU machine, 1 on a TPU. --workers=1 runs in this process. With --shard=i/n the "
    "workers share shard i's groups.",
)
_TRIAL = flags.DEFINE_string(
    "trial", None, "Run only this trial (its id or its index in --list_trials)."
)
_LIST = flags.DEFINE_bool("list_trials", False, "Print the study's trials and exit.")
_NO_REPORT = flags.DEFINE_bool("no_report", False, "Do not write the report at the end.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Check the config (and --shard) and exit before TensorFlow starts; nothing is written.",
)
_REPLICAS = flags.DEFINE_integer(
    "replicas",
    None,
    "With --dry_run: check the batches for a machine with this many replicas (4 on a v4-8, 8 on "
    "a v5litepod-8; launch_tpu.sh passes it) instead of this one.",
)
_VERBOSE = flags.DEFINE_bool(
    "verbose",
    False,
    "On an error, show the Python traceback; also show TensorFlow's start-up lines.",
)

<<<<<<< HEAD
=======
_HELP = ("-h", "--help", "-help", "--helpshort", "--helpfull", "--helpxml", "-?")


class _DropCheckpointChatter(std_logging.Filter):
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Sharding callback duration")


def _one_line(text) -> str:
    """The message of an exception as one line (ml_collections and TensorFlow write several)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Traceback", "File ", "Pass --help"))]
    return re.sub(r"\s+", " ", " ".join(lines[:3])).strip()[:600]


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


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


def _parse_flags(argv):
    """absl's flag parsing, with every error as one line (exit 2): the config file and variant,
    and the override paths, are checked first, with the closest valid name suggested."""
    verbose = _verbose_in(argv)
    config = None
    try:
        spec = _config_spec(argv)
        if spec is None and not any(a in _HELP for a in argv):
            raise validate.UsageError(
                "--config is required, e.g. --config=configs/mlp.py:local (configs/mlp.py, "
                "configs/wrn.py, configs/theory.py; the variant follows the colon)"
            )
        if spec is not None:
            config = configs_loader.load_config(spec)
            validate.check_overrides(config, validate.override_paths(argv))
        return flags.FLAGS(argv)
    except validate.Problem as e:
        if verbose:
            raise
        _fail(str(e), e.exit_code)
    except Exception as e:  # flags.Error, and ml_collections' errors while applying an override
        if verbose:
            raise
        message = _one_line(e)
        if "is not supported for overriding" in message:
            field = re.search(r"field config\.(\S+) is", message)
            name = field.group(1) if field else "that field"
            message = (
                f"--config.{name}: a list cannot be set on the command line; change it in the "
                f"config file (or add a variant)"
            )
        _fail(_type_hint(message.replace("FATAL Flags parsing error: ", ""), config), 2)


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


def _tf_noise(line: str, level: int) -> bool:
    """True for a C++ start-up line that TF_CPP_MIN_LOG_LEVEL=level means to hide but that
    TensorFlow writes before its logging honours it (oneDNN, cudart stub, CPU feature guard)."""
    m = re.match(r"^([IWEF])\d{4} [\d:.]+\s+\d+\s+\S+:\d+\]", line)
    if m:
        return "IWEF".index(m.group(1)) < level
    if line.startswith("WARNING: All log messages before absl::InitializeLog()"):
        return level >= 1
    return line.startswith("To enable the following instructions:") and level >= 1


def _import_tensorflow(verbose: bool) -> None:
    """Imports TensorFlow once, keeping its C++ start-up lines out of the output.

    If the user set TF_CPP_MIN_LOG_LEVEL it is kept. Otherwise it becomes 3 on a machine without a
    GPU (CUDA's 'failed call to cuInit' is an ERROR line there, and means nothing) and 2 elsewhere.
    The lines TensorFlow writes at import before its logging starts ignore the level; they are
    caught on file descriptor 2 during the import and only the ones the level keeps are shown."""
    if "tensorflow" in sys.modules or verbose:
        import tensorflow

        return
    if _USER_TF_LOG_LEVEL is None:
        from wide_tf.spec import hardware

        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2" if hardware.gpu_devices_present() else "3"
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        level = 0
    if level <= 0:
        import tensorflow

        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
            kept = [ln for ln in text.splitlines() if not _tf_noise(ln, level)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def _tf_error_line(e) -> str:
    message = _one_line(getattr(e, "message", e))
    line = f"TensorFlow {type(e).__name__}: {message}"
    damaged = re.search(r"checkpoint|ckpt|\.index|DATA_LOSS|table file", message, re.IGNORECASE)
    if damaged or type(e).__name__ == "DataLossError":
        line += (
            "; a checkpoint in the workdir is damaged (truncated or partly copied): delete that "
            "run's checkpoints/ folder to run it from the start, or restore the files"
        )
    elif type(e).__name__ in ("PermissionDeniedError", "UnauthenticatedError"):
        line += "; check that this machine may write to --workdir (and read data.data_dir)"
    return line


def _damaged_checkpoint(e) -> str | None:
    """The path of the checkpoint that `e` was raised reading, or '' if unknown; None when `e` did
    not come from reading a checkpoint (a truncated file raises anything from IndexError to
    DataLossError there)."""
    tb, found, path = e.__traceback__, False, ""
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

>>>>>>> h-spec

def _checks(config) -> list[str]:
    """Everything that can be checked before TensorFlow starts; returns warning lines."""
    if _REPLICAS.value is not None and not _DRY_RUN.value:
        raise validate.UsageError(
            "--replicas is for --dry_run (a check for another machine); add --dry_run, or "
            "drop --replicas: a run counts the replicas it is given"
        )
    validate.check_shard(_SHARD.value)
    if _DRY_RUN.value:  # the checks for the target machine
        with validate.for_target(_REPLICAS.value):
            validate.check_config(config, validate.override_paths(sys.argv))
        return []
    validate.check_workers(_WORKERS.value, config, _TRIAL.value, _WORKDIR.value)
    validate.check_config(config, validate.override_paths(sys.argv))
    if not _LIST.value and not _WORKDIR.value:
        raise validate.UsageError("--workdir is required (a local folder or gs://bucket/path)")
    if _LIST.value:
        return []
    return validate.design_warnings(config) + validate.check_workdir(config, _WORKDIR.value)


def _dry_run_line(config) -> str:
    """--dry_run: one line saying what was checked."""
    sweep = config.get("sweep")
    batches = list(sweep.batch_sizes) if validate.is_sweep(config) else None
    if config.get("kind", "study") == "theory":
        what = "the theory check"
    else:
        what = f"batches {batches}" if batches else f"batch {config.train.global_batch}"
        if config.model.norm == "ghost":
            what += f", ghost batch {config.model.ghost_batch_size}"
    n = _REPLICAS.value or 1
    return f"dry run: the config fits {n} replica(s): {what}; nothing was run"


def main(argv) -> None:
    if len(argv) > 1:
        errors.fail(f"unexpected arguments {argv[1:]}; flags take the form --name=value")
    config, verbose = _CONFIG.value, _VERBOSE.value
    try:
        warnings = _checks(config)
    except validate.Problem as e:
        if verbose:
            raise
        errors.fail(str(e), e.exit_code)
    if _DRY_RUN.value:
        print(_dry_run_line(config), flush=True)
        return
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr, flush=True)
    # A worker process of --workers=N takes its cores, GPU and thread counts before TensorFlow
    # starts (they cannot change afterwards).
    worker = workers.child_spec()
    if worker is not None:
        workers.pin_before_tensorflow(worker)
    # The parent of --workers=N starts its workers first, so that their start-up does not wait for
    # its own (TensorFlow's import); it then only watches them.
    one = _TRIAL.value is not None or _LIST.value or config.get("kind", "study") == "theory"
    one = one or not validate.is_sweep(config)
    n = 1 if worker is not None else workers.count_for(config, _WORKERS.value, _WORKDIR.value, one)
    started = workers.start(_WORKDIR.value, n, sys.argv, config) if n > 1 else None
    # Deliberately late: TensorFlow (imported by every module _run uses) starts only for a config
    # that passed the checks, and with its C++ start-up lines filtered.
    tf_start.import_tensorflow(verbose)
    if worker is not None:
        workers.set_tensorflow_threads(worker)
    logging.get_absl_handler().addFilter(tf_start.DropCheckpointChatter())
    from wide_tf.engine import preemption

    if started is None:  # (the parent of workers passes SIGTERM on to them instead)
        preemption.install()  # SIGTERM -> checkpoint after the current host loop, exit 143
    try:
        _run(config, worker, started)
    except preemption.Preempted as e:
        logging.warning("%s", e)
        sys.exit(preemption.EXIT_CODE)
    except (Exception, KeyboardInterrupt) as e:  # every error is one line unless --verbose
        if verbose:
            raise
        errors.fail(*errors.error_line(e, config))


def _run(config, worker, started) -> None:
    """The one call: the trials listed, the theory check, a single run, or a study (then its
    report, when the study says it is due)."""
    from wide_tf import report
    from wide_tf.engine import train
    from wide_tf.study import scheduler, trials
    from wide_tf.theory import check as theory

    if _LIST.value:
        for i, t in enumerate(trials.list_trials(config)):
            print(f"{i:4d}  {t.trial_id}")
    elif config.get("kind", "study") == "theory":
        theory.run_theory(config, _WORKDIR.value)
    elif not validate.is_sweep(config):  # one run in the workdir itself
        train.train_and_evaluate(config, _WORKDIR.value)
    else:
        outcome = scheduler.run(
            config,
            _WORKDIR.value,
            shard=_SHARD.value,
            only_trial=_TRIAL.value,
            worker=worker,
            started=started,
            log=lambda line: logging.info("%s", line),
        )
        if outcome.report_due and not _NO_REPORT.value:
            logging.info("Report: %s", report.write_report(_WORKDIR.value))
        if outcome.failure is not None:
            raise outcome.failure
        if outcome.exit_code:
            sys.exit(outcome.exit_code)


def run() -> None:
    app.run(main, flags_parser=lambda argv: errors.parse_flags(argv, flags.FLAGS))


if __name__ == "__main__":
    run()
