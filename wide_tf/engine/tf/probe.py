"""Owns the gradient probe: exact gradient diversity on a fixed probe set, compiled once per model
and measured on the devices every train.gradient_every_examples examples."""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from wide_tf.engine import arrays, timing
from wide_tf.engine.measure import diversity
from wide_tf.engine.tf import per_example


class GradientProbe:
    """Exact gradient diversity on a fixed probe set, measured every `every` examples.

    Compiled once per model (a tf.function over the probe's fixed chunks) and run through
    `strategy.run` on the devices, where the weights are: the probe set lives in variables there,
    every replica computes the same three sums (per-example squared norms, squared norm of the
    summed gradient, loss), and one packed tensor of three numbers comes back per measurement."""

    def __init__(self, config, model, strategy):
        self.every = config.train.gradient_every_examples
        size = config.train.probe_size
        chunk = config.train.probe_chunk
        x, y = arrays.load_arrays(config.data, "train", limit=size or None)
        self.n = len(y)
        engine = per_example.PerExampleGradients.for_model(model)
        # The chunks stacked in one variable each ([chunks, chunk, ...]) and walked by a device
        # loop: the chunk's forward and backward pass is traced once, not once per chunk (a
        # Python loop over 6 chunks traced it 6 times: the probe's trace cost more than a
        # member's training step and span together). The sums add in chunk order, as before.
        stacked = [
            np.stack(parts)
            for parts in zip(
                *(
                    (xb, yb, w)
                    for xb, yb, w, _ in per_example._chunks(
                        np.asarray(x, np.float32), np.asarray(y, np.int32), chunk
                    )
                )
            )
        ]
        with strategy.scope():
            chunks = tuple(tf.Variable(a, trainable=False) for a in stacked)
        num_chunks = len(stacked[0])

        def replica_sums():
            xs, ys, ws = (v.read_value() for v in chunks)

            def one_chunk(i, s1, loss, summed):
                sq, losses, grads = engine._chunk_impl(xs[i], ys[i], ws[i])
                summed = [a + b for a, b in zip(summed, grads)]
                return i + 1, s1 + tf.reduce_sum(sq), loss + tf.reduce_sum(losses), summed

            zeros = [tf.zeros(v.shape, tf.float32) for v in engine.variables]
            # One chunk at a time: the probe's memory is one chunk's activations, as the
            # per-chunk calls' was.
            _, s1, loss, summed = tf.while_loop(
                lambda i, *_: i < num_chunks,
                one_chunk,
                [tf.constant(0), tf.constant(0.0), tf.constant(0.0), zeros],
                parallel_iterations=1,
            )
            q = tf.add_n([tf.reduce_sum(tf.square(g)) for g in summed])
            return tf.stack([s1, q, loss])

        @tf.function(autograph=False)
        def sums():
            timing.note_trace()
            # Every replica holds the same weights and probe set: their mean is any one's value.
            return strategy.reduce(
                tf.distribute.ReduceOp.MEAN, strategy.run(replica_sums), axis=None
            )

        self._sums = sums

    def due(self, examples_before: int, examples_now: int) -> bool:
        return self.every > 0 and examples_now // self.every > examples_before // self.every

    def __call__(self, model=None) -> dict:
        with float32_matmuls():
            s1, q, _ = (float(v) for v in self._sums().numpy())
        stats = diversity.stats_from_norms([s1], q, n=self.n)
        return {k: float(stats[k]) for k in ("diversity", "batch_bound", "noise_scale")}


@contextlib.contextmanager
def float32_matmuls():
    """TensorFloat-32 off inside (restored after): the probe's float32 matmuls and convolutions
    then run in float32 on Ampere+ GPUs (cuBLAS/cuDNN read the flag per kernel) and at XLA's
    HIGHEST precision on TPUs (read when the probe is compiled, on its first call, which runs
    inside too), not at TF32 or bf16 precision."""
    enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(enabled)
