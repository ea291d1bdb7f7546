"""Owns the command line: reads the absl flags (the only module that does) and starts a study,
a single run or the theory check.

  python -m wide_tf.main --config=configs/mlp.py:local --workdir=runs/mlp_local
"""

from __future__ import annotations

import logging as std_logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

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
_TRIAL = flags.DEFINE_string("trial", None, "Run only this trial (its id or its index in --list_trials).")
_LIST = flags.DEFINE_bool("list_trials", False, "Print the study's trials and exit.")
_NO_REPORT = flags.DEFINE_bool("no_report", False, "Do not write the report at the end.")


class _DropCheckpointChatter(std_logging.Filter):
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Sharding callback duration")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv) -> None:
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}; flags take the form --name=value")
    config = _CONFIG.value
    # TensorFlow's checkpoint saver logs one INFO line per save through absl, between the progress lines.
    logging.get_absl_handler().addFilter(_DropCheckpointChatter())
    from wide_tf import data as data_lib
    from wide_tf import families, preemption, study, train
    from wide_tf.steps import BatchSplitError
    from wide_tf.strategy import StrategyError

    expected = (
        data_lib.DataUnavailableError,
        families.FamilyError,
        study.StudyError,
        train.ConfigError,
        BatchSplitError,
        StrategyError,
    )
    preemption.install()  # SIGTERM -> checkpoint after the current host loop, exit 143
    try:
        if _LIST.value:
            for i, t in enumerate(study.list_trials(config)):
                print(f"{i:4d}  {t.trial_id}")
            return
        if not _WORKDIR.value:
            _fail("--workdir is required (a local folder or gs://bucket/path)")
        kind = config.get("kind", "study")
        if kind == "theory":
            from wide_tf import theory

            theory.run_theory(config, _WORKDIR.value)
        elif kind == "study" and config.get("sweep") is not None and config.sweep.batch_sizes:
            study.run_study(
                config,
                _WORKDIR.value,
                shard=_SHARD.value,
                only_trial=_TRIAL.value,
                write_report=not _NO_REPORT.value,
            )
        elif kind == "study":  # no sweep: one run in the workdir itself
            train.train_and_evaluate(config, _WORKDIR.value)
        else:
            _fail(f"config.kind={kind!r}: choose 'study' or 'theory'")
    except preemption.Preempted as e:
        logging.warning("%s", e)
        sys.exit(preemption.EXIT_CODE)
    except expected as e:
        logging.error("%s", e)
        _fail(str(e))


def run() -> None:
    flags.mark_flag_as_required("config")
    app.run(main)


if __name__ == "__main__":
    run()
