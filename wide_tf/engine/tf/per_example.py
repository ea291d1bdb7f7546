"""Per-example squared gradient norms of a Keras functional model from one forward and one
backward pass.

The fast path replays the model's functional graph itself. Every layer with trainable weights is
re-computed from its own variables by the rule for its type (Dense, Conv2D, batch norm; in
float32, whatever the mixed-precision policy), and the replay keeps each such layer's input and its
(pre-activation) output. One backward pass of the summed loss then gives the gradient d of the
loss with respect to every recorded output (only those: the weight gradients summed over the batch
are formed from the same x and d, so none is computed twice), and each example's squared gradient
norm follows in closed form (docs/science.md, "Per-example gradient norms"):

* Dense on rank-2 inputs: grad_W = x d^T, so |grad_W|^2 = |x|^2 |d|^2 and |grad_b|^2 = |d|^2.
* Conv2D (and Dense on inputs with extra position axes): grad_W = sum_t x_t d_t^T over positions
  t, with x_t the im2col patch. Its squared norm is either sum_{t,s} (x_t.x_s)(d_t.d_s) (two Gram
  matrices, "ghost norm", O(T^2 (K + C)) per example) or |X^T D|^2 with the per-example gradient
  formed (O(T K C)); the cheaper one is picked per layer from the static shapes.
* Batch normalization is measured in INFERENCE MODE (``training=False``: moving mean and
  variance). In training mode the batch statistics couple the examples and a per-example gradient
  is not defined; in inference mode grad_gamma_c = sum_t xhat_{t,c} d_{t,c} and
  grad_beta_c = sum_t d_{t,c}. The sum gradient returned alongside is the gradient of the same
  inference-mode loss, so every quantity derived from both (diversity, noise scale) refers to one
  and the same function.

The rules go by layer type, never by architecture: any functional model made of these layers and
parameter-free ones is measured. Supporting another layer type is one more `_LayerRule` in
`_RULES`.

The loss is the per-example sparse softmax cross-entropy on the logits, f_i = CE(y_i, logits_i),
not divided by the number of examples (diversity and noise scale are invariant to that scale).

Two slow references are kept for tests and benchmarks: vectorised jacobians of the per-example
losses (``per_example_gradients_reference``) and a plain Python loop of one gradient per example
(``per_example_grad_sq_norms_naive``). Both run the model itself (``model(x, training=False)``), so
they share no code with the replay.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from wide_tf.engine.loss import per_example_loss
from wide_tf.engine.measure.diversity import stats_from_norms
from wide_tf.schema.problems import UsageError


class UnsupportedModelError(UsageError):
    """The model holds a layer with trainable weights that the fast path cannot handle."""


def _f32(v):
    return tf.cast(v.value if hasattr(v, "value") else v, tf.float32)


def _trainable(layer, var) -> bool:
    return var is not None and layer.trainable and getattr(var, "trainable", False)


# -- one rule per layer type -------------------------------------------------------------------


@dataclasses.dataclass
class _Record:
    """What the replay keeps of one parameterised layer: its input, output and its rule."""

    layer: Any
    rule: _LayerRule
    x: tf.Tensor  # layer input (float32); for BN the normalised input xhat
    z: tf.Tensor  # pre-activation output, watched by the tape
    has_kernel: bool  # kernel / gamma trainable
    has_bias: bool  # bias / beta trainable


class _LayerRule:
    """How the replay computes one type of layer with trainable weights, and the per-example
    squared norm of the gradient of those weights."""

    description: str  # the layer types, as the unsupported-layer message lists them

    def matches(self, layer) -> bool:
        raise NotImplementedError

    def check(self, layer) -> None:
        """Raises UnsupportedModelError for a configuration of the layer that the rule cannot do."""

    def forward(self, layer, inp) -> tuple[tf.Tensor, tf.Tensor, Any, bool, bool]:
        """(what to record as x, the pre-activation output z, the activation applied to z or None,
        kernel trainable, bias trainable) for the float32 input `inp`."""
        raise NotImplementedError

    def stats(self, rec: _Record, d) -> tuple[tf.Tensor, list]:
        """Per-example squared gradient norm of the layer's trainable weights given d = dL/dz, and
        the batch-summed gradient of each of them as [(variable, gradient)].

        The summed gradients come from the same inputs and output gradients (for the direct conv
        branch, as the sum of the per-example gradients already formed), so the backward pass
        differentiates only with respect to the recorded outputs and no weight gradient is
        computed twice.
        """
        raise NotImplementedError


def _positions_sq_norm(xs, ds, want_sum=False):
    """Per-example |sum_t x_t d_t^T|^2 for xs (B, T, K), ds (B, T, C); cheaper of Gram and direct.

    With ``want_sum`` also returns the batch-summed weight gradient sum_b sum_t x_t d_t^T (K, C).
    """
    t, k, c = xs.shape[1], xs.shape[2], ds.shape[2]
    if t is not None and t * (k + c) < k * c:
        # Ghost norm: sum_{t,s} (x_t.x_s)(d_t.d_s); T^2 (K + C) flops per example instead of T K C.
        gx = tf.matmul(xs, xs, transpose_b=True)
        gd = tf.matmul(ds, ds, transpose_b=True)
        sq = tf.reduce_sum(gx * gd, axis=[1, 2])
        if not want_sum:
            return sq
        return sq, tf.matmul(tf.reshape(xs, [-1, k]), tf.reshape(ds, [-1, c]), transpose_a=True)
    grad = tf.matmul(xs, ds, transpose_a=True)  # (B, K, C): the per-example weight gradient
    sq = tf.reduce_sum(tf.square(grad), axis=[1, 2])
    return (sq, tf.reduce_sum(grad, axis=0)) if want_sum else sq


class _KernelRule(_LayerRule):
    """A kernel and an optional bias: z = linear(x) + bias, then the layer's own activation, and
    grad_W = sum_t x_t d_t^T over the positions t of `patches(x)`."""

    def linear(self, layer, inp, kernel):
        raise NotImplementedError

    def patches(self, layer, x):
        """(B, T, K): the input at each of the T positions the kernel is applied to."""
        raise NotImplementedError

    def forward(self, layer, inp):
        z = self.linear(layer, inp, _f32(layer.kernel))
        if layer.bias is not None:
            z = z + _f32(layer.bias)
        has_k, has_b = _trainable(layer, layer.kernel), _trainable(layer, layer.bias)
        return inp, z, layer.activation, has_k, has_b

    def stats(self, rec, d):
        layer = rec.layer
        batch = tf.shape(d)[0]
        out = tf.zeros([batch], tf.float32)
        sums = []
        xs = self.patches(layer, rec.x)
        ds = tf.reshape(d, [batch, -1, d.shape[-1]])
        if rec.has_kernel:
            if xs.shape[1] == 1:  # one position (Dense on rank-2 input): |x|^2 |d|^2
                x2, d2 = xs[:, 0, :], ds[:, 0, :]
                out += tf.reduce_sum(tf.square(x2), axis=1) * tf.reduce_sum(tf.square(d2), axis=1)
                kernel_sum = tf.matmul(x2, d2, transpose_a=True)
            else:
                sq, kernel_sum = _positions_sq_norm(xs, ds, want_sum=True)
                out += sq
            # im2col patches are ordered (kh, kw, cin), the kernel's own row-major layout.
            sums.append((layer.kernel, tf.reshape(kernel_sum, layer.kernel.shape)))
        if rec.has_bias:
            g = tf.reduce_sum(ds, axis=1)
            out += tf.reduce_sum(tf.square(g), axis=1)
            sums.append((layer.bias, tf.reduce_sum(g, axis=0)))
        return out, sums


class _Conv2D(_KernelRule):
    description = "Conv2D"
    _SUBCLASSES = (
        keras.layers.Conv2DTranspose,
        keras.layers.DepthwiseConv2D,
        keras.layers.SeparableConv2D,
    )

    def matches(self, layer):
        return isinstance(layer, keras.layers.Conv2D) and not isinstance(layer, self._SUBCLASSES)

    def check(self, layer):
        if layer.data_format != "channels_last" or layer.groups != 1:
            raise UnsupportedModelError(
                f"Conv2D layer '{layer.name}': only channels_last, groups=1 is supported "
                f"(data_format={layer.data_format}, groups={layer.groups})."
            )
        if getattr(layer, "lora_enabled", False):
            raise UnsupportedModelError(f"Conv2D layer '{layer.name}': LoRA is not supported.")

    def linear(self, layer, inp, kernel):
        return tf.nn.convolution(
            inp,
            kernel,
            strides=list(layer.strides),
            padding=layer.padding.upper(),
            dilations=list(layer.dilation_rate),
        )

    def patches(self, layer, x):
        """im2col patches (B, T, kh*kw*cin) of a channels_last input, with the layer's padding."""
        kh, kw = layer.kernel_size
        sh, sw = layer.strides
        dh, dw = layer.dilation_rate
        if (kh, kw, sh, sw, dh, dw) == (1, 1, 1, 1, 1, 1):
            patches = x
        else:
            patches = tf.image.extract_patches(
                x,
                sizes=[1, kh, kw, 1],
                strides=[1, sh, sw, 1],
                rates=[1, dh, dw, 1],
                padding=layer.padding.upper(),
            )
        shape = tf.shape(patches)
        return tf.reshape(patches, [shape[0], -1, patches.shape[-1]])


class _Dense(_KernelRule):
    description = "Dense"

    def matches(self, layer):
        return isinstance(layer, keras.layers.Dense)

    def check(self, layer):
        if getattr(layer, "lora_enabled", False):
            raise UnsupportedModelError(f"Dense layer '{layer.name}': LoRA is not supported.")

    def linear(self, layer, inp, kernel):
        return tf.tensordot(inp, kernel, axes=[[inp.shape.rank - 1], [0]])

    def patches(self, layer, x):
        return tf.reshape(x, [tf.shape(x)[0], -1, x.shape[-1]])


class _BatchNorm(_LayerRule):
    """Batch norm in inference mode: z = gamma * xhat + beta with the moving statistics."""

    description = "BatchNormalization and GhostBatchNormalization"
    # GhostBatchNormalization (wide_tf/engine/models/norm.py) is matched by class name so this
    # module does not import the model package (and works with any layer of that name that exposes
    # BN's attributes): in inference mode it normalises with its moving statistics exactly like BN.
    _CLASS_NAMES = ("BatchNormalization", "GhostBatchNormalization")

    def matches(self, layer):
        return (
            isinstance(layer, keras.layers.BatchNormalization)
            or type(layer).__name__ in self._CLASS_NAMES
        )

    def check(self, layer):
        axis = layer.axis
        axis = axis if isinstance(axis, int) else (axis[0] if len(axis) == 1 else None)
        rank = len(layer.input.shape) if hasattr(layer, "input") else None
        if axis is None or (axis != -1 and (rank is None or axis != rank - 1)):
            raise UnsupportedModelError(
                f"batch-norm layer '{layer.name}': only normalisation over the last axis is "
                f"supported (axis={layer.axis})."
            )

    def forward(self, layer, inp):
        mean, var = _f32(layer.moving_mean), _f32(layer.moving_variance)
        xhat = (inp - mean) * tf.math.rsqrt(var + layer.epsilon)
        z = xhat
        if layer.gamma is not None:
            z = z * _f32(layer.gamma)
        if layer.beta is not None:
            z = z + _f32(layer.beta)
        has_k, has_b = _trainable(layer, layer.gamma), _trainable(layer, layer.beta)
        return xhat, z, None, has_k, has_b

    def stats(self, rec, d):
        layer = rec.layer
        batch = tf.shape(d)[0]
        out = tf.zeros([batch], tf.float32)
        sums = []
        c = d.shape[-1]
        xhat = tf.reshape(rec.x, [batch, -1, c])
        d3 = tf.reshape(d, [batch, -1, c])
        if rec.has_kernel:  # gamma
            g = tf.reduce_sum(xhat * d3, axis=1)
            out += tf.reduce_sum(tf.square(g), axis=1)
            sums.append((layer.gamma, tf.reduce_sum(g, axis=0)))
        if rec.has_bias:  # beta
            g = tf.reduce_sum(d3, axis=1)
            out += tf.reduce_sum(tf.square(g), axis=1)
            sums.append((layer.beta, tf.reduce_sum(g, axis=0)))
        return out, sums


_RULES: tuple[_LayerRule, ...] = (_Conv2D(), _Dense(), _BatchNorm())


def _rule_for(layer) -> _LayerRule | None:
    return next((rule for rule in _RULES if rule.matches(layer)), None)


# -- the graph ---------------------------------------------------------------------------------


def _functional_graph(model):
    """The keras Functional object whose graph is replayed (a Sequential model wraps one)."""
    if isinstance(model, keras.Sequential):
        graph = getattr(model, "_functional", None)
        if graph is None:
            raise UnsupportedModelError(
                "Sequential model has no functional graph yet: give it an Input (or build it) "
                "first."
            )
        return graph
    if not hasattr(model, "_run_through_graph") or not hasattr(model, "_nodes_by_depth"):
        raise UnsupportedModelError(
            f"per-example gradient norms need a Keras functional (or Sequential) model; got "
            f"{type(model).__name__} (a subclassed model's graph cannot be replayed)."
        )
    return model


def _check_supported(model, graph) -> list:
    """Check every layer with trainable weights has a rule and is used once; return those layers."""
    layers = []
    counts: dict[int, int] = {}
    for node_list in graph._nodes_by_depth.values():
        for node in node_list:
            if node.operation is not None and not node.is_input:
                counts[id(node.operation)] = counts.get(id(node.operation), 0) + 1
    for op in graph.operations:
        if not getattr(op, "trainable_weights", None):
            continue
        rule = _rule_for(op)
        if rule is None:
            supported = ", ".join(r.description for r in _RULES)
            raise UnsupportedModelError(
                f"layer '{op.name}' of type {type(op).__name__} has trainable weights, but "
                f"per-example gradient norms support only {supported} layers with trainable "
                f"weights (parameter-free layers of any type are fine)."
            )
        if counts.get(id(op), 0) != 1:
            raise UnsupportedModelError(
                f"layer '{op.name}' is called {counts.get(id(op), 0)} times in the graph; a shared "
                f"layer's per-example gradient is a sum over its uses and is not supported."
            )
        rule.check(op)
        layers.append(op)
    covered = {id(v) for layer in layers for v in layer.trainable_weights}
    missing = [v.path for v in model.trainable_variables if id(v) not in covered]
    if missing:
        raise UnsupportedModelError(
            f"trainable variables not reached by the supported layers of the graph: {missing}"
        )
    return layers


class PerExampleGradients:
    """Compiled fast path for one model: per-example squared gradient norms and the sum gradient.

    Build once per model (``for_model`` caches it) and call ``chunk(x, y, weights)`` on chunks of a
    fixed size; examples with weight 0 are padding (their loss, gradient and norm are 0).
    Batch norm is evaluated in inference mode (moving statistics); see the module docstring.
    """

    def __init__(self, model, jit_compile: bool = False):
        self.model = model
        self.graph = _functional_graph(model)
        if len(self.graph.inputs) != 1 or len(tf.nest.flatten(self.graph.outputs)) != 1:
            raise UnsupportedModelError(
                "per-example gradients need a model with one input and one output"
            )
        self.layers = _check_supported(model, self.graph)
        self.variables = list(model.trainable_variables)
        self._fns: dict = {}
        self._jit_compile = jit_compile

    # -- the replay -------------------------------------------------------------------------------
    def _forward(self, x, tape):
        """Run the graph in float32 and inference mode, recording every parameterised layer."""
        records: list[_Record] = []

        def call_fn(op, *args, **kwargs):
            rule = _rule_for(op) if getattr(op, "weights", None) else None
            if rule is None:
                if getattr(op, "trainable_weights", None):  # _check_supported refused these
                    raise UnsupportedModelError(f"unsupported layer '{op.name}'")
                # Layer.call skips __call__'s autocasting, so mixed-precision models stay float32.
                if isinstance(op, keras.layers.Layer) and getattr(
                    op, "_call_has_training_arg", False
                ):
                    kwargs = dict(kwargs, training=False)
                return op.call(*args, **kwargs)
            (inp,) = args
            rec_x, z, act, has_k, has_b = rule.forward(op, tf.cast(inp, tf.float32))
            if has_k or has_b:
                tape.watch(z)
                records.append(_Record(op, rule, rec_x, z, has_k, has_b))
            return act(z) if act is not None else z

        logits = self.graph._run_through_graph([x], operation_fn=lambda op: op, call_fn=call_fn)
        return tf.nest.flatten(logits)[0], records

    def _chunk_impl(self, x, y, weights):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            logits, records = self._forward(tf.cast(x, tf.float32), tape)
            losses = per_example_loss(y, logits) * weights
            total = tf.reduce_sum(losses)
        grads = tape.gradient(total, [r.z for r in records])
        sq = tf.zeros_like(losses)
        by_var = {}
        for rec, d in zip(records, grads):
            if d is None:  # output not connected to the loss: zero gradient
                continue
            rec_sq, sums = rec.rule.stats(rec, d)
            sq += rec_sq
            by_var.update({id(v): g for v, g in sums})
        sum_grads = [by_var.get(id(v), tf.zeros(v.shape, tf.float32)) for v in self.variables]
        return sq, losses, sum_grads

    def chunk(self, x, y, weights):
        """(per-example sq norms (B,), weighted per-example losses (B,), summed gradients)."""
        key = (tuple(x.shape), str(x.dtype))
        fn = self._fns.get(key)
        if fn is None:
            # autograph=False: the chunk has no tensor-dependent Python control flow, and
            # converting the model's and Keras' code on every trace cost ~2 s per training run.
            fn = tf.function(
                self._chunk_impl,
                jit_compile=self._jit_compile,
                reduce_retracing=True,
                autograph=False,
            )
            self._fns[key] = fn
        return fn(x, y, weights)

    @classmethod
    def for_model(cls, model, jit_compile: bool = False) -> PerExampleGradients:
        """The cached instance for this model (rebuilt if its trainable variables changed)."""
        entry = _CACHE.get(model)
        if (
            entry is None
            or entry._jit_compile != jit_compile
            or [id(v) for v in entry.variables] != [id(v) for v in model.trainable_variables]
        ):
            entry = cls(model, jit_compile=jit_compile)
            _CACHE[model] = entry
        return entry


_CACHE: weakref.WeakKeyDictionary[Any, PerExampleGradients] = weakref.WeakKeyDictionary()


def _chunks(x, y, chunk_size):
    """Fixed-shape chunks (x, y, weights, n_real); the last is padded with weight-0 examples."""
    n = len(x)
    size = max(1, min(int(chunk_size), n))
    for start in range(0, n, size):
        xb, yb = x[start : start + size], y[start : start + size]
        real = len(xb)
        w = np.ones([size], np.float32)
        if real < size:  # pad to the fixed shape so the compiled function is traced once
            pad = size - real
            xb = np.concatenate([xb, np.zeros((pad,) + xb.shape[1:], xb.dtype)])
            yb = np.concatenate([yb, np.zeros((pad,), yb.dtype)])
            w[real:] = 0.0
        yield xb, yb, w, real


def run_chunks(model, x, y, chunk_size: int = 256, jit_compile: bool = False):
    """Per-example sq norms (n,), per-example losses (n,) and the summed gradient (a list), all
    float64 NumPy.

    The sum gradient is accumulated over chunks in float64 on the host.
    """
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.int32).reshape(-1)
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"need as many labels as examples and at least one (x: {len(x)}, y: {len(y)})"
        )
    engine = PerExampleGradients.for_model(model, jit_compile=jit_compile)
    sq_all, loss_all = [], []
    sum_grads = [np.zeros(v.shape, np.float64) for v in engine.variables]
    for xb, yb, w, real in _chunks(x, y, chunk_size):
        sq, losses, grads = engine.chunk(tf.constant(xb), tf.constant(yb), tf.constant(w))
        sq_all.append(sq.numpy()[:real].astype(np.float64))
        loss_all.append(losses.numpy()[:real].astype(np.float64))
        for acc, g in zip(sum_grads, grads):
            acc += g.numpy()
    return np.concatenate(sq_all), np.concatenate(loss_all), sum_grads


def per_example_grad_sq_norms(
    model, x, y, chunk_size: int = 256, jit_compile: bool = False
) -> np.ndarray:
    """|g_i|^2 (sum over all trainable variables) for every example, fast path; float64 (n,).

    Batch norm is measured in inference mode (moving statistics).
    """
    return run_chunks(model, x, y, chunk_size, jit_compile)[0]


# -- references --------------------------------------------------------------------------------


def per_example_gradients_reference(model, x, y) -> list[np.ndarray]:
    """Per-example gradients by vectorised jacobians of the per-example losses (slow, plain).

    Runs ``model(x, training=False)`` (batch norm in inference mode, so examples are independent
    and row i of the jacobian is grad f_i). Returns one (n, *var.shape) float64 array per trainable
    variable.
    """
    x = tf.constant(np.asarray(x, np.float32))
    y = tf.constant(np.asarray(y, np.int32).reshape(-1))
    variables = model.trainable_variables

    @tf.function
    def jac(x, y):
        with tf.GradientTape(persistent=True) as tape:
            losses = per_example_loss(y, model(x, training=False))
        return tape.jacobian(losses, variables, experimental_use_pfor=True)

    return [j.numpy().astype(np.float64) for j in jac(x, y)]


def per_example_grad_sq_norms_reference(model, x, y) -> np.ndarray:
    """|g_i|^2 from ``per_example_gradients_reference``; float64 (n,)."""
    grads = per_example_gradients_reference(model, x, y)
    return sum(np.sum(g.reshape(len(g), -1) ** 2, axis=1) for g in grads)


def per_example_grad_sq_norms_naive(model, x, y) -> np.ndarray:
    """|g_i|^2 by one gradient per example in a Python loop (the baseline the fast path replaces).

    The per-example step is compiled once (fixed shape (1, ...)); batch norm in inference mode.
    """
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.int32).reshape(-1)
    variables = model.trainable_variables

    @tf.function
    def one(xi, yi):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(per_example_loss(yi, model(xi, training=False)))
        grads = tape.gradient(loss, variables)
        return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads])

    return np.array(
        [float(one(tf.constant(x[i : i + 1]), tf.constant(y[i : i + 1]))) for i in range(len(x))],
        np.float64,
    )


def gradient_stats(
    model, x, y, chunk_size: int = 256, jit_compile: bool = False, return_per_example: bool = False
) -> dict:
    """Exact diversity, batch bound and noise scale of ``model`` on the probe set (x, y).

    One forward and one backward pass per chunk of ``chunk_size`` examples (memory stays bounded;
    the last chunk is padded with weight-0 examples so the compiled function is traced once per
    model). Batch norm is in inference mode. Returns the keys listed in measure/diversity.py's
    docstring plus ``mean_loss`` (mean probe cross-entropy) and, if ``return_per_example``,
    ``per_example_sq_norms`` (float64 array). Computed in float32 whatever the mixed-precision
    policy (sums in float64 on the host). Call it outside ``strategy.run`` (it is a host-side
    measurement).
    """
    sq, losses, sum_grads = run_chunks(model, x, y, chunk_size, jit_compile)
    q = float(sum(np.sum(g * g) for g in sum_grads))
    out = stats_from_norms(sq, q)
    out["mean_loss"] = float(np.mean(losses))
    if return_per_example:
        out["per_example_sq_norms"] = sq
    return out
