"""Trains each member of a network family (deep and narrow to shallow and wide, at one parameter
budget) at several batch sizes, tunes the learning rate per batch, and reports per member the
largest batch that still trains in about as many epochs (B_x2; B_crit from a fit): does a wider
network take larger batches?

  python -m wide_tf.main --config=FILE[:VARIANT[:k=v,...]] --workdir=DIR [flags]
  python -m wide_tf.main --config=configs/mlp.py:smoke --workdir=runs/smoke     # seconds
  python -m wide_tf.main --config=configs/mlp.py:local:seeds=3 --print_config   # look first
  python -m wide_tf.main --suite=configs/answer.py --workdir=runs/answer         # several studies

A run writes into DIR: the trials, their TensorBoard events, and DIR/report/ (report.md, the
figures, CSV tables, report/tb for TensorBoard). An interrupted study resumes where it stopped
when run again with the same command. Bad input is one line on stderr (exit status 2 for a
usage error, 1 for a runtime error; --verbose shows the traceback).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

from absl import app, flags, logging
from ml_collections import config_flags

# None of these imports TensorFlow: the modules that need it are imported once the checks pass.
from wide_tf import errors, tf_start
from wide_tf.checks import dry_run, validate
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
_LIST = flags.DEFINE_bool(
    "list_trials", False, "Print the study's trials and exit (reads no data; needs no --workdir)."
)
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config",
    False,
    "Print the resolved config (the variant, its k=v arguments and every --config.a.b override "
    "applied) and exit; needs no --workdir.",
)
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
    if _PRINT_CONFIG.value and config is not None:
        print(config_text(config), end="", flush=True)
        return
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


def config_text(config, indent: int = 0) -> str:
    """The resolved config as YAML (every field; lists in brackets, text quoted), sorted by name:
    what a run of this command would run, to read or to diff."""
    out = []
    for key in sorted(config.keys()):
        value = config[key]
        if hasattr(value, "keys"):
            out.append(f"{' ' * indent}{key}:\n{config_text(value, indent + 2)}")
        else:
            out.append(f"{' ' * indent}{key}: {_yaml_value(value)}\n")
    return "".join(out)


def _yaml_value(v) -> str:
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    try:
        return json.dumps(v)
    except TypeError:
        return json.dumps(str(v))


def _usage_text() -> str:
    """--help for a user: what the command does, the configs beside this checkout or the current
    folder and each variant in one line, the variant arguments, then the flags."""
    from wide_tf.checks import loader

    lines = [__doc__.rstrip(), "", "Configs (FILE) and their variants (:VARIANT):"]
    for path in loader.config_files():
        try:
            module = loader.load_module(path)
        except Exception:  # noqa: BLE001  (a broken config file is listed, not fatal to --help)
            lines.append(f"  {path}  (does not load: --config={path} says why)")
            continue
        lines.append(f"  {path}")
        entries = loader.variant_lines(module)
        width = min(max((len(n) for n, _ in entries), default=0), 18)
        for name, text in entries:
            if len(name) > width:  # several names sharing an entry: the line under them
                lines += [f"    {name}", f"    {' ' * width}  {text}".rstrip()]
            else:
                lines.append(f"    {name:<{width}}  {text}".rstrip())
    lines += ["", "Variant arguments (after the variant, joined by ',' or ':'):"]
    lines += [f"    {k:<8}  {doc}" for k, doc in loader.VARIANT_ARGS.items()]
    lines += ["    a.b=v     any config field by its dotted path, e.g. train.max_epochs=20", ""]
    lines += [
        "Other commands:",
        "  python -m wide_tf.report --workdir=DIR           the report again (another --eps)",
        "  python -m wide_tf.analysis.simulate --help       a design's simulated power",
        "  python -m wide_tf.analysis.predict_study --help  a predict study against the sweep",
        "",
        "Flags (--helpfull: every flag, absl's own included):",
    ]
    for holder in _USER_FLAGS:
        flag = flags.FLAGS[holder.name]
        kind = "--[no]" if isinstance(flag.default, bool) else "--"
        lines.append(f"  {kind}{flag.name}")
        lines += [f"      {t}" for t in textwrap.wrap(flag.help, 92)]
    return "\n".join(lines) + "\n"


def _suite(verbose: bool) -> int:
    """--suite: each study in a child process (study/suite.py), then the suite's table."""
    from wide_tf.study import suite

    given = dict(config=_CONFIG, shard=_SHARD, trial=_TRIAL, list_trials=_LIST, dry_run=_DRY_RUN)
    given.update(workdir=_WORKDIR, workers=_WORKERS)
    try:
        code = suite.command(_SUITE.value, {k: f.value for k, f in given.items()}, _log)
    except validate.Problem as e:
        if verbose:
            raise
        errors.fail(str(e), e.exit_code)
    if code == 0 and not _NO_REPORT.value and not _DRY_RUN.value:
        tf_start.import_tensorflow(verbose)
        from wide_tf.report import suite as suite_report

        logging.info("Suite report: %s", suite_report.write_suite_report(_WORKDIR.value))
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
        from wide_tf.theory import check as theory_check

        if config.get("kind", "study") == "theory":
            theory_check.run_theory(config, _WORKDIR.value)
        else:  # one run in the workdir itself
            train.train_and_evaluate(config, _WORKDIR.value)
            print(
                f"Run written to {_WORKDIR.value}: result.json (its record), its TensorBoard "
                f"events (tensorboard --logdir={_WORKDIR.value})",
                flush=True,
            )
    else:  # its parent imports TensorFlow for the report alone, once every group is done
        from wide_tf.study import progress

        kept = progress.keep_log(_WORKDIR.value)
        if kept:
            logging.info("This command's log: %s", kept)
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


_USER_FLAGS = (
    _CONFIG,
    _WORKDIR,
    _PRINT_CONFIG,
    _LIST,
    _DRY_RUN,
    _WORKERS,
    _SHARD,
    _TRIAL,
    _SUITE,
    _NO_REPORT,
    _REPLICAS,
    _ACCELERATOR,
    _VERBOSE,
)
_USER_HELP = ("-h", "--help", "-help", "-?")  # --helpshort, --helpfull: absl's own listing


def run() -> None:
    if any(a in _USER_HELP for a in sys.argv[1:]):
        sys.stdout.write(_usage_text())
        sys.exit(0)
    parent = os.environ.pop(worker.PARENT_ENV, None)  # a suite's study (study/suite.py) dies
    if parent:  # with the suite, or exits now when the suite is already gone
        worker.die_with_parent(parent)
    app.run(main, flags_parser=lambda argv: errors.parse_flags(argv, flags.FLAGS))


if __name__ == "__main__":
    run()
