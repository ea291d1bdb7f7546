"""Model builders of the width study, one per architecture of `wide_tf.schema.architectures`.

`BUILDERS` maps an architecture's name to its Keras builder; the spec of the same name holds
everything that needs no TensorFlow (depth rules, exact parameter count, naming), and a test
checks that the two registries name the same architectures and that the counts agree. The builders
use Keras layers and keras.ops only: the same models build under the TensorFlow and the JAX Keras
backends (tests/engine/test_keras_ops_backends.py).
"""

from __future__ import annotations

import keras

from wide_tf.engine.models.mlp import build_mlp
from wide_tf.engine.models.norm import GhostBatchNormalization, make_norm_layer
from wide_tf.engine.models.resnet import build_wrn
from wide_tf.schema import architectures

__all__ = [
    "BUILDERS",
    "build_model",
    "build_mlp",
    "build_wrn",
    "GhostBatchNormalization",
    "make_norm_layer",
]

# Every builder takes (depth, width, num_classes, input_shape, norm, ghost_batch_size, name) and
# returns a functional Keras model with float32 logits.
BUILDERS = {
    architectures.MLP_SPEC.name: build_mlp,
    architectures.WRN_SPEC.name: build_wrn,
}


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
    """A functional Keras model with float32 logits, e.g. arch 'mlp' (width = units) or 'wrn'
    (width = widening factor k); `wide_tf.schema.families.param_count` is its exact trainable
    count."""
    spec = architectures.ensure(arch)  # a model from outside the package: its module's builder
    width = spec.canonical_width(width)
    build = BUILDERS.get(arch) or architectures.EXTERNAL[arch]
    return build(depth, width, num_classes, input_shape, norm, ghost_batch_size, name)
