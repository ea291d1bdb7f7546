"""A model of your own, registered from outside the package: an MLP whose hidden layers after the
first add their input back (x + ReLU(Dense(x))). The residual adds no parameter, so its exact count
is the plain MLP's, and the budget solver finds the same widths.

    python -m wide_tf.main --config=configs/mlp.py:local \\
        --config.model.arch=examples.residual_mlp --workdir=runs/resmlp_local

`model.arch` names this module (importable: run from the repository root, or put it on
PYTHONPATH); wide_tf imports it before the config checks and registers `SPEC` under that name
(wide_tf/schema/architectures.py, `ensure`). The module defines two things:

  SPEC         an Architecture (wide_tf.schema.architectures): the depths that exist, the exact
               parameter count, the solver's width grid, member names. No TensorFlow here: the
               checks before a run import it.
  build_model  (depth, width, num_classes, input_shape, norm, ghost_batch_size, name) -> a
               functional keras.Model with float32 logits and exactly SPEC.param_count weights.
               Keras is imported inside it, so the checks stay TensorFlow-free.
"""

from __future__ import annotations

from wide_tf.schema import architectures


class ResidualMLP(architectures.MLP):
    """The MLP's spec (same depths, count and width grid) under its own member names."""

    def member_name(self, depth, width) -> str:
        return f"resmlp-d{depth}-w{self.format_width(width)}"


SPEC = ResidualMLP()


def build_model(depth, width, num_classes, input_shape, norm, ghost_batch_size, name=None):
    import keras

    from wide_tf.engine.models import make_norm_layer

    SPEC.check_depth(depth)
    width = SPEC.canonical_width(width) if depth else int(width)
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = keras.layers.Flatten(name="flatten")(inputs)
    for i in range(1, depth + 1):
        norm_layer = make_norm_layer(norm, ghost_batch_size, name=f"norm_{i}")
        h = keras.layers.Dense(
            width, use_bias=norm_layer is None, kernel_initializer="he_normal", name=f"dense_{i}"
        )(x)
        if norm_layer is not None:
            h = norm_layer(h)
        h = keras.layers.ReLU(name=f"relu_{i}")(h)
        x = h if i == 1 else keras.layers.Add(name=f"residual_{i}")([x, h])
    x = keras.layers.Dense(num_classes, name="logits")(x)
    outputs = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(x)
    return keras.Model(inputs, outputs, name=name or SPEC.member_name(depth, width))
