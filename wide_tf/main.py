"""Owns the command line: reads the absl flags (the only module that does), runs the checks, and
makes one call: a study, a single run, the theory check, or a suite of studies (`--suite`).

  python -m wide_tf.main --config=configs/mlp.py:local --workdir=runs/mlp_local

Bad input ends in one line on stderr (wide_tf/errors.py), with exit status 2 for a usage error and
1 for a runtime error; `--verbose` shows the traceback instead. The config, the overrides and the
workdir are checked (wide_tf/checks/validate.py) before TensorFlow is imported, and TensorFlow's
C++ start-up lines are kept out of the output (wide_tf/tf_start.py)."""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

# None of these imports TensorFlow: the modules that need it are imported once the checks pass.
from wide_tf import errors, tf_start
from wide_tf.checks import command_line, dry_run, validate
from wide_tf.engine import backend, preemption
from wide_tf.study import processes, worker

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file[:variant], e.g. configs/mlp.py:local; --config.a.b=value overrides a field (lists "
    "as tuples: '(8,16)'); your own model: --config.model.arch=pkg.module (docs/options.md).",
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
_TRIAL = flags.DEFINE_string("trial", None, "Run only this trial (id, or index in --list_trials).")
_LIST = flags.DEFINE_bool("list_trials", False, "Print the study's trials and exit.")
_NO_REPORT = flags.DEFINE_bool("no_report", False, "Do not write the report at the end.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Check the config (and --shard), exit before TensorFlow starts; writes nothing.",
)
_REPLICAS = flags.DEFINE_integer(
    "replicas",
    None,
    "With --dry_run: check the batches for a machine with this many replicas (4 on a v4-8, 8 on "
    "a v5litepod-8; launch_tpu.sh passes it) instead of this one.",
)
_ACCELERATOR = flags.DEFINE_string(
    "accelerator",
    None,
    "With --dry_run: also check the memory model against this accelerator (v4-8, v5e, a100-40gb, "
    "a GPU's CUDA name); exit status 3 when it does not fit.",
)
_SUITE = flags.DEFINE_string(
    "suite", None, "A suite of studies instead of --config (configs/answer.py): WORKDIR/<study>/."
)
_VERBOSE = flags.DEFINE_bool(
    "verbose", False, "On an error, show the Python traceback; also TensorFlow's start-up lines."
)


def _checks(config) -> list[str]:
    """Everything that can be checked before TensorFlow starts; returns warning lines."""
    flag = dict(dry_run=_DRY_RUN, workdir=_WORKDIR, shard=_SHARD, workers=_WORKERS, trial=_TRIAL)
    flag.update(listing=_LIST, accelerator=_ACCELERATOR, replicas=_REPLICAS)
    return validate.check_command(config, sys.argv, **{k: f.value for k, f in flag.items()})


def main(argv) -> None:
    if len(argv) > 1:
        errors.fail(f"unexpected arguments {argv[1:]}; flags take the form --name=value")
    config, verbose = _CONFIG.value, _VERBOSE.value
    if _SUITE.value is not None:
        sys.exit(_suite(verbose))
    try:
        warnings = _checks(config)  # once: the workers of --workers=N read what passed here
        if _DRY_RUN.value:  # its lines; exit status 3 when the memory does not fit
            sys.exit(dry_run.run(config, _REPLICAS.value, _ACCELERATOR.value))
    except validate.Problem as e:
        if verbose:
            raise
        errors.fail(str(e), e.exit_code)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr, flush=True)
    logging.get_absl_handler().addFilter(tf_start.DropCheckpointChatter())
    try:
        _run(config, verbose)
    except preemption.Preempted as e:
        logging.warning("%s", e)
        sys.exit(preemption.EXIT_CODE)
    except (Exception, KeyboardInterrupt) as e:  # every error is one line unless --verbose
        if verbose:
            raise
        errors.fail(*errors.error_line(e, config))


def _suite(verbose: bool) -> int:
    """--suite: each study in a child process (study/suite_runner.py), then the suite's table."""
    from wide_tf.study import suite_runner

    given = dict(config=_CONFIG, shard=_SHARD, trial=_TRIAL, list_trials=_LIST, dry_run=_DRY_RUN)
    given.update(workdir=_WORKDIR, workers=_WORKERS)
    try:
        code = suite_runner.command(_SUITE.value, {k: f.value for k, f in given.items()}, _log)
    except validate.Problem as e:
        if verbose:
            raise
        errors.fail(str(e), e.exit_code)
    if code == 0 and not _NO_REPORT.value and not _DRY_RUN.value:
        tf_start.import_tensorflow(verbose)
        from wide_tf.report import answer

        logging.info("Suite report: %s", answer.write_suite_report(_WORKDIR.value))
    return code


def _log(line: str) -> None:
    logging.info("%s", line)


def _run(config, verbose: bool) -> None:
    """The one call: the trials listed, the theory check, a single run, or a study (in this
    process or in --workers=N: study/processes.py)."""
    if _LIST.value:  # from the config alone, without TensorFlow
        from wide_tf.study import trials

        for i, t in enumerate(trials.list_trials(config)):
            print(f"{i:4d}  {t.trial_id}")
    elif config.get("kind", "study") == "theory" or not validate.is_sweep(config):
        # Deliberately late: TensorFlow starts only for a config that passed the checks, with
        # its C++ start-up lines filtered, and Keras on the config's backend.
        backend.select(config)  # KERAS_BACKEND, before Keras's import
        if backend.of(config) == "tensorflow":  # the JAX backend runs without TensorFlow
            tf_start.import_tensorflow(verbose)
        preemption.install()  # SIGTERM -> checkpoint after the current host loop, exit 143
        from wide_tf.engine import train
        from wide_tf.theory import runner

        if config.get("kind", "study") == "theory":
            runner.run_theory(config, _WORKDIR.value)
        else:  # one run in the workdir itself
            train.train_and_evaluate(config, _WORKDIR.value)
    else:  # its parent imports TensorFlow for the report alone, once every group is done
        ready = None if _NO_REPORT.value else lambda: tf_start.import_tensorflow(verbose)
        given = dict(n_workers=_WORKERS.value, shard=_SHARD.value, trial=_TRIAL.value)
        _finish(
            processes.run(
                config, _WORKDIR.value, **given, verbose=verbose, log=_log, on_complete=ready
            )
        )


def _finish(outcome) -> None:
    """A study's end: its report when due (TensorFlow imported here, for it alone; without
    TensorFlow, the verdict only), then its failure or exit status."""
    if outcome.report_due and not _NO_REPORT.value:
        from wide_tf.report import headline

        headline.conclude(_WORKDIR.value, _VERBOSE.value)
    if outcome.failure is not None:
        raise outcome.failure
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


def run() -> None:
    parent = os.environ.pop(worker.PARENT_ENV, None)  # a suite's study (study/suite_runner.py) dies
    if parent:  # with the suite, or exits now when the suite is already gone
        worker.die_with_parent(parent)
    app.run(main, flags_parser=_parse_flags)


def _parse_flags(argv):
    """The flags, or one `error:` line (checks/command_line.py) unless --verbose."""
    try:
        return command_line.parse_flags(argv, flags.FLAGS)
    except validate.Problem as e:
        if command_line.verbose_in(argv):
            raise
        errors.fail(str(e), e.exit_code)


if __name__ == "__main__":
    run()
