"""Model builders of the width study: `build_model` dispatches to the MLP and WRN builders."""

from __future__ import annotations

import keras

from wide_tf.models.mlp import build_mlp
from wide_tf.models.norm import GhostBatchNormalization, make_norm_layer
from wide_tf.models.resnet import build_wrn

__all__ = ["build_model", "build_mlp", "build_wrn", "GhostBatchNormalization", "make_norm_layer"]


def build_model(
    arch: str,
    depth: int,
    width: float,
    num_classes: int,
    input_shape,
    norm: str = "batch",
    ghost_batch_size: int = 32,
    name: str | None = None,
) -> keras.Model:
    """A functional Keras model with float32 logits: arch 'mlp' (width = units) or 'wrn' (width = k)."""
    if arch == "mlp":
        if float(width) != int(width):
            raise ValueError(f"an MLP's width is a number of units; got {width}")
        # Configs hold one width field for both architectures, so it may arrive as a float.
        return build_mlp(depth, int(width), num_classes, input_shape, norm, ghost_batch_size, name)
    if arch == "wrn":
        return build_wrn(depth, width, num_classes, input_shape, norm, ghost_batch_size, name)
    raise ValueError(f"arch must be 'mlp' or 'wrn', got {arch!r}")
