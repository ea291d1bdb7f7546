"""Owns the TensorFlow backend of one run: its Trainer (the compiled multi-step loop, the two-batch
noise scale, the gradient probe), its Evaluator (the bounded passes over the evaluation sets with
the batch-norm statistics train.target_bn asks for, the snapshot) and its Checkpointer
(tf.train.CheckpointManager; multi-worker scratch folders), as engine/interface.py declares them.
The model, optimizer and compiled functions come from engine/tf/reuse.py, kept across runs."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import tensorflow as tf

from wide_tf.engine import host_scalars, preemption, restore, schedules, timing
from wide_tf.engine.measure.noise_scale import TwoBatchNoiseScale
from wide_tf.engine.state import BatchPlan, RunPlan, RunState
from wide_tf.engine.tf import reuse, strategy
from wide_tf.store import remove
from wide_tf.store import workdir as wd


class _Account:
    """The run's time account (RunState.time_s), which the trainer adopts at restore and the
    evaluator times its passes into."""

    def __init__(self):
        self.time_s: dict = {}


class Trainer:
    """engine/interface.Trainer on TensorFlow: `train(n)` is one host call of the compiled loop
    (one device-to-host read)."""

    def __init__(self, config, runtime, info, batch_plan: BatchPlan, plan: RunPlan, built, account):
        self.config, self.runtime, self.info = config, runtime, info
        self.batch_plan, self.plan, self.built, self.account = batch_plan, plan, built, account
        self.probe = built.probe(config) if plan.probe else None
        self.state = RunState()
        self.noise = None
        self.stream = None
        self.setup_s = 0.0  # the set-up's seconds (engine/train.py sets them), into the account

    def restore(self, state: RunState) -> None:
        self.state = state
        self.account.time_s = state.time_s
        timing.add(state.time_s, "setup", self.setup_s)
        self.noise = TwoBatchNoiseScale(decay=self.config.train.noise_scale_ema)
        if state.noise:
            self.noise = TwoBatchNoiseScale.from_dict(state.noise)
        self.stream = self.built.train_stream(
            self.config, self.runtime, self.info, self.plan.batch, state.step
        )

    def train(self, num_steps: int) -> dict:
        st = self.state
        t0 = time.time()
        with timing.timed("train", st.time_s) as timed:
            scalars = self.built.stepper.train(self.stream, num_steps)
            timed["count"] = int(scalars["steps"])
        dt = time.time() - t0
        st.step += int(scalars["steps"])  # all of them, or up to the first diverged step
        st.train_time_s += dt
        out = self._scalars(scalars, dt)
        out["diverged"] = bool(scalars["diverged"])
        return out

    def _scalars(self, scalars: dict, dt: float) -> dict:
        """The logged numbers of one host call (engine/host_scalars.py); the noise estimate into
        the state."""
        diagnostics = self.built.stepper.diagnostics
        out, updated = host_scalars.from_sums(
            scalars,
            dt,
            self.batch_plan,
            self.plan.batch,
            self.noise,
            diagnostics.names if diagnostics is not None else (),
        )
        if updated:
            self.state.noise = self.noise.to_dict()
        return out

    def measure(self, step: int) -> dict:
        with timing.timed("probe", self.state.time_s) as timed:
            seed = self.config.train.seed
            g = host_scalars.at_init(
                self.built.at_init, seed, step, "gradient", lambda: self.probe(self.built.model)
            )
            timed["count"] = self.probe.n
        return g

    def describe(self) -> dict:
        model = self.built.model
        noise = None if self.noise is None else self.noise.value
        return {
            "model": model.name,
            "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "learning_rate": float(
                schedules.peak_learning_rate(self.config.optim, self.plan.batch)
            ),
            "probe_examples": None if self.probe is None else self.probe.n,
            "runtime": self.runtime.describe(),
            # The policy the model was really built with (not only the one asked for).
            "dtype_policy": _model_policy(model),
            "batch_plan": self.batch_plan.describe(),
            "noise_scale_ema": None if noise is None else float(noise),
        }

    def finish(self) -> None:
        self.stream = None  # the data stream's threads end here, not in a later collection


def _model_policy(model) -> str:
    """The dtype policy of the model's first layer with weights (the logits layer stays float32)."""
    layer = next((candidate for candidate in model.layers if candidate.weights), None)
    return (layer or model).dtype_policy.name


class Evaluator:
    """engine/interface.Evaluator on TensorFlow: each set's pass is one compiled loop that stops
    once `bound` says no target can be met (engine/tf/step.go_on), under the batch-norm statistics
    of train.target_bn (the training run's own are put back after)."""

    def __init__(self, config, built, account):
        self.seed, self.built, self.account = config.train.seed, built, account
        self.examples = {k: s.num_examples for k, s in built.eval_sets.items()}

    def evaluate(self, step: int, sets=("train", "test"), bound=None, snapshot: bool = False):
        sets = tuple(sets)
        if snapshot:
            with self.built.snapshot.applied():
                return self._passes(sets, bound)
        key = "eval" if sets == ("train", "test") else "eval:" + ",".join(sets)
        return host_scalars.at_init(
            self.built.at_init, self.seed, step, key, lambda: self._passes(sets, bound)
        )

    def _passes(self, names, bound) -> dict | None:
        account = self.account.time_s
        recompute, saved = self.built.bn_recompute, None
        if recompute is not None:
            with timing.timed("eval", account):
                saved = recompute.recompute()
        try:
            out = {}
            for k in names:
                with timing.timed("eval", account) as timed:
                    got = self.built.stepper.evaluate(
                        self.built.eval_sets[k], bound if k == "train" else None
                    )
                    timed["count"] = 0 if got is None else int(got["examples"])
                if got is None:
                    return None
                out[k] = got
            return out
        finally:
            if saved is not None:
                with timing.timed("eval", account):
                    recompute.restore(saved)

    def hold(self) -> None:
        with timing.timed("eval", self.account.time_s):
            self.built.snapshot.take()


class Checkpointer:
    """engine/interface.Checkpointer on TensorFlow. Multi-worker: every worker restores from, and
    saves with, the chief's checkpoints (a save may run collectives), but only the chief writes
    into the workdir; the others save into a scratch folder that they delete at the end."""

    def __init__(self, built, workdir: str, strategy, chief: bool, log):
        self.built, self.log = built, log
        self.scratch = (
            None if chief else wd.join(workdir, f".worker{strategy.cluster_resolver.task_id}")
        )
        self.directory = wd.join(workdir, wd.CHECKPOINTS)
        built.host_var.assign("")
        self.manager = tf.train.CheckpointManager(
            built.checkpoint,
            self.directory if chief else wd.join(self.scratch, wd.CHECKPOINTS),
            max_to_keep=2,
        )

    def load(self) -> RunState | None:
        """The newest checkpoint that reads whole (engine/restore.py): a damaged one is named
        and skipped when an older one is whole."""
        candidates = [
            (wd.join(self.directory, f"ckpt-{s}"), restore.files_of(self.directory, s))
            for s in restore.steps_on_disk(self.directory)
        ]
        errors = (tf.errors.OpError, ValueError, AssertionError, IndexError, UnicodeDecodeError)
        latest, state = restore.newest_readable(
            candidates, self._load, errors, self.log, set_aside=self.scratch is None
        )
        if latest is not None:
            self.log("resumed from %s at step %d", latest, state.step)
        return state

    def _load(self, path: str) -> RunState:
        # Every tensor is read (and its checksum checked) before any variable is assigned, so a
        # checkpoint cut short leaves the model as it was for the next candidate.
        reader = tf.train.load_checkpoint(path)
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)
        self.built.checkpoint.restore(path).assert_existing_objects_matched()
        # A diverged run's optimizer may have run past the step it diverged at (see Stepper): the
        # state's step is the one that counts.
        return RunState.from_json(
            self.built.host_var.numpy().decode(), int(self.built.optimizer.iterations.numpy())
        )

    def save(self, state: RunState) -> None:
        self.built.host_var.assign(state.to_json())
        self.manager.save(checkpoint_number=state.step)

    def close(self) -> None:
        if self.scratch is not None:
            remove.remove_tree(self.scratch)  # a link planted at its name is unlinked only


@dataclasses.dataclass
class Backend:
    """One run's Trainer, Evaluator and Checkpointer on TensorFlow, and the build they share."""

    trainer: Trainer
    evaluator: Evaluator
    checkpointer: Checkpointer
    built: reuse.Built


def make(config, workdir, runtime, info, batch_plan, plan, new_model, chief, log) -> Backend:
    """The backend of one run: the model, optimizer and compiled step (kept from the last run
    when they can be: engine/tf/reuse.py), and the three objects around them."""
    preemption.set_collective(preemption.tf_collective(runtime.strategy))  # hosts agree
    built = reuse.build(
        config, runtime, info, batch_plan, plan.steps_per_epoch, plan.total_steps, new_model
    )
    account = _Account()
    trainer = Trainer(config, runtime, info, batch_plan, plan, built, account)
    checkpointer = Checkpointer(built, workdir, runtime.strategy, chief, log)
    return Backend(trainer, Evaluator(config, built, account), checkpointer, built)


def setup_runtime(runtime_cfg):
    """TensorFlow's runtime: the distribution strategy runtime.strategy names."""
    return strategy.setup_runtime(runtime_cfg)


def device_cap(config, runtime) -> int:
    """The largest per-device batch: the config's, or a GPU default when 0."""
    return strategy.max_device_batch(config, runtime)


def is_chief(runtime) -> bool:
    """Multi-worker: only the chief writes into the workdir (see Checkpointer)."""
    return runtime.strategy.extended.should_checkpoint


def clear_cache() -> None:
    """Drops the kept build (engine/tf/reuse.py)."""
    reuse.clear_cache()
