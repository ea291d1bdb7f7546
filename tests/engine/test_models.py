"""Tests for wide_tf.engine.models: WRN/MLP structure and counts, float32 logits, ghost batch
norm."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine.models import (
    BUILDERS,
    GhostBatchNormalization,
    build_mlp,
    build_model,
    build_wrn,
    make_norm_layer,
)
from wide_tf.schema import architectures, families

ALLOWED_LAYERS = {
    "InputLayer",
    "Flatten",
    "Dense",
    "Conv2D",
    "BatchNormalization",
    "StepBatchNormalization",  # batch norm whose moving statistics a step can defer
    "GhostBatchNormalization",
    "ReLU",
    "Add",
    "GlobalAveragePooling2D",
    "Activation",
}


def _trainable(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


@pytest.fixture
def bf16_policy():
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


def test_published_wrn_counts_keras():
    # Zagoruyko & Komodakis 2016, Table 1: WRN-28-10 has 36.5M parameters on CIFAR-10, WRN-40-1
    # 0.6M (published to one decimal; reference implementations count 563,930). The other
    # published sizes are pinned on the closed form in test_families.py.
    for depth, k, millions, exact in [(28, 10, 36.5, 36479194), (40, 1, 0.6, 563930)]:
        model = build_wrn(depth, k, 10, (32, 32, 3))
        count = _trainable(model)
        assert count == exact == families.param_count("wrn", depth, k, 10, (32, 32, 3))
        assert round(count / 1e6, 1) == millions
        del model
        keras.backend.clear_session()
    assert abs(36479194 / 36.5e6 - 1) < 0.01


def test_every_architecture_has_a_builder_and_its_default_name():
    assert set(BUILDERS) == set(architectures.names())
    for arch, spec in architectures.ARCHITECTURES.items():
        depth = spec.check_depth(10)  # a depth of every architecture here (WRN: 6n+4)
        width = spec.width_at(spec.min_width_index)
        model = build_model(arch, depth, width, 3, spec.default_input_shape, norm="none")
        assert model.name == spec.member_name(depth, width)
        keras.backend.clear_session()


@pytest.mark.parametrize(
    "arch,depth,width,shape,norm",
    [
        ("mlp", 0, 7, (8, 8, 1), "batch"),
        ("mlp", 1, 7, (8, 8, 1), "none"),
        ("mlp", 3, 5, (28, 28, 1), "batch"),
        ("mlp", 2, 16, (6,), "ghost"),
        ("wrn", 10, 1, (8, 8, 1), "batch"),
        ("wrn", 10, 0.04, (8, 8, 1), "none"),  # 1/1/3 channels: projections even where c1 == c2
        ("wrn", 10, 0.53, (28, 28, 1), "ghost"),  # fractional k: 8/17/34 channels
        ("wrn", 16, 1.37, (32, 32, 3), "batch"),
        ("wrn", 16, 0.25, (8, 8, 3), "none"),  # narrower than the stem: group 1 projects 16 -> 4
        ("wrn", 22, 1, (8, 8, 1), "ghost"),  # k = 1: group 1 has identity shortcuts only
    ],
)
def test_closed_form_equals_keras(arch, depth, width, shape, norm):
    model = build_model(arch, depth, width, 10, shape, norm=norm)
    assert _trainable(model) == families.param_count(arch, depth, width, 10, shape, norm)
    assert model.count_params() - _trainable(model) == sum(
        int(np.prod(v.shape)) for v in model.non_trainable_weights
    )


def test_wrn_structure():
    model = build_wrn(10, 1, 10, (8, 8, 1))
    kinds = {type(layer).__name__ for layer in model.layers}
    assert kinds <= ALLOWED_LAYERS
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert all(not c.use_bias for c in convs)
    names = [c.name for c in convs]
    # k = 1: group 1 keeps 16 channels and stride 1, so no projection there; groups 2 and 3 do.
    assert "group1_block1_shortcut" not in names
    assert {"group2_block1_shortcut", "group3_block1_shortcut"} <= set(names)
    assert model.get_layer("group2_block1_conv1").strides == (2, 2)
    assert model.get_layer("group3_block1_shortcut").kernel_size == (1, 1)
    assert model.get_layer("group3_block1_conv2").filters == 64
    assert isinstance(model.get_layer("final_bn"), keras.layers.BatchNormalization)
    assert model.layers[-1].name == "logits_float32"
    assert len({layer.name for layer in model.layers}) == len(model.layers)


def test_mlp_structure():
    model = build_mlp(2, 8, 3, (4, 4, 1), norm="ghost", ghost_batch_size=4)
    assert [type(layer).__name__ for layer in model.layers] == [
        "InputLayer",
        "Flatten",
        "Dense",
        "GhostBatchNormalization",
        "ReLU",
        "Dense",
        "GhostBatchNormalization",
        "ReLU",
        "Dense",
        "Activation",
    ]
    assert not model.get_layer("dense_1").use_bias  # the norm's beta is the bias
    assert build_mlp(2, 8, 3, (4, 4, 1)).get_layer("dense_1").use_bias


@pytest.mark.parametrize("arch,depth,width", [("wrn", 10, 0.5), ("mlp", 2, 16)])
@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28, 1), (8, 8, 1)])
def test_forward_shapes(arch, depth, width, shape):
    model = build_model(arch, depth, width, 7, shape, norm="ghost", ghost_batch_size=2)
    x = np.random.default_rng(0).normal(size=(4,) + shape).astype(np.float32)
    for training in (True, False):
        y = model(x, training=training)
        assert y.shape == (4, 7) and y.dtype == tf.float32
        assert np.all(np.isfinite(y.numpy()))


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="6n\\+4"):
        build_wrn(12, 1, 10, (32, 32, 3))
    with pytest.raises(ValueError, match="arch"):
        build_model("vgg", 10, 1, 10, (32, 32, 3))
    with pytest.raises(ValueError, match="norm"):
        build_mlp(1, 4, 10, (8,), norm="layer")
    with pytest.raises(ValueError, match="height, width, channels"):
        build_wrn(10, 1, 10, (64,))


@pytest.mark.parametrize(
    "arch,depth,width,norm",
    [("wrn", 10, 0.5, "ghost"), ("wrn", 10, 0.5, "batch"), ("mlp", 2, 16, "ghost")],
)
def test_float32_logits_under_mixed_bfloat16(bf16_policy, arch, depth, width, norm):
    model = build_model(arch, depth, width, 5, (8, 8, 1), norm=norm, ghost_batch_size=2)
    assert model.get_layer("logits").compute_dtype == "bfloat16"  # the policy is really active
    x = np.random.default_rng(1).normal(size=(4, 8, 8, 1)).astype(np.float32)
    with tf.GradientTape() as tape:
        y = model(x, training=True)
        loss = tf.reduce_mean(y**2)
    assert y.dtype == tf.float32
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None for g in grads)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            assert layer.moving_mean.dtype == "float32"


def test_policy_restored():
    # Runs after the bf16 tests in file order; guards the fixture against leaking the policy.
    assert keras.mixed_precision.global_policy().name == "float32"


# ---------------------------------------------------------------- ghost batch norm


def _ghost_reference(x, ghost, gamma, beta, eps):
    """NumPy: normalise each consecutive group of `ghost` examples by its own statistics."""
    x = x.astype(np.float64)
    out, means, variances = np.empty_like(x), [], []
    axes = tuple(range(x.ndim - 1))
    for start in range(0, len(x), ghost):
        g = x[start : start + ghost]
        mean, var = g.mean(axis=axes), g.var(axis=axes)
        out[start : start + ghost] = (g - mean) / np.sqrt(var + eps) * gamma + beta
        means.append(mean)
        variances.append(var)
    return out, np.mean(means, axis=0), np.mean(variances, axis=0)


def _ghost_layer(shape, ghost, seed=0):
    layer = GhostBatchNormalization(ghost_batch_size=ghost, momentum=0.9, epsilon=1e-5)
    layer.build((None,) + shape)
    rng = np.random.default_rng(seed)
    layer.gamma.assign(rng.uniform(0.5, 2, size=shape[-1]).astype(np.float32))
    layer.beta.assign(rng.normal(size=shape[-1]).astype(np.float32))
    return layer


@pytest.mark.parametrize("shape,batch,ghost", [((5,), 12, 4), ((3, 3, 4), 8, 2), ((2, 2, 3), 8, 8)])
def test_ghost_bn_matches_numpy(shape, batch, ghost):
    rng = np.random.default_rng(2)
    # Groups with very different offsets and scales, so whole-batch statistics would be far off.
    per_example = (batch,) + (1,) * len(shape)
    x = (
        rng.normal(size=(batch,) + shape) * rng.uniform(0.1, 5, size=per_example)
        + rng.normal(scale=10, size=per_example)
    ).astype(np.float32)
    layer = _ghost_layer(shape, ghost)
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    y = layer(x, training=True).numpy()
    ref, mean, var = _ghost_reference(x, ghost, gamma, beta, 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.1 * mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.9 + 0.1 * var, rtol=1e-4)
    # Inference uses the moving statistics (the same as Keras BatchNormalization with them).
    y_inf = layer(x, training=False).numpy()
    ref_inf = (x - layer.moving_mean.numpy()) / np.sqrt(
        layer.moving_variance.numpy() + 1e-5
    ) * gamma + beta
    np.testing.assert_allclose(y_inf, ref_inf, rtol=1e-4, atol=1e-4)


def test_ghost_bn_equals_bn_when_batch_fits_one_group():
    x = np.random.default_rng(3).normal(size=(6, 4, 4, 3)).astype(np.float32) * 3 + 1
    ghost = make_norm_layer("ghost", ghost_batch_size=6, name="g")
    bn = make_norm_layer("batch", name="b")
    for layer in (ghost, bn):
        layer.build(x.shape)
    np.testing.assert_allclose(ghost(x, training=True), bn(x, training=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ghost.moving_variance.numpy(), bn.moving_variance.numpy(), rtol=1e-5)
    assert len(ghost.trainable_weights) == len(bn.trainable_weights) == 2


def test_ghost_bn_example_independent_of_other_groups():
    rng = np.random.default_rng(4)
    a, b, c = (rng.normal(loc=m, size=(4, 3, 3, 2)).astype(np.float32) for m in (0, 5, -20))
    layer = _ghost_layer((3, 3, 2), ghost=4)
    y_ab = layer(np.concatenate([a, b]), training=True).numpy()[:4]
    y_ac = layer(np.concatenate([a, c]), training=True).numpy()[:4]
    y_a = layer(a, training=True).numpy()
    y_cba = layer(np.concatenate([c, b, a]), training=True).numpy()[8:]
    for y in (y_ac, y_a, y_cba):
        np.testing.assert_allclose(y, y_ab, rtol=1e-5, atol=1e-5)
    # Plain batch norm would not have this property (the test can tell the difference).
    bn = make_norm_layer("batch")
    assert not np.allclose(
        bn(np.concatenate([a, b]), training=True)[:4],
        bn(np.concatenate([a, c]), training=True)[:4],
        atol=1e-2,
    )


def test_ghost_bn_rejects_indivisible_batch():
    layer = _ghost_layer((3,), ghost=4)
    with pytest.raises(ValueError, match="not a multiple"):
        layer(np.zeros((6, 3), np.float32), training=True)  # static batch: caught while tracing

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def run(x):
        return layer(x, training=True)

    run(tf.zeros((8, 3)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="ghost_batch_size=4"):
        run(tf.zeros((6, 3)))


def test_ghost_bn_never_shrinks_the_virtual_batch():
    # A batch smaller than the ghost size used to become one smaller group (so the statistics
    # depended on the replica count); now it is an error, statically and in the graph.
    layer = _ghost_layer((3,), ghost=4)
    with pytest.raises(ValueError, match="not a multiple of ghost_batch_size=4"):
        layer(np.zeros((2, 3), np.float32), training=True)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def run(x):
        return layer(x, training=True)

    with pytest.raises(tf.errors.InvalidArgumentError, match="ghost_batch_size=4"):
        run(tf.zeros((2, 3)))
    layer(np.zeros((2, 3), np.float32), training=False)  # inference has no groups: fine


def test_ghost_bn_under_mirrored_strategy():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build_mlp(1, 3, 2, (4,), norm="ghost", ghost_batch_size=2)
    layer = model.get_layer("norm_1")
    x = np.random.default_rng(5).normal(size=(8, 4)).astype(np.float32)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(x).batch(8)
    )

    @tf.function
    def step(batch):
        return strategy.run(lambda b: model(b, training=True), args=(batch,))

    for batch in dataset:
        out = step(batch)
    # Each replica saw 4 examples = 2 ghost groups; outputs match the NumPy reference per group.
    h = x @ model.get_layer("dense_1").kernel.numpy()  # pre-norm activations (no bias)
    ref, mean, var = _ghost_reference(h, 2, np.ones(3), np.zeros(3), 1e-5)
    dense2 = model.get_layer("logits")
    expected = np.maximum(ref, 0) @ dense2.kernel.numpy() + dense2.bias.numpy()
    got = np.concatenate([t.numpy() for t in strategy.experimental_local_results(out)])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # The moving statistics are the mean over all 4 groups, and equal on both replicas.
    copies = [v.numpy() for v in strategy.experimental_local_results(layer.moving_mean.value)]
    for copy in copies:
        np.testing.assert_allclose(copy, 0.1 * mean, rtol=1e-4, atol=1e-6)


def test_ghost_bn_serialises():
    layer = GhostBatchNormalization(ghost_batch_size=16, momentum=0.9, name="g")
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(clone, GhostBatchNormalization) and clone.ghost_batch_size == 16
    with pytest.raises(ValueError, match="ghost_batch_size"):
        GhostBatchNormalization(ghost_batch_size=0)
