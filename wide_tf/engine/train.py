"""Owns the set-up of one training run (its checks, plan, backend and Controller: `setup`) and the
engine's public entry points, which the study, main, the report and the tests import from here
(train_and_evaluate: one run, resumed from its checkpoint, its result record;
train_and_evaluate_cohort: several runs of one cell trained together, engine/cohort.py)."""

from __future__ import annotations

import time

from absl import logging

from wide_tf.engine import arrays, backend, compile_key, loop, timing
from wide_tf.engine import cohort as cohort_lib
from wide_tf.engine.models import build_model
from wide_tf.engine.state import BatchPlan, RunPlan
from wide_tf.engine.summaries import MetricsWriter
from wide_tf.engine.targets import Targets
from wide_tf.schema import rules
from wide_tf.schema.problems import UsageError
from wide_tf.store import workdir as wd

__all__ = [
    "ConfigError",
    "clear_cache",
    "setup",
    "train_and_evaluate",
    "train_and_evaluate_cohort",
]


class ConfigError(UsageError):
    """A run's config asks for something that cannot be done; the message says what to change."""


def _check(config, info) -> None:
    """The config checks' cross-field rules (schema/rules.py), on this run's training set, for a
    run started without the command line (which checks them once per study); the batch's split
    over the replicas is checked once they are known (BatchPlan, below)."""
    try:
        rules.check(config, info.num_train, replicas=None)
    except rules.RuleError as e:
        raise ConfigError(str(e)) from None


def setup_runtime(runtime_cfg, backend_name: str = "tensorflow"):
    """The runtime of this process's backend: TensorFlow's strategy (engine/tf/strategy.py) or
    JAX's local devices (engine/jax/run.py); each folder is imported only for its backend."""
    return backend.load(backend_name).setup_runtime(runtime_cfg)


def runtime_for(config):
    return setup_runtime(config.runtime, backend.of(config))


def clear_cache() -> None:
    """Drops the kept model and compiled functions of whichever backend ran here."""
    for module in backend.loaded():
        module.clear_cache()


def setup(config, workdir: str, runtime, trial: dict | None = None, checked: bool = False):
    """One run set up: its plan (RunPlan), its backend (the registry's, engine/backend.py:
    engine/tf/run.py on TensorFlow, engine/jax/run.py on JAX: Trainer, Evaluator, Checkpointer
    around the kept build) and the shared Controller that drives them (engine/loop.py). Returns
    (controller, backend). `checked`: the command line has run the cross-field rules on the
    study's config already."""
    trial = trial or {}
    started = time.perf_counter()
    info = arrays.dataset_info(config.data)
    if not checked:
        _check(config, info)
    backend_run = backend.load(backend.of(config))
    cap = backend_run.device_cap(config, runtime)
    chief = backend_run.is_chief(runtime)
    batch_plan = BatchPlan.make(config.train.global_batch, runtime.num_replicas, cap)
    _check_ghost_batch(config, batch_plan)
    plan = RunPlan.make(
        config, trial.get("trial_id", "run"), info.num_train, batch_plan.global_batch
    )
    metrics = MetricsWriter(workdir, chief, plan.name, write_log=_log)
    run_backend = backend_run.make(
        config, workdir, runtime, info, batch_plan, plan, new_model, chief, metrics.log
    )
    targets = Targets(config, plan.batch, info.num_train, metrics.log)
    record = {"config": config, "trial": trial, "workdir": workdir, "chief": chief}
    controller = loop.Controller(
        run_backend.trainer,
        run_backend.evaluator,
        run_backend.checkpointer,
        plan,
        targets,
        metrics,
        record,
    )
    run_backend.trainer.setup_s = time.perf_counter() - started  # into the account at restore
    return controller, run_backend


def new_model(config, info):
    """A fresh keras.Model of config.model for this data set. Through this module's
    `build_model` (looked up at each call), which tests/study/test_study.py replaces to see every
    model a study builds."""
    m = config.model
    return build_model(
        m.arch,
        m.depth,
        m.width,
        info.num_classes,
        info.input_shape,
        norm=m.norm,
        ghost_batch_size=m.ghost_batch_size,
    )


def _log(message: str, *args, warning: bool = False, debug: bool = False) -> None:
    """Writes one of the run's log lines (all of them, the loop's too, through MetricsWriter.log):
    from here, so that absl's prefix names train.py, as it did before the run was split into
    modules (tests/checks/test_errors.py looks for it in a run's output)."""
    (logging.warning if warning else logging.debug if debug else logging.info)(message, *args)


def _check_ghost_batch(config, plan) -> None:
    ghost = config.model.ghost_batch_size
    if config.model.norm == "ghost" and plan.micro_batch % ghost:
        # Also a batch smaller than the ghost size: the virtual batch is never shrunk, since
        # its statistics would then depend on the number of replicas (and micro-batches).
        raise ConfigError(
            f"ghost batch norm needs each per-replica (micro-)batch to be a multiple of "
            f"model.ghost_batch_size={ghost}, but it is {plan.micro_batch} (global batch "
            f"{plan.global_batch} over {plan.num_replicas} replica(s) x "
            f"{plan.num_micro_batches} micro-batch(es)); lower model.ghost_batch_size (to a "
            f"divisor of {plan.micro_batch}) "
            f"or raise the batch"
        )


def train_and_evaluate(
    config, workdir: str, runtime=None, trial: dict | None = None, checked: bool = False
) -> dict:
    """Trains one model as `config` says, in `workdir`; resumes from its last checkpoint; returns
    (and writes) result.json. A finished run is not repeated. `checked`: the command line has run
    the cross-field rules (once per study); else they run here, once for this run."""
    timing.mark("trial")
    result_path = wd.join(workdir, wd.RESULT)
    if wd.exists(result_path):
        logging.info("Run in %s already finished; reading its result.", workdir)
        result = wd.read_json(result_path)
    else:
        wd.makedirs(workdir)
        controller, _ = setup(config, workdir, runtime or runtime_for(config), trial, checked)
        result = controller.run()
    timing.mark("trial_end")
    return result


def train_and_evaluate_cohort(
    configs: list, workdirs: list, runtime=None, trials: list | None = None, checked: bool = False
) -> list[dict]:
    """train_and_evaluate for several runs of one (member, batch) cell, trained together: each
    run's Controller, Evaluator, Checkpointer and record are its own, its training calls one
    shared call of the backend's cohort (engine/cohort.py; runtime.cohort needs the JAX backend).
    Returns the result records in the order of `configs`. A finished run is read, not repeated;
    runs whose programs differ (engine/compile_key.py's key) train in cohorts of their own, one
    after another; a cohort of one run trains alone."""
    trials = trials or [None] * len(configs)
    results: list = [None] * len(configs)
    todo = []
    for i, workdir in enumerate(workdirs):
        result_path = wd.join(workdir, wd.RESULT)
        if wd.exists(result_path):
            logging.info("Run in %s already finished; reading its result.", workdir)
            results[i] = wd.read_json(result_path)
        else:
            todo.append(i)
    groups: list[list[int]] = []
    for i in todo:  # consecutive runs of one compiled program share a cohort
        key = compile_key.config_key(configs[i])
        if groups and compile_key.config_key(configs[groups[-1][0]]) == key:
            groups[-1].append(i)
        else:
            groups.append([i])
    for group in groups:
        if len(group) == 1:
            i = group[0]
            results[i] = train_and_evaluate(configs[i], workdirs[i], runtime, trials[i], checked)
            continue
        runtime = runtime or runtime_for(configs[group[0]])
        shared = backend.cohort(backend.of(configs[group[0]]))
        controllers, trainers = [], []
        for i in group:
            timing.mark("trial")
            wd.makedirs(workdirs[i])
            controller, run_backend = setup(configs[i], workdirs[i], runtime, trials[i], checked)
            controllers.append(controller)
            trainers.append(run_backend.trainer)
        records = cohort_lib.run(controllers, trainers, shared.make(trainers))
        for i, record in zip(group, records):
            results[i] = record
            timing.mark("trial_end")
    return results
