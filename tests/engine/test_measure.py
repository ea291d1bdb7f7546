"""Tests for wide_tf.engine.measure: fast per-example norms vs jacobian and loop references, the
stats, the noise scale."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine.loss import per_example_loss
from wide_tf.engine.measure import diversity, noise_scale
from wide_tf.engine.tf import per_example

RTOL = 1e-4


def _randomise_bn(model, rng):
    """Give every BN layer non-trivial moving statistics and affine parameters (not 0/1)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.normal(0, 0.3, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype(np.float32))
            if layer.gamma is not None:
                layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            if layer.beta is not None:
                layer.beta.assign(rng.normal(0, 0.2, c).astype(np.float32))


def make_mlp(use_bias=True, bn=False, seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((10,))
    h = keras.layers.Dense(16, use_bias=use_bias)(inp)
    if bn:
        h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Dense(12, activation="relu", use_bias=use_bias)(
        h
    )  # activation inside the layer
    out = keras.layers.Dense(5, use_bias=use_bias)(h)
    model = keras.Model(inp, out)
    _randomise_bn(model, np.random.default_rng(seed))
    return model


def make_convnet(use_bias=False, bn=True, size=8, seed=0):
    """A small pre-activation WRN-like net: strided conv, 1x1 projection shortcut, Add, GAP, and a
    late layer with few positions so the Gram ("ghost norm") branch is used as well as the direct
    one."""
    keras.utils.set_random_seed(seed)
    conv = lambda c, k=3, s=1: keras.layers.Conv2D(
        c, k, strides=s, padding="same", use_bias=use_bias
    )
    norm = (
        (lambda: keras.layers.BatchNormalization())
        if bn
        else (lambda: keras.layers.Activation("linear"))
    )
    inp = keras.Input((size, size, 3))
    h = conv(4)(inp)
    a = keras.layers.ReLU()(norm()(h))
    r = conv(8, 3, 2)(a)
    r = conv(8)(keras.layers.ReLU()(norm()(r)))
    h = keras.layers.Add()([r, conv(8, 1, 2)(a)])
    h = keras.layers.ReLU()(norm()(h))
    h = conv(16, 3, 2)(h)
    h = keras.layers.Activation("relu")(h)
    h = conv(16)(h)  # 2x2 positions, K = 144, C = 16: the Gram branch
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(norm()(h)))
    out = keras.layers.Activation("linear", dtype="float32")(keras.layers.Dense(5)(h))
    model = keras.Model(inp, out)
    _randomise_bn(model, np.random.default_rng(seed))
    return model


def _data(shape, n=12, seed=1, classes=5):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n,) + shape).astype(np.float32), rng.integers(0, classes, n).astype(
        np.int32
    )


MODELS = {
    "mlp": lambda: make_mlp(),
    "mlp-nobias": lambda: make_mlp(use_bias=False),
    "mlp-bn": lambda: make_mlp(bn=True),
    "conv-bn-nobias": lambda: make_convnet(),
    "conv-bias-nobn": lambda: make_convnet(use_bias=True, bn=False),
    "conv-odd-size": lambda: make_convnet(use_bias=True, size=9),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fast_norms_match_jacobian_reference_and_brute_force_stats(name):
    model = MODELS[name]()
    x, y = _data(tuple(model.input_shape[1:]))
    ref_grads = per_example.per_example_gradients_reference(model, x, y)
    ref_sq = sum(np.sum(g.reshape(len(g), -1) ** 2, axis=1) for g in ref_grads)
    # chunk_size 5 on 12 examples: two full chunks and a padded one.
    sq, _, sum_grads = per_example.run_chunks(model, x, y, chunk_size=5)
    np.testing.assert_allclose(sq, ref_sq, rtol=RTOL)
    for s, g in zip(sum_grads, ref_grads):
        np.testing.assert_allclose(s, g.sum(axis=0), rtol=1e-3, atol=1e-6 * np.abs(g).max())
    stats = per_example.gradient_stats(model, x, y, chunk_size=5)
    brute = diversity.stats_from_per_example_gradients(ref_grads)
    for key in (
        "diversity",
        "batch_bound",
        "noise_scale",
        "trace_cov",
        "mean_grad_sq_norm",
        "sum_sq_norms",
    ):
        np.testing.assert_allclose(stats[key], brute[key], rtol=RTOL, err_msg=key)
    # batch_bound = noise_scale + 1, with the noise scale from an explicitly formed 1/n covariance.
    np.testing.assert_allclose(stats["batch_bound"], brute["noise_scale"] + 1.0, rtol=RTOL)
    assert stats["n"] == len(x) and 1.0 / len(x) <= stats["diversity"]


def test_naive_loop_agrees_and_chunking_does_not_matter():
    model = make_convnet(use_bias=True)
    x, y = _data((8, 8, 3), n=7)
    naive = per_example.per_example_grad_sq_norms_naive(model, x, y)
    fast_whole = per_example.per_example_grad_sq_norms(model, x, y, chunk_size=64)
    fast_chunked = per_example.per_example_grad_sq_norms(model, x, y, chunk_size=3)
    np.testing.assert_allclose(fast_whole, naive, rtol=RTOL)
    np.testing.assert_allclose(fast_chunked, naive, rtol=RTOL)


def test_positions_norm_branches_match_numpy():
    rng = np.random.default_rng(0)
    for t, k, c in [(4, 144, 16), (64, 27, 4)]:  # Gram branch, direct branch
        xs = rng.normal(size=(3, t, k)).astype(np.float32)
        ds = rng.normal(size=(3, t, c)).astype(np.float32)
        want = np.sum(np.einsum("btk,btc->bkc", xs.astype(np.float64), ds) ** 2, axis=(1, 2))
        got = per_example._positions_sq_norm(tf.constant(xs), tf.constant(ds)).numpy()
        np.testing.assert_allclose(got, want, rtol=RTOL)


def test_dense_on_sequence_and_sequential_model():
    """Dense on a rank-3 input sums over positions like a 1x1 conv; Sequential models work."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((6, 4)),
            keras.layers.Dense(7, activation="tanh"),
            keras.layers.Flatten(),
            keras.layers.Dense(5),
        ]
    )
    x, y = _data((6, 4), n=6)
    np.testing.assert_allclose(
        per_example.per_example_grad_sq_norms(model, x, y),
        per_example.per_example_grad_sq_norms_reference(model, x, y),
        rtol=RTOL,
    )


def test_unsupported_layer_is_named():
    inp = keras.Input((10,))
    h = keras.layers.LayerNormalization(name="ln")(keras.layers.Dense(8)(inp))
    model = keras.Model(inp, keras.layers.Dense(3)(h))
    with pytest.raises(per_example.UnsupportedModelError, match="'ln' of type LayerNormalization"):
        per_example.gradient_stats(model, *_data((10,), classes=3))


def test_shared_layer_is_refused():
    inp = keras.Input((5,))
    dense = keras.layers.Dense(5)
    model = keras.Model(inp, dense(dense(inp)))
    with pytest.raises(per_example.UnsupportedModelError, match="called 2 times"):
        per_example.per_example_grad_sq_norms(model, *_data((5,)))


def test_frozen_layer_is_excluded():
    model = make_mlp(bn=True)
    model.layers[1].trainable = False  # first Dense frozen: its weights are not trainable variables
    x, y = _data((10,))
    np.testing.assert_allclose(
        per_example.per_example_grad_sq_norms(model, x, y),
        per_example.per_example_grad_sq_norms_reference(model, x, y),
        rtol=RTOL,
    )


def test_stats_identity_and_scale_invariance():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(20, 7)) + 0.3
    s = diversity.stats_from_per_example_gradients([g])
    s3 = diversity.stats_from_per_example_gradients([3.0 * g])
    assert s["batch_bound"] == pytest.approx(s["noise_scale"] + 1.0, rel=1e-12)
    assert s3["diversity"] == pytest.approx(s["diversity"], rel=1e-12)
    # Identical gradients: no noise, diversity 1/n, batch bound 1.
    same = diversity.stats_from_per_example_gradients([np.ones((10, 3))])
    assert same["batch_bound"] == pytest.approx(1.0) and same["noise_scale"] == pytest.approx(
        0.0, abs=1e-12
    )


# -- two-batch noise scale -----------------------------------------------------------------------


def _flat_ref_grads(n, seed=0):
    model = make_mlp(seed=seed)
    x, y = _data((10,), n=n, seed=seed + 1)
    grads = per_example.per_example_gradients_reference(model, x, y)
    return np.concatenate([g.reshape(n, -1) for g in grads], axis=1)


def _two_batch_norms(flat, rng, steps, b_small, replicas):
    """Per step: mean over replicas of |local mean grad|^2 and |global mean grad|^2, sampling
    examples with replacement from the population of per-example gradients (via their Gram matrix:
    cheap)."""
    gram = flat @ flat.T
    idx = rng.integers(0, len(flat), size=(steps, replicas, b_small))
    local = gram[idx[..., :, None], idx[..., None, :]].sum(axis=(-1, -2)) / b_small**2
    flat_idx = idx.reshape(steps, -1)
    big = (
        gram[flat_idx[:, :, None], flat_idx[:, None, :]].sum(axis=(-1, -2)) / flat_idx.shape[1] ** 2
    )
    return local.mean(axis=1), big


def test_two_batch_single_step_estimates_are_unbiased_for_the_1_over_n_covariance():
    n = 6  # small population: the 1/n and 1/(n-1) covariances differ by 20%
    flat = _flat_ref_grads(n)
    mean = flat.mean(axis=0)
    trace_n = float(np.sum((flat - mean) ** 2)) / n
    g2_est, s_est = noise_scale.two_batch_estimates(
        *_two_batch_norms(flat, np.random.default_rng(0), 40000, 4, 4), 4, 16
    )
    g2_est, s_est = np.asarray(g2_est), np.asarray(s_est)
    assert np.mean(s_est) == pytest.approx(trace_n, rel=0.03)
    assert abs(np.mean(s_est) - trace_n * n / (n - 1)) > 0.1 * trace_n
    assert np.mean(g2_est) == pytest.approx(float(mean @ mean), rel=0.05)


def test_two_batch_ema_approaches_exact_noise_scale():
    n = 64
    flat = _flat_ref_grads(n, seed=2)
    exact = diversity.stats_from_per_example_gradients([flat])["noise_scale"]
    est = noise_scale.TwoBatchNoiseScale(decay=0.999)
    assert est.value is None
    g_small, g_big = _two_batch_norms(flat, np.random.default_rng(1), 6000, 8, 4)
    for gs, gb in zip(g_small, g_big):
        est.update(gs, gb, 8, 32)
    assert est.value == pytest.approx(exact, rel=0.1)
    # Checkpoint round trip through JSON.
    clone = noise_scale.TwoBatchNoiseScale.from_dict(json.loads(json.dumps(est.state)))
    assert clone.value == est.value and clone.count == 6000


def test_two_batch_bias_correction_and_ratio_of_averages():
    est = noise_scale.TwoBatchNoiseScale(decay=0.9)
    g2, s = noise_scale.two_batch_estimates(2.0, 1.5, 2, 8)
    # By hand: G2 = (8*1.5 - 2*2)/6, S = 0.5/(1/2 - 1/8).
    assert (g2, s) == pytest.approx(((12 - 4) / 6, 0.5 / 0.375))
    est.update(2.0, 1.5, 2, 8)
    assert est.value == pytest.approx(s / g2)  # bias correction: one update gives exactly that step
    est.update(3.0, 1.0, 2, 8)
    g2b, sb = noise_scale.two_batch_estimates(3.0, 1.0, 2, 8)
    w = np.array([0.9 * 0.1, 0.1]) / (1 - 0.9**2)
    assert est.value == pytest.approx((w @ [s, sb]) / (w @ [g2, g2b]))
    with pytest.raises(ValueError):
        est.update(1.0, 1.0, 8, 8)


def test_two_batch_estimator_agrees_with_the_exact_probe_within_its_noise():
    """On a small model: the exact per-example B_simple of a probe set (the engine's norms), and
    the two-batch estimator from real mini-batch gradients (4 micro-batches of 8 drawn with
    replacement from the same set, |G|^2 and tr(Sigma) averaged before the ratio) agree within
    3 standard errors of the estimator; and n x diversity = 1 + B_simple on the same gradients,
    B_simple from the explicit per-example gradients."""
    n, micro, parts, steps = 64, 8, 4, 1000
    model = make_mlp(seed=3)
    x, y = _data((10,), n=n, seed=4)
    sq = per_example.per_example_grad_sq_norms(model, x, y)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(per_example_loss(y, model(x)))
    summed = tape.gradient(total, model.trainable_variables)
    q = float(sum(np.sum(np.square(g.numpy().astype(np.float64))) for g in summed))
    exact = diversity.stats_from_norms(sq, q, n=n)
    flat = np.concatenate(
        [g.reshape(n, -1) for g in per_example.per_example_gradients_reference(model, x, y)],
        axis=1,
    )
    mean = flat.mean(axis=0)
    b_simple = float(np.sum((flat - mean) ** 2)) / n / float(mean @ mean)
    assert exact["batch_bound"] == pytest.approx(1.0 + b_simple, rel=RTOL)
    assert exact["noise_scale"] == pytest.approx(b_simple, rel=RTOL)

    xs, ys = tf.constant(x), tf.constant(y)

    @tf.function
    def norms(idx):  # idx: (parts, micro) example indices of one step
        local = []
        for k in range(parts):
            with tf.GradientTape() as tape:
                logits = model(tf.gather(xs, idx[k]))
                loss = tf.reduce_mean(per_example_loss(tf.gather(ys, idx[k]), logits))
            local.append(tape.gradient(loss, model.trainable_variables))
        big = [tf.add_n(gs) / parts for gs in zip(*local)]
        sq_norm = lambda gs: tf.add_n([tf.reduce_sum(tf.square(g)) for g in gs])
        return tf.reduce_mean(tf.stack([sq_norm(gs) for gs in local])), sq_norm(big)

    rng = np.random.default_rng(0)
    small, big = np.array(
        [[float(v) for v in norms(rng.integers(0, n, (parts, micro)))] for _ in range(steps)]
    ).T
    est, se = noise_scale.averaged_estimate(small, big, micro, micro * parts)
    assert se < 0.1 * b_simple  # the check has teeth: the noise is small against the value
    print(f"two-batch {est:.4g} +- {se:.2g} (1 se), exact {b_simple:.4g}")
    assert abs(est - b_simple) < 3 * se, (est, se, b_simple)


def test_averaged_estimate_by_hand():
    # Two steps: G2 = (8 x 1.5 - 2 x 2) / 6 = 4/3 and (8 x 1 - 2 x 3) / 6 = 1/3; S = 0.5 / 0.375
    # = 4/3 and 2 / 0.375 = 16/3. Means 5/6 and 10/3: ratio of means 4 (the mean of the single-step
    # ratios, 1 and 16, would be 8.5).
    value, se = noise_scale.averaged_estimate([2.0, 3.0], [1.5, 1.0], 2, 8)
    assert value == pytest.approx(4.0)
    # Residuals S - 4 G2: 4/3 - 16/3 = -4 and 16/3 - 4/3 = 4; sd sqrt(32), / (sqrt(2) x 5/6)
    assert se == pytest.approx(math.sqrt(32) / (math.sqrt(2) * 5 / 6))
    with pytest.raises(ValueError):
        noise_scale.averaged_estimate([2.0], [1.5], 2, 8)


def test_package_models_wrn_and_ghost_mlp():
    """The package's own builders (pre-activation WRN with BN, MLP with ghost BN) against the
    reference."""
    from wide_tf.engine.models import build_model

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    for args in [
        ("wrn", 10, 0.5, 4, (8, 8, 3), "batch", 4),
        ("mlp", 2, 16, 4, (6, 6, 1), "ghost", 4),
    ]:
        model = build_model(*args)
        _randomise_bn(model, rng)
        x, y = _data(args[4], n=6, classes=4)
        np.testing.assert_allclose(
            per_example.per_example_grad_sq_norms(model, x, y, chunk_size=4),
            per_example.per_example_grad_sq_norms_reference(model, x, y),
            rtol=RTOL,
        )
