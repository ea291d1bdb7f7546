"""Trains each member of a network family (deep and narrow to shallow and wide, at one budget) at
several batch sizes, the learning rate tuned per batch, and reports per member the largest batch
that trains in about as many epochs (B_x2; B_crit from a fit): does width raise it?

  python -m wide_tf.main --config=FILE[:VARIANT[:k=v,...]] --workdir=DIR [flags]
  python -m wide_tf.main --config=configs/mlp.py:smoke --workdir=runs/smoke     # seconds
  python -m wide_tf.main --config=configs/mlp.py:local:seeds=3 --print_config   # look first

A run writes into DIR: the trials and DIR/report/ (report.md, figures, tables, TensorBoard). The
same command again resumes a stopped study. Bad input is one line on stderr (exit status 2 for a
usage error, 1 for a runtime error; --verbose shows the traceback).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

# None of these imports TensorFlow: the modules that need it are imported once the checks pass.
from wide_tf import errors, tf_start
from wide_tf.analysis import frozen
from wide_tf.checks import command_line, dry_run, loader, usage, validate
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
    "shard", None, "Run shard i of n of the trials (--shard=0/2); shards may share one workdir."
)
_WORKERS = flags.DEFINE_string(
    "workers",
    None,
    "N processes on this machine, each pinned to its cores (or GPU), claiming (member, batch) "
    "groups as they free up. Default: one per CPU core or GPU, 1 on a TPU; 1 runs in this process.",
)
_CLUSTER = flags.DEFINE_string(
    "cluster", None, "Run on a Ray cluster: auto or HEAD:6379 (docs/tpu.md; pip: wide_tf[ray])."
)
_TRIAL = flags.DEFINE_string("trial", None, "Run only this trial (id, or index in --list_trials).")
_LIST = flags.DEFINE_bool("list_trials", False, "Print the trials and exit (reads no data).")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config and exit.")
_NO_REPORT = flags.DEFINE_bool("no_report", False, "Do not write the report at the end.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Check all, exit before TensorFlow; write nothing.")
_REPLICAS = flags.DEFINE_integer(
    "replicas", None, "With --dry_run: check for this many replicas (4 on a v4-8, 8 on a v5e-8)."
)
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "With --dry_run: check memory on this accelerator (v4-8, a100-40gb, ...)."
)
_SUITE = flags.DEFINE_string(
    "suite", None, "A suite of studies instead of --config (configs/answer.py): WORKDIR/<study>/."
)
_FROZEN = flags.DEFINE_string(
    "frozen", None, "A frozen design: run only its config (default: configs/frozen/, if there)."
)
_VERBOSE = flags.DEFINE_bool("verbose", False, "On an error, show the traceback; TF's start lines.")


def _checks(config) -> list[str]:
    """Everything that can be checked before TensorFlow starts; returns warning lines."""
    flag = dict(dry_run=_DRY_RUN, workdir=_WORKDIR, shard=_SHARD, workers=_WORKERS, trial=_TRIAL)
    flag.update(listing=_LIST, accelerator=_ACCELERATOR, replicas=_REPLICAS)
    validate.check_cluster(_CLUSTER.value, _WORKERS.value, _SHARD.value, _TRIAL.value)
    return validate.check_command(config, sys.argv, **{k: f.value for k, f in flag.items()})


def main(argv) -> None:
    if len(argv) > 1:
        errors.fail(f"unexpected arguments {argv[1:]}; flags take the form --name=value")
    config, verbose = _CONFIG.value, _VERBOSE.value
    if _PRINT_CONFIG.value and config is not None:
        print(usage.config_text(config), end="", flush=True)
        return
    if _SUITE.value is not None:
        sys.exit(_suite(verbose))
    with errors.problems_in_one_line(verbose):
        frozen.check_run(config, _FROZEN.value, sys.argv)  # a frozen study runs only as frozen
        warnings = _checks(config)  # once: the workers of --workers=N read what passed here
        if _DRY_RUN.value:  # its lines; exit status 3 when the memory does not fit
            sys.exit(dry_run.run(config, _REPLICAS.value, _ACCELERATOR.value))
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
    with errors.problems_in_one_line(verbose):
        code = suite_runner.command(_SUITE.value, {k: f.value for k, f in given.items()}, _log)
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
            train.train_and_evaluate(config, _WORKDIR.value, checked=True)
            print(f"Run written to {_WORKDIR.value} (result.json, TensorBoard events)", flush=True)
    elif _CLUSTER.value:  # a driver: the hosts of the cluster run the trials
        from wide_tf.cluster import ray_study

        _finish(ray_study.run(config, _WORKDIR.value, _CLUSTER.value, verbose, _log))
    else:  # its parent imports TensorFlow for the report alone, as the study's end nears
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
    sys.argv[:] = loader.with_found_config(sys.argv)  # configs/... from any folder
    mine = [flags.FLAGS[v.name] for v in globals().values() if isinstance(v, flags.FlagHolder)]
    usage.exit_on_help(sys.argv, __doc__, mine)  # --help: for users; --helpfull: absl's own
    parent = os.environ.pop(worker.PARENT_ENV, None)  # a suite's study (study/suite_runner.py) dies
    if parent:  # with the suite, or exits now when the suite is already gone
        worker.die_with_parent(parent)
    app.run(main, flags_parser=_parse_flags)


def _parse_flags(argv):
    """The flags, or one `error:` line (checks/command_line.py) unless --verbose."""
    with errors.problems_in_one_line(command_line.verbose_in(argv)):
        return command_line.parse_flags(argv, flags.FLAGS)


if __name__ == "__main__":
    run()
