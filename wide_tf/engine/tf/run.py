"""Owns the TensorFlow backend of one run: its Trainer (the compiled multi-step loop, the two-batch
noise scale, the gradient probe), its Evaluator (the bounded passes over the evaluation sets with
the batch-norm statistics train.target_bn asks for, the snapshot) and its Checkpointer
(tf.train.CheckpointManager; multi-worker scratch folders), as engine/interface.py declares them.
The model, optimizer and compiled functions come from engine/tf/reuse.py, kept across runs."""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf

from wide_tf.engine import preemption, restore, timing
from wide_tf.engine.base import Account, BaseEvaluator, BaseTrainer
from wide_tf.engine.state import BatchPlan, RunPlan, RunState
from wide_tf.engine.tf import reuse, span, strategy
from wide_tf.engine.tf.step import DeviceEvalSet
from wide_tf.store import checkpoint_state, remove
from wide_tf.store import workdir as wd


class Trainer(BaseTrainer):
    """engine/interface.Trainer on TensorFlow: `train(n)` is one host call of the compiled loop
    (one device-to-host read)."""

    def __init__(self, config, runtime, info, batch_plan: BatchPlan, plan: RunPlan, built, account):
        super().__init__(config, runtime, batch_plan, plan, account, built.at_init)
        self.info, self.built = info, built
        self.probe = built.probe(config) if plan.probe else None
        self.stream = None

    def _open(self, step: int) -> None:
        self.stream = self.built.train_stream(
            self.config, self.runtime, self.info, self.plan.batch, step
        )

    def _call(self, num_steps: int):
        # A run that can span trains with the span's function alone (one trace, not two): one
        # interval, its pass left to the host, is one training call.
        call = self._span_call((num_steps,), None, last_pass=False)
        if call is not None:
            return lambda: call()["scalars"]
        return lambda: self.built.stepper.train(self.stream, num_steps)

    def _can_span(self) -> bool:
        built, eval_set = self.built, self.built.eval_sets["train"]
        held = isinstance(eval_set, DeviceEvalSet) and not (eval_set.in_replica or eval_set.xla)
        # The batch-norm recompute runs between a run's steps and its passes on the host.
        return built.bn_recompute is None and span.applies(built.stepper, self.stream, held)

    def _span_call(self, lengths: tuple, bound, last_pass: bool):
        if not self._can_span():
            return None
        built = self.built
        return lambda: span.run(
            built.stepper,
            self.stream,
            built.eval_sets["train"],
            built.snapshot,
            lengths,
            bound,
            last_pass=last_pass,
        )

    def _diagnostics(self):
        return self.built.stepper.diagnostics

    def _probe(self):
        return (lambda: self.probe(self.built.model)), self.probe.n

    def _model(self):
        return self.built.model

    def _probe_examples(self) -> int | None:
        return None if self.probe is None else self.probe.n

    def describe(self):
        """The base's facts; the runtime line names the fused XLA loop when it trains the run
        (runtime.jit_compile there says only whether the step alone is XLA'd)."""
        facts = super().describe()
        if self.built.stepper.fused:
            runtime = facts.runtime + ", fused XLA loop (engine/tf/fused.py)"
            facts = dataclasses.replace(facts, runtime=runtime)
        return facts

    def finish(self) -> None:
        self.stream = None  # the data stream's threads end here, not in a later collection


class Evaluator(BaseEvaluator):
    """engine/interface.Evaluator on TensorFlow: each set's pass is one compiled loop that stops
    once `bound` says no target can be met (engine/tf/step.go_on), under the batch-norm statistics
    of train.target_bn (the training run's own are put back after). The weights are the model's
    variables: a pass reads them in place (`weights` is None)."""

    def __init__(self, config, built, account):
        super().__init__(config, built.eval_sets, account, built.at_init)
        self.built = built

    def _weights(self):
        return None

    @contextlib.contextmanager
    def _snapshot(self):
        with self.built.snapshot.applied():
            yield None

    @contextlib.contextmanager
    def _statistics(self, weights):
        recompute, saved = self.built.bn_recompute, None
        if recompute is not None:
            with timing.timed("eval", self.account.time_s):
                saved = recompute.recompute()
        try:
            yield weights
        finally:
            if saved is not None:
                with timing.timed("eval", self.account.time_s):
                    recompute.restore(saved)

    def _pass(self, weights, eval_set, bound):
        return self.built.stepper.evaluate(eval_set, bound)

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
        finished = {
            wd.join(self.directory, f"ckpt-{s}")
            for s in checkpoint_state.committed_steps(self.directory)
        }
        latest, state = restore.newest_readable(
            candidates,
            self._load,
            errors,
            self.log,
            set_aside=self.scratch is None,
            unfinished=[name for name, _ in candidates if name not in finished],
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
    account = Account()
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
