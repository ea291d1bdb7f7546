"""Owns the batch-norm statistics recompute (train.target_bn='recompute'): the moving statistics
set from a fixed training subset before the evaluations that judge the targets, then put back."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from wide_tf.engine import arrays, timing
from wide_tf.engine.models.norm import batch_norm_layers


def layer_stats(layer) -> tuple:
    """A batch-norm layer's moving statistics (the variables an inference-mode pass reads)."""
    return (layer.moving_mean, layer.moving_variance)


class BatchNormRecompute:
    """Batch-norm statistics recomputed from training data for the evaluations that judge the
    target (train.target_bn='recompute'), so that no moving-average lag enters steps-to-target.

    With momentum 0.9 the moving statistics are an average over the last ~10 steps' batches,
    computed with older weights: judged with them, a model reaches its target some steps after
    its weights could. Here, before an evaluation, the model runs in training mode over a fixed
    subset of the training set (the first train.target_bn_examples examples, in batches of
    train.target_bn_batch, the same for every batch size and learning rate) and each layer's
    moving mean and variance are set to the plain average of its per-batch statistics (for ghost
    batch norm, of its ghost groups' statistics); the evaluation then runs in inference mode as
    usual, and `restore` puts the training run's moving statistics back, so training is unchanged.

    Each batch's statistics are read by tracing the layers with momentum 0 (the layers read
    their momentum as a Python number while tracing; it is set back right after), so a batch's
    update replaces the moving statistics with that batch's statistics, which are summed. Like
    the gradient probe, the subset lives in variables on the devices and every replica runs the
    same batches (so the replicas' copies stay equal; checked on two CPU replicas with batch norm).
    One tf.function, traced once per model (kept with it across a study's learning rates).
    Cost: one training-mode forward pass over the subset per evaluation, and two compiled calls
    that keep and restore the (small) statistics on the devices: an evaluation of a WRN local
    member took 1.7-1.9x as long."""

    def __init__(self, config, model, strategy):
        t = config.train
        self.layers = batch_norm_layers(model)
        self.variables = [v for layer in self.layers for v in layer_stats(layer)]
        x, _ = arrays.load_arrays(config.data, "train", limit=t.target_bn_examples)
        batch = t.target_bn_batch  # at most len(x) (validate.py)
        self.num_batches = len(x) // batch
        self.examples = self.num_batches * batch
        x = np.asarray(x[: self.examples], np.float32).reshape(
            (self.num_batches, batch) + x.shape[1:]
        )
        with strategy.scope():
            self._x = tf.Variable(x, trainable=False)
            # The training run's statistics, kept on the devices while an evaluation uses the
            # recomputed ones (numpy copies and eager assigns were two host round trips per
            # variable per evaluation, and the restore was outside every timed kind).
            saved = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in self.variables
            ]
        layers, variables, k = self.layers, self.variables, self.num_batches

        def replica_batch_stats(i):
            """One batch in training mode with momentum 0: the moving statistics become the
            batch's (Python numbers read while tracing, set back right after)."""
            momenta = [layer.momentum for layer in layers]
            for layer in layers:
                layer.momentum = 0.0
            try:
                model(self._x[i], training=True)
            finally:
                for layer, m in zip(layers, momenta):
                    layer.momentum = m
            return [v.value + 0.0 for v in variables]  # read after the update (auto deps)

        @tf.function(autograph=False)
        def recompute():
            timing.note_trace()
            for keep, v in zip(saved, variables):  # before the loop (ordered on each variable)
                keep.assign(v.value)

            # The loop runs outside `strategy.run` (as the training loop does): ghost batch norm
            # all-reduces over replicas, which MirroredStrategy refuses inside replica control flow.
            def one(i, sums):
                stats = strategy.run(replica_batch_stats, args=(i,))
                stats = [strategy.reduce(tf.distribute.ReduceOp.MEAN, x, axis=None) for x in stats]
                return i + 1, [total + x for total, x in zip(sums, stats)]

            _, sums = tf.while_loop(
                lambda i, _: i < k, one, [tf.constant(0), [tf.zeros(v.shape) for v in variables]]
            )
            for v, total in zip(variables, sums):
                v.assign(total / k)

        @tf.function(autograph=False)
        def restore():
            timing.note_trace()
            for keep, v in zip(saved, variables):
                v.assign(keep.value())

        self._recompute, self._restore = recompute, restore

    def recompute(self) -> bool:
        """Sets the statistics from the training subset, the training run's kept on the devices;
        returns True: `restore` is due."""
        self._recompute()
        return True

    def restore(self, saved: bool = True) -> None:
        """The training run's statistics back (one compiled call)."""
        if saved:
            self._restore()
