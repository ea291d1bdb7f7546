"""Normalisation layers for the model builders: batch norm, ghost batch norm, or none; their
moving statistics updated once per optimizer step when a step is split into micro-batches.

Written in keras.ops, so the same layers run under the TensorFlow and the JAX Keras backends.
TensorFlow is imported only inside the branches that need it under that backend: the replica
all-reduce of tf.distribute (`_replica_mean`) and the graph assert on a dynamic batch
(`GhostBatchNormalization._num_groups`); under JAX every shape is static and the replica mean is
the caller's (`update_moving_statistics(recorded, reduce_mean=...)`)."""

from __future__ import annotations

import contextlib
import threading

import keras
from keras import ops

from wide_tf.schema.architectures import check_norm

# Moving-average momentum and epsilon shared by batch norm and ghost batch norm, so that switching
# between them changes only how training-mode statistics are grouped. Momentum 0.9 (not Keras's
# 0.99) because CPU-scale studies train for a few hundred steps, and with 0.99 the moving
# statistics used at evaluation would still be mostly their initial values.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5

# The micro-batch accumulation (engine/tf/accumulate.py) traces each micro-batch inside
# `deferred_statistics()`; the norm layers then record their training statistics there instead of
# stepping their moving averages, which accumulate.py updates once per optimizer step. Thread-local:
# MirroredStrategy traces each replica's step in its own thread. Plain Python: under JAX the same
# context around a `stateless_call` records that call's (traced) statistics.
_DEFERRED = threading.local()


@contextlib.contextmanager
def deferred_statistics():
    """While tracing inside it, the training-mode norm layers append (layer, mean, variance) to
    the yielded list, in call order, and leave their moving statistics alone."""
    recorded: list = []
    stack = _DEFERRED.__dict__.setdefault("stack", [])
    stack.append(recorded)
    try:
        yield recorded
    finally:
        stack.pop()


def _record(layer, mean, variance) -> bool:
    """Records a layer's step statistics when a deferred trace is open; False when none is."""
    stack = getattr(_DEFERRED, "stack", None)
    if not stack:
        return False
    stack[-1].append((layer, mean, variance))
    return True


def _replica_mean():
    """The mean over the replicas of a tf.distribute strategy, as a function of a list of tensors,
    or None with one replica or another backend. TensorFlow imported here: tf.distribute's replica
    context has no keras.ops form, and only the TensorFlow backend runs inside one."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return None
    return lambda values: ctx.all_reduce(tf.distribute.ReduceOp.MEAN, values)


def _step_moving(layer, mean, variance) -> None:
    """One moving-average step of a layer's statistics (in float32, as Keras's own update)."""
    m = layer.momentum
    layer.moving_mean.assign(ops.cast(layer.moving_mean, "float32") * m + mean * (1.0 - m))
    layer.moving_variance.assign(
        ops.cast(layer.moving_variance, "float32") * m + variance * (1.0 - m)
    )


def update_moving_statistics(recorded, reduce_mean=None) -> None:
    """One moving-average step per layer from its step statistics (layer, mean, variance), in
    replica context: ghost batch norm's averaged over replicas first (as its own update does),
    batch norm's per replica (as Keras's does).

    `reduce_mean` maps a list of [mean, variance] pairs to their means over replicas (say
    `jax.lax.pmean` over a mapped axis); None: tf.distribute's replica context under TensorFlow,
    no reduction otherwise. Under JAX, call it inside a `keras.StatelessScope` to collect the new
    moving statistics as that scope's assignments."""
    ghosts = [i for i, (layer, _, _) in enumerate(recorded) if _is_ghost(layer)]
    stats = [[mean, variance] for _, mean, variance in recorded]
    reduce_mean = reduce_mean or (_replica_mean() if ghosts else None)
    if reduce_mean is not None and ghosts:  # one all-reduce for every ghost layer, outside loops
        reduced = reduce_mean([stats[i] for i in ghosts])
        for i, pair in zip(ghosts, reduced):
            stats[i] = pair
    for (layer, _, _), (mean, variance) in zip(recorded, stats):
        _step_moving(layer, mean, variance)


def _is_ghost(layer) -> bool:
    return isinstance(layer, GhostBatchNormalization)


def _normalize(x, mean, variance, offset, scale, epsilon):
    """tf.nn.batch_normalization's formula, its ops in its order and under its name scope, for
    statistics that broadcast against `x`: ghost batch norm's keep a group axis, which
    ops.batch_normalization's JAX form (statistics reshaped onto one axis) does not take. The
    scope is not cosmetic: inside a tf.function the same ops without it gave a gradient 1 ulp
    apart (Grappler, TensorFlow's graph optimiser, sees op names: with it switched off, no
    difference); with it, the graph and its numbers are tf.nn.batch_normalization's, bit for
    bit."""
    with keras.name_scope("batchnorm"):
        inv = ops.rsqrt(variance + epsilon)
        if scale is not None:
            inv = inv * scale
        return x * inv + (offset - mean * inv if offset is not None else -mean * inv)


@keras.saving.register_keras_serializable(package="wide_tf")
class StepBatchNormalization(keras.layers.BatchNormalization):
    """Keras's BatchNormalization, whose training statistics can be recorded instead of stepping
    the moving averages (inside `deferred_statistics()`, one micro-batch of a step); outside it,
    Keras's layer unchanged."""

    def call(self, inputs, training=None, mask=None):
        deferred = getattr(_DEFERRED, "stack", None)
        if not (deferred and training and self.trainable) or mask is not None or self.renorm:
            return super().call(inputs, training=training, mask=mask)
        x = ops.cast(inputs, "float32")  # as Keras does: statistics in float32
        mean, variance = self._moments(x, None)
        _record(self, mean, variance)
        out = ops.batch_normalization(
            x=x,
            mean=mean,
            variance=variance,
            axis=self.axis,
            offset=ops.cast(self.beta, "float32") if self.center else None,
            scale=ops.cast(self.gamma, "float32") if self.scale else None,
            epsilon=self.epsilon,
        )
        return ops.cast(out, self.compute_dtype)


@keras.saving.register_keras_serializable(package="wide_tf")
class GhostBatchNormalization(keras.layers.BatchNormalization):
    """Batch norm whose training statistics come from fixed-size virtual ("ghost") batches.

    Hoffer et al. 2017. In training, the (per-replica) batch is split into consecutive groups of
    `ghost_batch_size` examples and each group is normalised with its own mean and variance, so an
    example's normalisation does not change when the batch grows. The batch must be a multiple of
    `ghost_batch_size` (one group or more): the virtual batch is never shrunk to fit a smaller
    batch, since that would make the statistics depend on the replica count (train.py rejects such
    a configuration before training; here it is checked while tracing, or in the graph). The
    moving statistics are updated with the mean over groups of the group means and variances
    (averaged over replicas too, under a multi-replica strategy), once per optimizer step also when
    the step is split into micro-batches (engine/tf/accumulate.py); inference uses them exactly like
    BatchNormalization. The weights (gamma, beta, moving_mean, moving_variance) are those of
    BatchNormalization, so parameter counts and checkpoints line up, and code that handles
    BatchNormalization in inference mode handles this layer too.
    Statistics are computed in float32 under mixed precision.
    """

    def __init__(self, ghost_batch_size: int = 32, **kwargs):
        super().__init__(**kwargs)
        if (
            isinstance(ghost_batch_size, bool)
            or int(ghost_batch_size) != ghost_batch_size
            or ghost_batch_size < 1
        ):
            raise ValueError(
                f"ghost_batch_size must be a positive integer, got {ghost_batch_size!r}"
            )
        self.ghost_batch_size = int(ghost_batch_size)

    def build(self, input_shape):
        super().build(input_shape)
        # Channels-last only: the grouping reshapes the leading (batch) axis and reduces every
        # other axis except the last.
        if self.axis not in (-1, len(input_shape) - 1):
            raise ValueError(f"GhostBatchNormalization supports axis=-1 only, got {self.axis}")

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable):  # inference: moving statistics, as in BN
            return super().call(inputs, training=training, mask=mask)
        if mask is not None:
            raise ValueError("GhostBatchNormalization does not support masks in training")
        x = ops.cast(inputs, "float32")  # statistics in float32, also under mixed precision
        num_groups, group = self._num_groups(x), self.ghost_batch_size
        shape = ops.shape(x)
        grouped = ops.reshape(x, (num_groups, group) + tuple(shape[1:]))
        axes = list(range(1, len(x.shape)))  # within a group: examples and spatial positions
        mean, variance = ops.moments(grouped, axes=axes, keepdims=True)
        gamma = self.gamma if self.scale else None
        beta = self.beta if self.center else None
        out = _normalize(
            grouped,
            mean,
            variance,
            offset=None if beta is None else ops.cast(beta, "float32"),
            scale=None if gamma is None else ops.cast(gamma, "float32"),
            epsilon=self.epsilon,
        )
        out = ops.reshape(out, shape)
        # Moving statistics from the mean of the group statistics (each group has the same size,
        # so this is also the mean over examples of the batch).
        channels = x.shape[-1]
        group_mean = ops.mean(ops.reshape(mean, (-1, channels)), axis=0)
        group_var = ops.mean(ops.reshape(variance, (-1, channels)), axis=0)
        if _record(self, group_mean, group_var):  # one micro-batch of a step: updated after it
            return ops.cast(out, self.compute_dtype)
        # Under a multi-replica strategy each replica holds its own copy of the moving statistics;
        # averaging over replicas keeps the copies equal (Keras's BatchNormalization lets them
        # drift apart) and makes them the mean over every ghost group of the global batch.
        # (Another backend's replicas: deferred_statistics and update_moving_statistics with its
        # own reduce_mean.)
        reduce_mean = _replica_mean()
        if reduce_mean is not None:
            group_mean, group_var = reduce_mean([group_mean, group_var])
        _step_moving(self, group_mean, group_var)
        return ops.cast(out, self.compute_dtype)

    def _num_groups(self, x):
        """How many virtual batches `x` holds: a Python int when the batch is static (checked
        while tracing, no assert in the graph: TPUs and XLA; always so under JAX), else a tensor
        behind an assert."""
        g = self.ghost_batch_size
        static_batch = x.shape[0]
        if static_batch is not None:
            if static_batch % g:
                raise ValueError(
                    f"{self.name}: a (per-replica) batch of {static_batch} is not a multiple of "
                    f"ghost_batch_size={g}; the virtual batch is never shrunk, so lower "
                    f"model.ghost_batch_size or raise the batch"
                )
            return static_batch // g
        # Dynamic batch (CPU and GPU without XLA; train.py also rejects such a batch): only the
        # TensorFlow backend traces one, and only TensorFlow's graph has a run-time assert.
        import tensorflow as tf

        batch = tf.shape(x)[0]
        check = tf.debugging.assert_equal(
            batch % g,
            0,
            message=(
                f"{self.name}: the per-replica batch must be a multiple of ghost_batch_size={g}"
            ),
        )
        with tf.control_dependencies([check]):
            return batch // g

    def get_config(self):
        return {**super().get_config(), "ghost_batch_size": self.ghost_batch_size}


def make_norm_layer(norm: str, ghost_batch_size: int = 32, name: str | None = None):
    """A (Step)BatchNormalization ('batch'), GhostBatchNormalization ('ghost') or None ('none')."""
    check_norm(norm)
    if norm == "none":
        return None
    if norm == "batch":
        return StepBatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name)
    return GhostBatchNormalization(  # norm == "ghost"
        ghost_batch_size=ghost_batch_size, momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name
    )


def batch_norm_layers(model) -> list:
    """Every batch-norm layer of `model` (ghost batch norm included), nested ones too."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
