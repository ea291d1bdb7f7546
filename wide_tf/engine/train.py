"""Owns one training run's trainer (Run: its set-up, the step, the evaluations and the gradient
probe; the loop around them, with checkpoints and summaries, is engine/loop.py) and the engine's
public entry points, which the study, main, the report and the tests import from here."""

from __future__ import annotations

import math
import time

import numpy as np
import tensorflow as tf
from absl import logging

from wide_tf.engine import data as data_lib
from wide_tf.engine import evaluation, loop, reuse, timing
from wide_tf.engine import optim as optim_lib
from wide_tf.engine import strategy as strategy_lib
from wide_tf.engine.bn_stats import batch_norm_layers
from wide_tf.engine.measure import TwoBatchNoiseScale
from wide_tf.engine.models import build_model
from wide_tf.engine.result import describe_protocol, momentum_ramp_steps
from wide_tf.engine.reuse import clear_cache
from wide_tf.engine.state import RunState
from wide_tf.engine.steps import BatchPlan
from wide_tf.engine.strategy import Runtime, setup_runtime
from wide_tf.engine.summaries import MetricsWriter
from wide_tf.engine.targets import Targets, extra_targets, interpolated_crossing
from wide_tf.spec import plan as plan_lib
from wide_tf.spec import rules
from wide_tf.spec import targets as targets_lib
from wide_tf.store import workdir as wd

__all__ = [
    "ConfigError",
    "MetricsWriter",
    "Run",
    "RunState",
    "batch_norm_layers",
    "clear_cache",
    "describe_protocol",
    "extra_targets",
    "interpolated_crossing",
    "momentum_ramp_steps",
    "train_and_evaluate",
]

TARGET_METRICS = targets_lib.TARGET_METRICS


class ConfigError(ValueError):
    """A run's config asks for something that cannot be done; the message says what to change."""


def _budget_steps(t, n_train: int, batch: int) -> int:
    return plan_lib.budget_steps(
        max_steps=t.max_steps,
        max_epochs=t.max_epochs,
        min_steps=t.min_steps,
        num_train=n_train,
        batch=batch,
    )


def _check(config, info) -> None:
    """The config checks' cross-field rules (spec.rules), on this run's training set; the batch's
    split over the replicas is checked once they are known (BatchPlan, below)."""
    try:
        rules.check(config, info.num_train, replicas=None)
    except rules.RuleError as e:
        raise ConfigError(str(e)) from None


class Run:
    """One training run's trainer: `restore` its state, `train_until` the next evaluation,
    `evaluate`, `measure` the gradient; `run` hands it to the loop (engine/loop.py), which calls
    these, saves checkpoints, writes the summaries and the result.

    Set-up (data sizes, the batch plan, the budget and evaluation steps, the model, optimizer and
    compiled step, kept from the last run when they can be: see engine/reuse.py) happens here, in
    __init__."""

    def __init__(self, config, workdir: str, runtime: Runtime, trial: dict | None = None):
        self.config, self.workdir, self.runtime, self.trial = config, workdir, runtime, trial or {}
        started = time.perf_counter()
        t, strategy = config.train, runtime.strategy
        self.info = info = data_lib.dataset_info(config.data)
        _check(config, info)
        cap = strategy_lib.max_device_batch(config, runtime)  # a GPU default when 0
        self.plan = plan = BatchPlan.make(t.global_batch, runtime.num_replicas, cap)
        _check_ghost_batch(config, plan)
        self.batch = batch = plan.global_batch
        self.steps_per_epoch = info.num_train / batch
        self.total_steps = _budget_steps(t, info.num_train, batch)
        self.eval_every = t.eval_every_examples or info.num_train
        self.eval_steps = set(plan_lib.eval_steps(batch, self.eval_every, self.total_steps))
        self.name = self.trial.get("trial_id", "run")

        self.built = built = reuse.build(
            config, runtime, info, plan, self.steps_per_epoch, self.total_steps, new_model
        )
        self.model, self.optimizer, self.stepper = built.model, built.optimizer, built.stepper
        # Multi-worker: only the chief writes into the workdir (see engine/loop.py).
        self.chief = strategy.extended.should_checkpoint
        self.metrics = MetricsWriter(workdir, self.chief, self.name, write_log=_log)
        self.targets = Targets(config, batch, info.num_train, self.metrics.log)
        self.extra_targets = self.targets.extra
        want_probe = t.gradient_every_examples or t.gradient_at_init
        self.probe = built.probe(config) if want_probe else None
        self.economy = evaluation.Economy(self)
        self.state = RunState()
        self.noise = None
        self.train_iter = None
        self.setup_s = time.perf_counter() - started  # into the account at restore

    @property
    def n_train(self) -> int:
        return self.info.num_train

    # ---- the pieces ------------------------------------------------------------------------------

    def restore(self, state: RunState | None = None) -> None:
        """Continues from `state` (a checkpoint's; None: from the start); opens the data stream at
        its step."""
        self.state = state or RunState()
        self.targets.adopt(self.state)
        timing.add(self.state.time_s, "setup", self.setup_s)
        t = self.config.train
        self.noise = TwoBatchNoiseScale(decay=t.noise_scale_ema)
        if self.state.noise:
            self.noise = TwoBatchNoiseScale.from_dict(self.state.noise)
        self.train_iter = self.built.train_stream(
            self.config, self.runtime, self.info, self.batch, self.state.step
        )

    def train_until(self, target_step: int) -> dict:
        """One host call of at most train.steps_per_loop steps towards `target_step`; returns the
        loop's training scalars (the loop sends them to TensorBoard). One device-to-host read."""
        st = self.state
        n = min(self.config.train.steps_per_loop, target_step - st.step)
        t0 = time.time()
        with timing.timed("train", st.time_s) as timed:
            scalars = self.stepper.train(self.train_iter, n)
            timed["count"] = int(scalars["steps"])
        dt = time.time() - t0
        st.step += int(scalars["steps"])  # all n, or up to the first diverged step
        st.train_time_s += dt
        out = self._train_scalars(scalars, dt)
        if scalars["diverged"]:
            st.diverged_at = st.step
            if st.steps_to_target is None:
                st.status = "diverged"
            self.metrics.log(
                "diverged at step %d (loss %.4g): recorded as a result, not an error",
                st.step,
                out["batch_loss"],
                warning=True,
            )
        return out

    def _train_scalars(self, scalars: dict, dt: float) -> dict:
        """The logged numbers of one host call, from its accumulated sums; updates the two-batch
        noise-scale estimate."""
        st, plan = self.state, self.plan
        examples = max(scalars["examples"], 1.0)
        out = {
            "batch_loss": scalars["loss_sum"] / examples,
            "batch_accuracy": scalars["correct"] / examples,
            "grad_norm": math.sqrt(scalars["grad_norm_sq"]),
            "param_norm": math.sqrt(scalars["param_norm_sq"]),
            "update_norm": math.sqrt(scalars["update_norm_sq"]),
            "learning_rate": scalars["learning_rate"],  # of the next step
            "examples_per_s": scalars["examples"] / dt if dt > 0 else 0.0,
        }
        if self.stepper.diagnostics is not None:  # the optimizer's own, e.g. LARS trust ratios
            out.update({k: scalars[k] for k in self.stepper.diagnostics.names})
        if plan.num_replicas * plan.num_micro_batches > 1 and math.isfinite(scalars["big_grad_sq"]):
            # Averages over the loop's steps: G2 and S are linear in the two squared norms.
            done = max(scalars["steps"], 1.0)
            self.noise.update(
                scalars["small_grad_sq"] / done,
                scalars["big_grad_sq"] / done,
                plan.micro_batch,
                self.batch,
            )
            st.noise = self.noise.to_dict()
            if self.noise.value is not None:
                out["noise_scale_two_batch"] = float(self.noise.value)
        return out

    def evaluate(
        self,
        train_scalars: dict | None = None,
        sets=("train", "test"),
        bound=None,
        record: bool = True,
        step: int | None = None,
    ) -> dict | None:
        """The loss and accuracy of `sets` at the current step (or at `step`, for the snapshot's
        weights), into the history when `record`. `bound` bounds the training set's pass: None
        when it stopped early (engine/evaluation.py). The targets are checked by the caller."""
        st = self.state
        key = "eval" if tuple(sets) == ("train", "test") else "eval:" + ",".join(sets)
        out = self.at_init(key, lambda: self.evaluate_sets(self.built.eval_sets, sets, bound))
        if out is None:
            return None
        step = st.step if step is None else step
        ev = {"step": step, "epoch": step * self.batch / self.n_train}
        ev["examples"] = step * self.batch
        for name, values in out.items():
            ev[f"{name}_accuracy"], ev[f"{name}_loss"] = values["accuracy"], values["loss"]
        if train_scalars:
            ev.update(train_scalars)
        if "test" in out:
            self._best_test(out["test"]["accuracy"])
        if record:
            st.history.append(ev)
        return ev

    def add_test(self, ev: dict) -> None:
        """The test set's numbers into the evaluation `ev` of the current step (the end)."""
        te = self.evaluate_sets(self.built.eval_sets, ("test",))["test"]
        ev["test_accuracy"], ev["test_loss"] = te["accuracy"], te["loss"]
        self._best_test(te["accuracy"])

    def _best_test(self, accuracy: float) -> None:
        best = self.state.best_test_accuracy
        self.state.best_test_accuracy = accuracy if best is None else max(best, accuracy)

    def check_targets(self, ev: dict, prev: dict | None) -> None:
        """Every target's first crossing at this evaluation, interpolated with `prev` (the
        evaluation step before it; engine/targets.py)."""
        self.targets.check(self.state, ev, prev)

    def evaluate_sets(self, sets: dict, names=("train", "test"), bound=None) -> dict | None:
        """The named evaluation sets' loss and accuracy, with the batch-norm statistics that
        train.target_bn asks for (the training run's own are left as they were); None when the
        training set's pass stopped early under `bound`."""
        recompute, saved = self.built.bn_recompute, None
        if recompute is not None:
            with timing.timed("eval", self.state.time_s):
                saved = recompute.recompute()
        try:
            out = {}
            for k in names:
                out[k] = self._evaluate_set(sets[k], bound if k == "train" else None)
                if out[k] is None:
                    return None
            return out
        finally:
            if saved is not None:
                with timing.timed("eval", self.state.time_s):
                    recompute.restore(saved)

    def _evaluate_set(self, dataset, bound=None) -> dict | None:
        with timing.timed("eval", self.state.time_s) as timed:
            out = self.stepper.evaluate(dataset, bound)
            timed["count"] = 0 if out is None else int(out["examples"])
        return out

    def at_init(self, what: str, compute) -> dict:
        """`compute()`, a dict of numbers of the model at the current step; at step 0 (the initial
        weights of this seed) computed once per seed and key, and copied for the other runs."""
        if self.state.step != 0:
            return compute()
        cache = self.built.at_init.setdefault(self.config.train.seed, {})
        if what not in cache:
            cache[what] = compute()
        return dict(cache[what])

    def measure(self) -> dict:
        """Exact gradient diversity on the probe set at the current step, into the state."""
        st = self.state
        with timing.timed("probe", st.time_s) as timed:
            g = self.at_init("gradient", lambda: self.probe(self.model))
            timed["count"] = self.probe.n
        g.update(step=st.step, examples=st.step * self.batch)
        st.gradient.append(g)
        return g

    def running(self) -> bool:
        st = self.state
        stop_at_target = self.config.train.stop_at_target
        return (
            st.step < self.total_steps
            and st.diverged_at is None
            # With extra targets, the run stops once every target is reached.
            and not (stop_at_target and self.targets.all_reached(st))
        )

    def finish(self) -> None:
        """The primary target's status once the loop has stopped."""
        st = self.state
        if st.status is None:
            st.status = "reached" if st.steps_to_target is not None else "not_reached"

    def targets_result(self) -> list[dict]:
        """result.json's "targets": the primary target, then train.extra_targets in order."""
        return self.targets.records(self.state)

    @property
    def params(self) -> int:
        return int(sum(np.prod(v.shape) for v in self.model.trainable_variables))

    @property
    def peak_lr(self) -> float:
        return float(optim_lib.peak_learning_rate(self.config.optim, self.batch))

    @property
    def noise_scale_ema(self) -> float | None:
        return None if self.noise.value is None else float(self.noise.value)

    def run(self) -> dict:
        """The whole run (engine/loop.py); returns its result record."""
        return loop.Controller(self).run()


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


def _log(message: str, *args, warning: bool = False) -> None:
    """Writes one of the run's log lines (all of them, the loop's too, through MetricsWriter.log):
    from here, so that absl's prefix names train.py, as it did before the run was split into
    modules (tests/config/test_errors.py looks for it in a run's output)."""
    (logging.warning if warning else logging.info)(message, *args)


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
    config, workdir: str, runtime: Runtime | None = None, trial: dict | None = None
) -> dict:
    """Trains one model as `config` says, in `workdir`; resumes from its last checkpoint; returns
    (and writes) result.json. A finished run is not repeated."""
    timing.mark("trial")
    result_path = wd.join(workdir, wd.RESULT)
    if tf.io.gfile.exists(result_path):
        logging.info("Run in %s already finished; reading its result.", workdir)
        result = wd.read_json(result_path)
    else:
        tf.io.gfile.makedirs(workdir)
        result = Run(config, workdir, runtime or setup_runtime(config.runtime), trial).run()
    timing.mark("trial_end")
    return result
