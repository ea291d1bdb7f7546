"""Owns the span of one CPU replica: several evaluation intervals in one call of TensorFlow's
executor, each the Stepper's host loop (its lean steps, then the one with diagnostics) followed by
the bounded pass over the training set held on the device, the evaluation economy's snapshot taken
on the device when a pass stops early; the call ends at the first pass that goes whole (a target
may be met there: the host checks it), a diverged step or its last interval.

Why: at the local study's cadence (an evaluation every 144 examples) a host call ran one to 36
steps and a pass, and the round trip between them (the call, its read, the host's bookkeeping)
cost as much as the steps at the larger batches (docs/benchmarks.md, "Spans"). The ops are the
ones the per-interval calls run, in the same order, so every number is the same
(tests/engine/test_span.py); only the round trips between the intervals are gone."""

from __future__ import annotations

import functools
import math

import tensorflow as tf

from wide_tf.engine import timing
from wide_tf.engine.tf.stream import InMemoryTrainStream


def applies(stepper, stream, held_set: bool) -> bool:
    """Whether a span serves this run: the executor's loop (neither the fused XLA loop nor XLA
    around the step) on one replica reading the in-memory stream, its training set held on the
    device and passed by the executor (`held_set`: step.DeviceEvalSet, not the TPU's in-replica
    pass nor XLA's), and no two-batch noise estimate (the host updates it from every call's
    sums)."""
    return (
        held_set
        and not stepper.fused
        and not stepper.jit_compile
        and not stepper._two_batch
        and stepper.strategy.num_replicas_in_sync == 1
        and isinstance(stream, InMemoryTrainStream)
    )


def run(stepper, stream, eval_set, snapshot, lengths, bound, last_pass: bool = True) -> dict:
    """Up to len(lengths) evaluation intervals in one call, the k-th of lengths[k] steps, each
    followed by `eval_set`'s pass under `bound` (engine/evaluation.bound; `last_pass` False: the
    last interval's pass is the host's). The trace is kept on the Stepper for its stream, set and
    snapshot. Returns {scalars (the last interval's, as Stepper.train's), intervals (run), sums
    (the last pass's), evaluated (the examples of all its passes), examples (the set's)}: one
    device read."""
    key = (stream, eval_set, snapshot)
    if stepper._span_fn is None or stepper._span_fn[0] != key:
        stepper._span_fn = (key, build(stepper, stream, eval_set, snapshot))
    lo, hi = (-math.inf, math.inf) if bound is None else bound
    packed = stepper._span_fn[1](
        tf.constant(lengths, tf.int32),
        tf.constant([lo, hi, float(eval_set.num_examples)], tf.float32),
        tf.constant(bool(last_pass)),
    ).numpy()
    k = len(stepper.scalar_names) + 3
    return {
        "scalars": stepper._unpack(packed[:k]),
        "sums": tuple(float(v) for v in packed[k : k + 3]),
        "intervals": int(packed[k + 3]),
        "evaluated": float(packed[k + 4]),
        "examples": eval_set.num_examples,
    }


def build(stepper, stream, eval_set, snapshot):
    """The span as one traced function of (lengths: int32 [K], bound: float32 [3], last_pass:
    bool): the k-th interval runs lengths[k] steps; `last_pass` False leaves the last interval's
    pass to the host (a curve step, a probe before it), so one interval is one `train` call and a
    run that spans trains with this function alone. Returns the Stepper's packed scalars of the
    last interval, the last pass's [loss sum, hits, examples], the intervals run and the
    examples its passes evaluated."""
    lean = functools.partial(stepper._replica_step, diagnostics=False)
    full = functools.partial(stepper._replica_step, diagnostics=True)
    size = float(eval_set.num_examples)

    def hold():
        snapshot._take()
        return tf.constant(True)

    # One trace for every count of intervals (a vector of any length).
    @tf.function(
        autograph=False,
        input_signature=[
            tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([3], tf.float32),
            tf.TensorSpec([], tf.bool),
        ],
    )
    def span(lengths, bound, last_pass):
        timing.note_trace()

        def interval(k, stop, sums, evaluated):
            num_steps = lengths[k]
            stepper._reset()

            def lean_step(i):
                stepper.strategy.run(lean, args=stream.get_next())
                return i + 1

            tf.while_loop(lambda i: i < num_steps - 1, lean_step, [tf.constant(0)])
            stepper.strategy.run(full, args=stream.get_next())
            # A diverged interval is not evaluated (the host loop stops there).
            passes = tf.logical_and(
                tf.logical_not(stepper.diverged.read_value()),
                tf.logical_or(k < tf.size(lengths) - 1, last_pass),
            )
            sums = tf.cond(passes, lambda: eval_set.sums(bound), lambda: tf.zeros([3], tf.float32))
            cut = tf.logical_and(passes, sums[2] < size)
            with tf.control_dependencies([tf.cond(cut, hold, lambda: tf.constant(False))]):
                evaluated = evaluated + sums[2]
            return k + 1, tf.logical_not(cut), sums, evaluated

        k, _, sums, evaluated = tf.while_loop(
            lambda k, stop, sums, evaluated: tf.logical_and(
                k < tf.size(lengths), tf.logical_not(stop)
            ),
            interval,
            [tf.constant(0), tf.constant(False), tf.zeros([3], tf.float32), tf.constant(0.0)],
        )
        return tf.concat(
            [stepper._packed(), sums, tf.stack([tf.cast(k, tf.float32), evaluated])], 0
        )

    return span
