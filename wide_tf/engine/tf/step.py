"""Owns the compiled distributed computations of a run: the training step (its micro-batch
accumulation is engine/tf/accumulate.py), the multi-step host loop around `strategy.run`, and
evaluation."""

from __future__ import annotations

import functools
import math

import keras
import numpy as np
import tensorflow as tf

from wide_tf.engine import arrays, timing
from wide_tf.engine.host_scalars import TRAIN_SCALARS
from wide_tf.engine.loss import losses_and_hits
from wide_tf.engine.optim import Diagnostics
from wide_tf.engine.state import BatchPlan, BatchSplitError  # noqa: F401  (the step's plan)
from wide_tf.engine.tf import accumulate
from wide_tf.engine.tf import data as data_lib
from wide_tf.engine.tf import fused as fused_lib
from wide_tf.engine.tf.accumulate import sq_norm
from wide_tf.engine.tf.stream import InMemoryTrainStream


def _is_tpu(strategy) -> bool:
    return "TPU" in type(strategy).__name__


def weighted_sums(model, x, y, w) -> tf.Tensor:
    """[loss sum, hits, examples] of `model` in inference mode over a batch whose padding rows
    have weight 0 (see data.pad_for_evaluation)."""
    losses, hits = losses_and_hits(model, x, y, training=False)
    w = tf.cast(w, tf.float32)
    return tf.stack([tf.reduce_sum(losses * w), tf.reduce_sum(hits * w), tf.reduce_sum(w)])


# An evaluation pass's bound (engine/evaluation.py): [the fewest hits that meet a target, the
# largest loss sum that does, the set's examples]. The pass goes on while either can still be met.
WHOLE_PASS = (-math.inf, math.inf)


def go_on(sums, bound) -> tf.Tensor:
    """Whether the pass whose [loss sum, hits, examples] so far are `sums` can still meet a target:
    every example to come a hit, or every one a zero loss (float32 sums of whole numbers are exact
    below 2^24, and a sum of losses >= 0 never decreases)."""
    best_hits = sums[1] + (bound[2] - sums[2])
    return tf.logical_or(best_hits >= bound[0], sums[0] <= bound[1])


def bounded_sums(batch_sums, num_batches, bound) -> tf.Tensor:
    """[loss sum, hits, examples] of batches 0, 1, ... (`batch_sums(i)`: batch i's, reduced over
    the replicas) up to `num_batches`, or fewer once `bound` says no target can be met (go_on)."""
    _, sums = tf.while_loop(
        lambda i, sums: tf.logical_and(i < num_batches, go_on(sums, bound)),
        lambda i, sums: (i + 1, sums + batch_sums(i)),
        [tf.constant(0), tf.zeros([3], tf.float32)],
    )
    return sums


def _bound_tensor(bound, num_examples: int) -> tf.Tensor:
    lo, hi = WHOLE_PASS if bound is None else bound
    return tf.constant([lo, hi, float(num_examples)], tf.float32)


def _build_eval_fn(model, strategy, jit_compile: bool, input_spec=None):
    """The whole evaluation pass over a distributed (x, y, weight) dataset, as one graph."""

    def replica_eval(x, y, w):  # packed images unpacked and normalised here, on the device
        return weighted_sums(model, data_lib.device_inputs(x, input_spec, w), y, w)

    if jit_compile:  # no synchronisation inside (sums are reduced outside)
        replica_eval = tf.function(replica_eval, jit_compile=True, autograph=False)

    @tf.function(autograph=False)
    def eval_all(iterator, num_batches, bound):
        timing.note_trace()
        # The whole pass in one graph: evaluation runs on a cadence inside every training
        # run, and a Python loop over batches cost more than the forward passes themselves.
        # At most `num_batches` padded batches with `get_next`: static shapes under TPUStrategy;
        # fewer when `bound` says the rest cannot meet a target (go_on).
        # The iterator comes from outside, as in training: one made inside this function hangs
        # in `get_next` under MirroredStrategy (two CPU replicas here).

        def add_batch(i):
            out = strategy.run(replica_eval, args=iterator.get_next())
            return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

        return bounded_sums(add_batch, num_batches, bound)

    return eval_all


class Stepper:
    """The device side of a run. Build it inside `strategy.scope()` after the model and optimizer.

    The optimizer's own all-reduce is bypassed: the step all-reduces the gradients once itself
    (it needs the reduced gradient for its norm and the noise-scale estimator), then hands the
    reduced gradients to the optimizer. Keras 3 would otherwise sum them over replicas a second
    time (keras/src/backend/tensorflow/optimizer.py, `_all_reduce_sum_gradients`).
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy,
        plan: BatchPlan,
        *,
        jit_compile: bool = False,
        diverge_loss: float = float("inf"),
        diagnostics: Diagnostics | None = None,
        input_spec=None,
        fused: bool = False,
        open_batch: bool = False,
    ):
        self.model = model
        # The whole host call as one XLA program when it reads the in-memory stream
        # (engine/tf/fused.py decides when: one CPU replica).
        self.fused = bool(fused)
        self._fused_fn = None  # (stream, epochs held, the call)
        # The data set's spec (schema/datasets.Dataset): packed images (data.pack_images) are
        # unpacked and normalised inside the step with its constants. None: float inputs only.
        self.input_spec = input_spec
        self.optimizer, self.strategy, self.plan = optimizer, strategy, plan
        # XLA (a jit_compile function around the replica step) on GPU and CPU only: TPUStrategy
        # compiles the whole replica function itself, and a jit_compile function nested inside
        # it is what Keras 3 refuses under tf.distribute. On one GPU (OneDeviceStrategy) the nested
        # step should compile as it does on one CPU; on several, its all-reduce inside XLA fails
        # ("merge_call called while defining a new graph", reproduced on two logical CPUs), so
        # engine/tf/strategy.py refuses jit_compile there. Neither was ever run on a GPU.
        self.jit_compile = bool(jit_compile) and not _is_tpu(strategy)
        # The optimizer's own scalars (optim.OptimizerSpec.diagnostics), kept like the norms.
        self.diagnostics = diagnostics
        self.scalar_names = TRAIN_SCALARS + (diagnostics.names if diagnostics else ())
        # The two-batch noise-scale estimator needs a batch smaller than the global one.
        self._two_batch = plan.num_replicas * plan.num_micro_batches > 1
        # Gradients arrive here already summed over replicas (see the class docstring).
        optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
        only_first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        with strategy.scope():
            # One copy per replica (ON_READ), read from the first: every value added is already
            # all-reduced or computed from all-reduced values, so the copies agree, and a replica
            # updates its own with no collective. A mirrored (ON_WRITE) variable would broadcast
            # the first replica's value on every assign (an all-to-all on TPU, a copy per device
            # elsewhere: 7 a step, 17 in all in the two traced step variants;
            # tests/engine/test_accumulators.py counts them).
            local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ)
            local["aggregation"] = only_first
            self.acc = {k: tf.Variable(0.0, name=k, **local) for k in self.scalar_names}
            self.diverged = tf.Variable(False, name="diverged", **local)
            # Variables, not constants baked into the graph: runs that differ only in their
            # threshold (or learning rate, see schedules.WarmupDecaySchedule) share one traced
            # step; with `open_batch`, runs at another batch too (engine/tf/reuse.py's rebatch).
            shared = dict(trainable=False, aggregation=only_first)
            self.diverge_loss = tf.Variable(float(diverge_loss), name="diverge_loss", **shared)
            batch = float(plan.global_batch)
            self.open_batch = tf.Variable(batch, name="batch", **shared) if open_batch else None
        # The loss's divisor and the examples a step counts.
        self.global_batch = self.open_batch if open_batch else float(plan.global_batch)
        self._train_fn = None
        self._span_fn = None  # ((stream, evaluation set, snapshot), engine/tf/span.py's trace)

    # ---- training -------------------------------------------------------------------------------

    def _replica_step(self, x, y, diagnostics: bool):
        """One update. `diagnostics` (a Python bool: two traced variants) adds the parameter and
        update norms and the optimizer's own diagnostics (the LARS trust ratios, say); the loop
        asks for them on its last step only, since the update norm needs a copy of every weight.

        Divergence is checked here, on the device, with no host read: `diverged` is read at the
        start of the step (`skip`) and set by the first step whose loss (or gradient) is bad.
        That first diverged step is applied and counted, as it always was; the later steps of the
        same host call still run (skipping an update would need a conditional around the
        optimizer's cross-replica synchronisation, which tf.distribute does not support) but
        count for nothing: no scalar accumulates, `steps` stops, so the step count, scalars and
        status the host reads after the call are those of the first diverged step, and the host
        loop ends there. The weights after that step are not used: a diverged run records no
        final metrics and is never resumed."""
        ctx = tf.distribute.get_replica_context()
        variables = self.model.trainable_variables
        x = data_lib.device_inputs(x, self.input_spec)
        skip = self.diverged.read_value()
        live = tf.logical_not(skip)
        loss_sum, correct, grads, small_sq = accumulate.loss_and_grads(
            self.model, self.plan, x, y, two_batch=self._two_batch, global_batch=self.open_batch
        )
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        loss_sum, correct, small_sq = ctx.all_reduce(
            tf.distribute.ReduceOp.SUM, [loss_sum, correct, small_sq]
        )
        small_sq = small_sq / self.plan.num_replicas
        loss = loss_sum / self.global_batch
        bad = tf.logical_or(tf.logical_not(tf.math.is_finite(loss)), loss > self.diverge_loss)
        # |G_big|^2 every step only when the two-batch estimator needs it; otherwise on the
        # diagnostic step (a non-finite gradient with a finite loss shows up there, or in the loss
        # of the step after).
        if self._two_batch or diagnostics:
            big_sq = sq_norm(grads)
            bad = tf.logical_or(bad, tf.logical_not(tf.math.is_finite(big_sq)))
        else:
            big_sq = tf.constant(0.0)
        acc = self.acc

        def keep(name, value):  # a diagnostic of a live step replaces the last one
            acc[name].assign(tf.where(live, tf.cast(value, tf.float32), acc[name]))

        if diagnostics:
            if self.diagnostics is not None:
                for name, value in self.diagnostics.fn(self.optimizer, grads, variables).items():
                    keep(name, value)
            before = [tf.identity(v) for v in variables]
        self.optimizer.apply_gradients(zip(grads, variables))
        if diagnostics:
            keep("update_norm_sq", sq_norm([v - b for v, b in zip(variables, before)]))
            keep("param_norm_sq", sq_norm(variables))
            keep("grad_norm_sq", big_sq)
        sums = {"loss_sum": loss_sum, "correct": correct, "small_grad_sq": small_sq}
        self._add_live(live, dict(sums, big_grad_sq=big_sq))
        self.diverged.assign(tf.logical_or(skip, bad))

    def _add_live(self, live, values: dict) -> None:
        """Adds a step's sums (and its examples and step) to the accumulators, when it is live."""
        zero = tf.constant(0.0)
        values = dict(values, examples=self.global_batch, steps=1.0)
        for name in ("loss_sum", "correct", "examples", "small_grad_sq", "big_grad_sq", "steps"):
            self.acc[name].assign_add(tf.where(live, tf.cast(values[name], tf.float32), zero))

    def _reset(self):
        """Zeroes the accumulators; traced into the compiled loop (no eager assigns per call). The
        optimizer's diagnostics start as NaN, "not measured": a call whose last step came after
        the run diverged measures none, and non-finite values are not logged."""
        for k, v in self.acc.items():
            v.assign(0.0 if k in TRAIN_SCALARS else float("nan"))

    def _packed(self):
        """Every scalar the host needs after a call, in one tensor (one device-to-host read):
        the accumulators, then `diverged`, the optimizer's step and its learning rate."""
        lr = self.optimizer.learning_rate
        lr = lr.value if hasattr(lr, "value") and not callable(lr) else lr
        return tf.stack(
            [tf.cast(self.acc[k].read_value(), tf.float32) for k in self.scalar_names]
            + [
                tf.cast(self.diverged.read_value(), tf.float32),
                tf.cast(self.optimizer.iterations, tf.float32),
                tf.cast(lr, tf.float32),
            ]
        )

    def _build_train_fn(self):
        lean = functools.partial(self._replica_step, diagnostics=False)
        full = functools.partial(self._replica_step, diagnostics=True)
        if self.jit_compile:
            lean = tf.function(lean, jit_compile=True, autograph=False)
            full = tf.function(full, jit_compile=True, autograph=False)

        # autograph=False, with the loops written out: autograph would convert the model, the
        # optimizer and Keras internals on every trace, seconds per run of a study.
        @tf.function(autograph=False)
        def train_loop(iterator, num_steps):
            timing.note_trace()
            # SimCLR-style: several steps per host call; the host decides when to log and evaluate.
            # The loop's condition reads only its counter: no device read per step (divergence
            # is handled inside the step, see _replica_step).
            self._reset()

            def lean_step(i):
                self.strategy.run(lean, args=iterator.get_next())
                return i + 1

            tf.while_loop(lambda i: i < num_steps - 1, lean_step, [tf.constant(0)])
            self.strategy.run(full, args=iterator.get_next())
            return self._packed()

        return train_loop

    def train(self, iterator, num_steps: int) -> dict:
        """Runs `num_steps` updates and returns the accumulated scalars (fewer `steps` if the run
        diverged), the optimizer's diagnostics, `diverged`, `iteration` (the optimizer's step) and
        `learning_rate`, all from one device-to-host read."""
        if self.fused and isinstance(iterator, InMemoryTrainStream):
            packed = fused_lib.train(self, iterator, num_steps).numpy()
        else:
            if self._train_fn is None:
                self._train_fn = self._build_train_fn()
            packed = self._train_fn(iterator, tf.constant(num_steps, tf.int32)).numpy()
        return self._unpack(packed)

    def _unpack(self, packed) -> dict:
        """The host's numbers from `_packed()`'s tensor, read to NumPy."""
        out = {k: float(v) for k, v in zip(self.scalar_names, packed)}
        n = len(self.scalar_names)
        out["diverged"] = bool(packed[n])
        out["iteration"] = int(packed[n + 1])
        out["learning_rate"] = float(packed[n + 2])
        return out

    # ---- several evaluation intervals in one call -----------------------------------------------

    @property
    def _traced_train_fn(self):
        """The traced host call in use: the fused one once it has run, else the span's (a run
        that spans trains with it alone), else the executor's."""
        if self._fused_fn is not None:
            return self._fused_fn[2].traced
        return self._span_fn[1] if self._span_fn is not None else self._train_fn

    def reset(self, diverge_loss: float | None = None):
        """Ready for a new run on the same model and optimizer (whose variables the caller resets):
        not diverged, a new threshold. The traced functions are kept."""
        self.diverged.assign(False)
        if diverge_loss is not None:
            self.diverge_loss.assign(float(diverge_loss))

    # ---- evaluation -----------------------------------------------------------------------------

    def eval_fn(self, dataset):
        """The compiled pass over a streamed set (data.EvalDataset), kept with the set: its trace
        depends on the model, strategy, XLA setting and the set's batches, not on the training
        batch, so a member's next batch size (engine/tf/reuse.py) reuses it."""
        key = (self.model, self.strategy, self.jit_compile, self.input_spec)
        kept = dataset.compiled
        if kept is None or any(a is not b for a, b in zip(kept[0], key)):
            fn = _build_eval_fn(self.model, self.strategy, self.jit_compile, self.input_spec)
            dataset.compiled = kept = (key, fn)
        return kept[1]

    def evaluate(self, dataset, bound=None) -> dict | None:
        """Loss and accuracy over an evaluation set: a data.EvalDataset whose elements are
        (x, y, weight), or a `DeviceEvalSet`. `bound` (engine/evaluation.py; None: the whole
        pass): the pass stops once no target can be met, and returns None. One device read."""
        b = _bound_tensor(bound, dataset.num_examples)
        if isinstance(dataset, DeviceEvalSet):
            sums = dataset.sums(b)
        else:
            batches = tf.constant(dataset.num_batches, tf.int32)
            sums = self.eval_fn(dataset)(iter(dataset.dataset), batches, b)
        loss, hits, count = (float(v) for v in sums.numpy())
        if count < dataset.num_examples:
            return None  # stopped early: no target can be met at this step
        if count == 0:
            raise ValueError("the evaluation set is empty")
        return {"loss": loss / count, "accuracy": hits / count, "examples": count}


class DeviceEvalSet:
    """An evaluation set held on the devices, evaluated without tf.data: every replica keeps its
    share of every padded batch as one tensor there (as the gradient probe keeps its set), and a
    pass is one call of a function compiled once per set and model (kept with the member's build
    across its batch sizes, engine/tf/reuse.py), with one device-to-host read.

    Replica r holds rows [b*B + r*B/R, b*B + (r+1)*B/R) of global batch b (B the evaluation batch,
    R the replicas): the per-replica batches the distributed tf.data pipeline handed it, so the
    sums are those of the streaming pass (data.make_eval_dataset). `x` is what the step reads:
    float32 inputs already normalised (one replica: the values evaluated before, so the records
    stay bit-identical) or packed images (data.pack_images: a quarter of the bytes, normalised on
    the device, padding rows zeroed).

    The pass: on TPUs the whole loop runs inside one replica function (`strategy.run`), and
    whether to go on is decided on the sums all-reduced across the replicas after every batch, so
    a pass is one device program and one read (the loop condition never leaves the devices).
    Elsewhere the loop runs around `strategy.run` in one graph, as the streaming pass did:
    MirroredStrategy refuses a replica-context all-reduce inside a loop ("merge_call called while
    defining a new graph", tests/engine/test_device_eval.py), and without XLA a loop's condition
    is read by TensorFlow's executor on the host anyway. That refusal lives in MirroredStrategy's
    replica threads (tensorflow/python/distribute/mirrored_run.py); under TPUStrategy a replica's
    all-reduce is `tpu_ops.cross_replica_sum` inside the compiled program (tpu_strategy.py,
    `_reduce_to`). The TPU pass was never run (no TPU here); on CPUs it runs on one replica.

    No iterator is created per pass, on every platform: on two CPU replicas that, not the forward
    passes, was most of a pass's time (docs/evaluation.md, `python -m tools.bench.eval_pass`)."""

    # Above this many bytes per replica the set stays a tf.data pipeline (data.make_eval_dataset).
    MAX_BYTES = 64 << 20

    def __init__(
        self, x, y, batch_size: int, strategy, model, input_spec=None, in_replica=None, xla=False
    ):
        self.num_examples = len(y)  # without the padding
        # The pass as one XLA program (engine/tf/fused.py: one CPU replica), not the executor's.
        self.xla = bool(xla)
        replicas = strategy.num_replicas_in_sync
        if batch_size % replicas:
            raise ValueError(f"eval batch {batch_size} is not divisible by {replicas} replicas")
        x, y, w = arrays.pad_for_evaluation(x, y, batch_size)
        batches, per_replica = len(w) // batch_size, batch_size // replicas
        self.num_batches = batches
        self.model, self.strategy, self.input_spec = model, strategy, input_spec
        # The TPU's one-program pass; `in_replica` set by tests (one replica, see the docstring).
        self.in_replica = _is_tpu(strategy) if in_replica is None else bool(in_replica)

        devices = strategy.extended.worker_devices

        def held(a):
            a = np.ascontiguousarray(a).reshape((batches, replicas, per_replica) + a.shape[1:])

            def share(ctx):
                # Placed by hand: no strategy calls this under the replica's device (mirrored_,
                # tpu_, one_device_ and collective_all_reduce_strategy.py in TensorFlow 2.21),
                # and a share left on the host would travel to the device every pass.
                # MultiWorkerMirroredStrategy numbers replicas across workers; devices are local.
                r = ctx.replica_id_in_sync_group
                with tf.device(devices[r % len(devices)]):
                    return tf.constant(a[:, r])

            return strategy.experimental_distribute_values_from_function(share)

        self.data = tuple(held(a) for a in (x, y, w))
        self._fn = None

    @classmethod
    def fits(cls, num_bytes: int, replicas: int) -> bool:
        """Whether a set of `num_bytes` (padded, as held) fits the per-replica allowance."""
        return num_bytes <= cls.MAX_BYTES * max(int(replicas), 1)

    def sums(self, bound=None) -> tf.Tensor:
        """[loss sum, correct, examples] of the model in inference mode, over every batch or until
        `bound` (a tensor, see go_on) says no target can be met."""
        if self._fn is None:
            self._fn = self._build()
        return self._fn(
            *self.data, _bound_tensor(None, self.num_examples) if bound is None else bound
        )

    def _build(self):
        model, strategy, spec, batches = (
            self.model,
            self.strategy,
            self.input_spec,
            self.num_batches,
        )

        def batch_sums(x, y, w):  # packed images unpacked and normalised here, on the device
            return weighted_sums(model, data_lib.device_inputs(x, spec, w), y, w)

        def replica_pass(x, y, w, bound):
            ctx = tf.distribute.get_replica_context()

            def add(i):
                local = batch_sums(x[i], y[i], w[i])
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)

            return bounded_sums(add, batches, bound)

        @tf.function(autograph=False)
        def one_program(x, y, w, bound):
            timing.note_trace()
            # Every replica returns the same all-reduced sums: the first one's are the pass's (a
            # mean over replicas could round).
            out = strategy.run(replica_pass, args=(x, y, w, bound))
            return strategy.experimental_local_results(out)[0]

        @tf.function(autograph=False)
        def host_loop(x, y, w, bound):
            timing.note_trace()

            def add(i):
                out = strategy.run(lambda a, b, c: batch_sums(a[i], b[i], c[i]), args=(x, y, w))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

            return bounded_sums(add, batches, bound)

        if self.in_replica:
            return one_program
        if self.xla:
            return tf.function(host_loop, jit_compile=True, autograph=False)
        return host_loop
