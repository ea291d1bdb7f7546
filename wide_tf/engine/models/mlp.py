"""The fully-connected network of the width study: `depth` hidden ReLU layers of `width` units
(Keras layers only: any Keras backend)."""

from __future__ import annotations

import keras

from wide_tf.engine.models.norm import make_norm_layer
from wide_tf.schema.architectures import MLP_SPEC as MLP


def build_mlp(
    depth: int,
    width: int,
    num_classes: int,
    input_shape,
    norm: str = "none",
    ghost_batch_size: int = 32,
    name: str | None = None,
) -> keras.Model:
    """Flatten -> depth x [Dense(width) (-> norm) -> ReLU] -> Dense(num_classes) -> float32 logits.

    With a normalisation layer the hidden Dense layers have no bias: the norm subtracts the mean,
    which cancels a bias, and its beta plays that role (so no dead parameters are counted).
    `MLP.param_count` in wide_tf.schema.architectures is the closed form of the trainable count.
    """
    MLP.check_depth(depth)
    width = MLP.canonical_width(width) if depth else int(width)  # depth 0: width plays no part
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = keras.layers.Flatten(name="flatten")(inputs)
    for i in range(1, depth + 1):
        norm_layer = make_norm_layer(norm, ghost_batch_size, name=f"norm_{i}")
        x = keras.layers.Dense(
            width, use_bias=norm_layer is None, kernel_initializer="he_normal", name=f"dense_{i}"
        )(x)
        if norm_layer is not None:
            x = norm_layer(x)
        x = keras.layers.ReLU(name=f"relu_{i}")(x)
    x = keras.layers.Dense(num_classes, name="logits")(x)
    # The softmax / loss must see float32 logits also under a mixed_bfloat16 policy.
    outputs = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(x)
    return keras.Model(inputs, outputs, name=name or MLP.member_name(depth, width))
