"""Owns gradient accumulation: one replica's loss sum and gradients of its share of the global
batch, over micro-batches when the batch does not fit the device (train.max_device_batch), and
the norm layers' moving statistics stepped once per optimizer step from the step's statistics."""

from __future__ import annotations

import tensorflow as tf

from wide_tf.engine.loss import losses_and_hits
from wide_tf.engine.models import norm


def sq_norm(tensors) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors])


def loss_and_grads(model, plan, x, y, *, two_batch: bool, global_batch=None):
    """Sum of per-example losses divided by the GLOBAL batch, and its gradients, on one replica.

    Dividing by the global batch (as tf.nn.compute_average_loss does) makes the all-reduced sum
    of replica gradients the mean gradient of the whole batch, for any replica count. Returns
    (loss sum, correct, gradients, |micro-batch mean gradient|^2 averaged over micro-batches).
    `global_batch`: the divisor as a float32 variable (a step traced once for every batch size,
    engine/tf/step.py); None: the plan's, a constant of the trace."""
    variables = model.trainable_variables
    divisor = plan.global_batch if global_batch is None else global_batch

    def one(xb, yb):
        with tf.GradientTape() as tape:
            per_example, hits = losses_and_hits(model, xb, yb, training=True)
            loss = tf.reduce_sum(per_example) / divisor
        grads = tape.gradient(loss, variables)
        correct = tf.reduce_sum(hits)
        # |mean gradient of this micro-batch|^2: the "small batch" of the two-batch estimator,
        # only when there is a batch smaller than the global one to compare with.
        if two_batch:
            small_sq = sq_norm(grads) * (plan.global_batch / plan.micro_batch) ** 2
        else:
            small_sq = tf.constant(0.0)
        return tf.reduce_sum(per_example), correct, grads, small_sq

    if plan.num_micro_batches == 1:  # the layers step their own moving statistics
        return one(x, y)
    return _micro_batched(one, plan, x, y)


def _micro_batched(one, plan, x, y):
    """`one` summed over the micro-batches in a tf.while_loop; the norm layers' statistics of
    every micro-batch merged into the step's, then one moving-average step (and ghost batch
    norm's all-reduce, which MirroredStrategy refuses inside the loop) after the loop.

    Ghost batch norm: the mean over micro-batches of their mean ghost-group statistics is the
    mean over every group of the batch, what the un-split batch gives (each virtual batch lies
    inside one micro-batch, so the forward pass and weights are also the same). Batch norm: the
    micro-batches' means and variances are merged into the whole per-replica batch's mean and
    (biased) variance (Chan et al.'s pairwise update: the mean of the variances plus the variance
    of the means), i.e. the statistics an un-split pass would compute from the activations each
    layer saw; the normalisation itself uses each micro-batch's statistics, so the activations
    (beyond the first norm layer, and after the first step) and weights differ from an un-split
    batch's, as they always did."""
    m = plan.num_micro_batches
    xs = tf.reshape(x, [m, plan.micro_batch] + x.shape[1:].as_list())
    ys = tf.reshape(y, [m, plan.micro_batch])

    def traced(xb, yb):
        with norm.deferred_statistics() as recorded:
            out = one(xb, yb)
        return out, recorded

    first, recorded = traced(xs[0], ys[0])
    layers = [layer for layer, _, _ in recorded]

    def accumulate(i, totals, stats):  # the sum over micro-batches is the full-batch update
        (loss_i, c_i, g_i, s_i), rec_i = traced(xs[i], ys[i])
        if [layer for layer, _, _ in rec_i] != layers:
            raise RuntimeError("the norm layers ran in a different order in one micro-batch")
        loss_sum, correct, grads, small_sq = totals
        seen = tf.cast(i, tf.float32)
        stats = [
            _merge(layer, pair, (mean, var), seen)
            for layer, pair, (_, mean, var) in zip(layers, stats, rec_i)
        ]
        return (
            i + 1,
            (loss_sum + loss_i, correct + c_i, [a + b for a, b in zip(grads, g_i)], small_sq + s_i),
            stats,
        )

    _, (loss_sum, correct, grads, small_sq), stats = tf.while_loop(
        lambda i, *_: i < m,
        accumulate,
        (tf.constant(1), first, [[mean, var] for _, mean, var in recorded]),
    )
    norm.update_moving_statistics([(layer, *pair) for layer, pair in zip(layers, stats)])
    return loss_sum, correct, grads, small_sq / m


def _merge(layer, pair, new, seen):
    """The statistics of `seen` equal micro-batches (`pair`) and of one more (`new`)."""
    mean, var = pair
    new_mean, new_var = new
    delta = new_mean - mean
    merged_mean = mean + delta / (seen + 1.0)
    merged_var = (seen * var + new_var) / (seen + 1.0)
    if not isinstance(layer, norm.GhostBatchNormalization):  # the variance of the means, too
        merged_var = merged_var + tf.square(delta) * seen / tf.square(seen + 1.0)
    return [merged_mean, merged_var]
