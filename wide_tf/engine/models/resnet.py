"""Wide residual networks, CIFAR style (Zagoruyko & Komodakis 2016): WRN-depth-k, pre-activation
(Keras layers only: any Keras backend)."""

from __future__ import annotations

import keras

from wide_tf.engine.models.norm import make_norm_layer
from wide_tf.schema.architectures import WRN_SPEC as WRN


def _conv(filters, kernel, stride, name):
    # No bias: every conv feeds a normalisation layer (or, with norm='none', the count must match
    # the closed form in wide_tf.schema.architectures, which has none either).
    return keras.layers.Conv2D(
        filters,
        kernel,
        strides=stride,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
    )


def _norm_relu(x, norm, ghost_batch_size, name):
    layer = make_norm_layer(norm, ghost_batch_size, name=f"{name}_bn")
    if layer is not None:
        x = layer(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def _block(x, in_ch, out_ch, stride, norm, ghost_batch_size, name):
    """Pre-activation basic block: BN-ReLU-conv3x3-BN-ReLU-conv3x3 plus a shortcut."""
    act = _norm_relu(x, norm, ghost_batch_size, f"{name}_pre")
    y = _conv(out_ch, 3, stride, f"{name}_conv1")(act)
    y = _norm_relu(y, norm, ghost_batch_size, f"{name}_mid")
    y = _conv(out_ch, 3, 1, f"{name}_conv2")(y)
    if in_ch != out_ch or stride != 1:
        # As in the reference implementation, the projection sees the pre-activated input.
        shortcut = _conv(out_ch, 1, stride, f"{name}_shortcut")(act)
    else:
        shortcut = x
    return keras.layers.Add(name=f"{name}_add")([shortcut, y])


def build_wrn(
    depth: int,
    width: float,
    num_classes: int,
    input_shape,
    norm: str = "batch",
    ghost_batch_size: int = 32,
    name: str | None = None,
) -> keras.Model:
    """WRN-depth-k: 3x3 stem conv (16 ch), 3 groups of n=(depth-4)/6 blocks with round(16k),
    round(32k), round(64k) channels (strides 1, 2, 2), final BN-ReLU, global average pool, logits.

    `width` is the multiplier k and may be fractional (see `WideResNet.channels` in
    wide_tf.schema.architectures, whose `param_count` is the closed form of the trainable count).
    """
    n = WRN.blocks_per_group(depth)
    channels = WRN.channels(width)
    input_shape = tuple(input_shape)
    WRN.check_input_shape(input_shape)
    inputs = keras.Input(shape=input_shape, name="input")
    x = _conv(WRN.stem_channels, 3, 1, "stem_conv")(inputs)
    in_ch = WRN.stem_channels
    for g, (out_ch, stride) in enumerate(zip(channels, WRN.group_strides), start=1):
        for b in range(1, n + 1):
            x = _block(
                x,
                in_ch,
                out_ch,
                stride if b == 1 else 1,
                norm,
                ghost_batch_size,
                name=f"group{g}_block{b}",
            )
            in_ch = out_ch
    x = _norm_relu(x, norm, ghost_batch_size, "final")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dense(num_classes, name="logits")(x)
    # The softmax / loss must see float32 logits also under a mixed_bfloat16 policy.
    outputs = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(x)
    return keras.Model(inputs, outputs, name=name or WRN.member_name(depth, width))
