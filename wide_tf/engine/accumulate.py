"""Owns gradient accumulation: one replica's loss sum and gradients of its share of the global
batch, over micro-batches when the batch does not fit the device (train.max_device_batch)."""

from __future__ import annotations

import keras
import tensorflow as tf


def sq_norm(tensors) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors])


def losses_and_hits(model, x, y, training: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-example cross-entropy (from float32 logits, whatever the model's dtype policy) and
    per-example hits (1.0 where the arg-max class is the label) of `model` on (x, y)."""
    logits = tf.cast(model(x, training=training), tf.float32)
    losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    predicted = tf.argmax(logits, -1, output_type=tf.int32)
    hits = tf.cast(tf.equal(predicted, tf.cast(y, tf.int32)), tf.float32)
    return losses, hits


def loss_and_grads(model, plan, x, y, *, two_batch: bool):
    """Sum of per-example losses divided by the GLOBAL batch, and its gradients, on one replica.

    Dividing by the global batch (as tf.nn.compute_average_loss does) makes the all-reduced sum
    of replica gradients the mean gradient of the whole batch, for any replica count. Returns
    (loss sum, correct, gradients, |micro-batch mean gradient|^2 averaged over micro-batches)."""
    variables = model.trainable_variables

    def one(xb, yb):
        with tf.GradientTape() as tape:
            per_example, hits = losses_and_hits(model, xb, yb, training=True)
            loss = tf.reduce_sum(per_example) / plan.global_batch
        grads = tape.gradient(loss, variables)
        correct = tf.reduce_sum(hits)
        # |mean gradient of this micro-batch|^2: the "small batch" of the two-batch estimator,
        # only when there is a batch smaller than the global one to compare with.
        if two_batch:
            small_sq = sq_norm(grads) * (plan.global_batch / plan.micro_batch) ** 2
        else:
            small_sq = tf.constant(0.0)
        return tf.reduce_sum(per_example), correct, grads, small_sq

    if plan.num_micro_batches == 1:
        return one(x, y)
    m = plan.num_micro_batches
    xs = tf.reshape(x, [m, plan.micro_batch] + x.shape[1:].as_list())
    ys = tf.reshape(y, [m, plan.micro_batch])
    first = one(xs[0], ys[0])

    def accumulate(i, totals):  # the sum over micro-batches is the full-batch update
        loss_i, c_i, g_i, s_i = one(xs[i], ys[i])
        loss_sum, correct, grads, small_sq = totals
        return i + 1, (
            loss_sum + loss_i,
            correct + c_i,
            [a + b for a, b in zip(grads, g_i)],
            small_sq + s_i,
        )

    _, (loss_sum, correct, grads, small_sq) = tf.while_loop(
        lambda i, _: i < m, accumulate, (tf.constant(1), first)
    )
    return loss_sum, correct, grads, small_sq / m
