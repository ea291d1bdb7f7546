"""Owns the fused training loop of one CPU replica: a host call's steps (the in-memory stream's
batches, the update, its sums and divergence check) as one XLA program, and the evaluation pass
of a held set compiled the same way. Without it TensorFlow's executor runs the step's few hundred
small ops one by one, handing work between its threads; on a loaded machine each hand-off waits
(the local study's training seconds fell 2.4x under load with the CPU seconds about the same:
docs/benchmarks.md, `python -m tools.bench.cohort`)."""

from __future__ import annotations

import functools
import math

import tensorflow as tf

from wide_tf.engine import timing
from wide_tf.engine.tf import data

# Architectures whose fused loop was measured on CPU (docs/benchmarks.md: the step bench and the
# local study before and after). The WRN's convolutions ran ~30% slower under XLA on CPU than
# under oneDNN (engine/tf/strategy.py's note), so its loop stays the executor's.
MEASURED_ARCHS = ("mlp",)


def applies(config, runtime) -> bool:
    """Whether a run trains with the fused loop: one CPU replica (the in-memory stream, no
    collective), runtime.jit_compile='fused' (opt-in: XLA adds in another order than the
    executor, so deep MLPs at large rates follow other trajectories and the studies' recorded
    numbers came from the executor; 'auto' and false keep the executor's graph, true XLA around
    the step alone), an architecture measured to gain, and no augmentation (its per-example crops
    were not measured under XLA)."""
    requested = config.runtime.jit_compile
    return (
        runtime.platform == "cpu"
        and runtime.num_replicas == 1
        and str(requested).lower() == "fused"
        and config.model.arch in MEASURED_ARCHS
        and not config.data.augment
    )


class HeldOrders:
    """The epoch orders a fused call reads, computed before the call by the executor (their
    random draws and sort cost XLA seconds to compile and nothing to run outside it): the orders
    of `epochs` consecutive epochs from the one the stream is in, the same `data.epoch_order`s
    that the stream's own `get_next` holds two of, so the batches are the same."""

    def __init__(self, stream, epochs: int):
        self.stream, self.epochs = stream, int(epochs)
        n = stream.n
        self.first = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.key = None  # (seed, first epoch) of the orders held; None: none
        self.order = tf.Variable(tf.zeros([self.epochs * n], tf.int64), trainable=False)

        # Not a timing.note_trace(): its trace is a few small ops, and the training loop's is
        # what a new batch of a kept member traces (tests/engine/test_member_reuse.py).
        @tf.function(autograph=False)
        def refresh(seed, first):
            orders = [
                data.epoch_order(n, seed, first + e, stream.shuffle_buffer)
                for e in range(self.epochs)
            ]
            self.order.assign(tf.concat(orders, 0))
            self.first.assign(first)

        self._refresh = refresh

    @staticmethod
    def epochs_for(examples_per_call: int, n: int) -> int:
        """Epochs a call of `examples_per_call` examples can touch, from any place in an epoch."""
        return 1 + math.ceil(examples_per_call / n)

    def ready(self, num_steps: int) -> None:
        """Holds the orders that the next `num_steps` batches read (a refresh only when the
        stream has moved past the first held epoch)."""
        s = self.stream
        position = int(s.position.numpy())
        first = position // s.n
        last = (position + num_steps * s.batch - 1) // s.n
        if last - first >= self.epochs:
            raise ValueError(
                f"a fused call of {num_steps} steps of {s.batch} spans {last - first + 1} epochs; "
                f"the stream holds {self.epochs}"
            )
        key = (int(s.seed.numpy()), first)  # a new run of the kept stream: another seed
        if self.key != key:
            self._refresh(tf.identity(s.seed), tf.constant(first, tf.int64))
            self.key = key

    def get_next(self):
        """The stream's next global batch, read from the held orders (traced into the call)."""
        s = self.stream
        n = tf.constant(s.n, tf.int64)
        places = s.position - self.first * n + tf.range(s.batch, dtype=tf.int64)
        index = tf.gather(self.order, places)
        with tf.control_dependencies([index]):
            s.position.assign_add(s.batch)
        return tf.gather(s.x, index), tf.gather(s.y, index)


def build_train_fn(stepper, held: HeldOrders):
    """The Stepper's host call (step.Stepper._build_train_fn's loop: lean steps, then the one
    with diagnostics, then the packed scalars), as one XLA program reading `held`'s batches."""
    lean = functools.partial(stepper._replica_step, diagnostics=False)
    full = functools.partial(stepper._replica_step, diagnostics=True)
    strategy = stepper.strategy

    @tf.function(autograph=False, jit_compile=True)
    def train_loop(num_steps):
        timing.note_trace()
        stepper._reset()

        def lean_step(i):
            strategy.run(lean, args=held.get_next())
            return i + 1

        tf.while_loop(lambda i: i < num_steps - 1, lean_step, [tf.constant(0)])
        strategy.run(full, args=held.get_next())
        return stepper._packed()

    def call(num_steps: int):
        held.ready(num_steps)
        return train_loop(tf.constant(num_steps, tf.int32))

    call.traced = train_loop  # what a reused build must not retrace
    return call


def train(stepper, stream, num_steps: int):
    """`num_steps` of the Stepper's fused call: its packed scalars (a tensor). The call is kept on
    the Stepper for its stream, and rebuilt (a new compile) only for a call that spans more epochs
    than its held orders."""
    epochs = HeldOrders.epochs_for(num_steps * stream.batch, stream.n)
    kept = stepper._fused_fn
    if kept is None or kept[0] is not stream or kept[1] < epochs:
        epochs = max(epochs, 2)
        call = build_train_fn(stepper, HeldOrders(stream, epochs))
        stepper._fused_fn = kept = (stream, epochs, call)
    return kept[2](num_steps)
