"""Owns the one loss and the one hit of the package, in Keras 3's backend-neutral ops: the
per-example softmax cross-entropy from float32 logits (whatever the model's dtype policy) and
whether the arg-max class is the label. Training, evaluation, the gradient probe and the
per-example gradient norms all refer to these (under TensorFlow, keras.ops' cross-entropy is
tf.nn.sparse_softmax_cross_entropy_with_logits itself)."""

from __future__ import annotations

from keras import ops


def per_example_loss(labels, logits):
    """Sparse softmax cross-entropy per example, in float32."""
    return ops.sparse_categorical_crossentropy(
        ops.cast(labels, "int32"), ops.cast(logits, "float32"), from_logits=True
    )


def hits(labels, logits):
    """1.0 where the arg-max class of `logits` is the label, else 0.0 (per example)."""
    predicted = ops.argmax(logits, axis=-1)
    return ops.cast(ops.equal(predicted, ops.cast(labels, "int32")), "float32")


def losses_and_hits(model, x, y, training: bool):
    """Per-example losses and hits of `model` on (x, y)."""
    logits = ops.cast(model(x, training=training), "float32")
    return per_example_loss(y, logits), hits(y, logits)
