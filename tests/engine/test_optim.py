"""Tests for wide_tf.engine.optim: LARS against a NumPy reference, schedules against hand-computed
values, the optimizers by name."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine import optim, schedules
from wide_tf.schema import defaults, optimizers

# ----------------------------------------------------------------------------------------------
# NumPy reference


def np_trust(w, g, eta, wd, eps, form):
    """Independent LARS trust ratio (You et al. form or the |g + wd w| form), 1 where a norm is
    0."""
    wn = np.sqrt(np.sum(w.astype(np.float64) ** 2))
    gn = np.sqrt(np.sum(g.astype(np.float64) ** 2))
    if form == "you":
        num_ok, denom = gn, gn + wd * wn + eps
    else:
        gdn = np.sqrt(np.sum((g + wd * w).astype(np.float64) ** 2))
        num_ok, denom = gdn, gdn + eps
    if wn == 0 or num_ok == 0:
        return 1.0
    return eta * wn / denom


def np_lars(params, grads_seq, lrs, *, momentum, eta, wd, eps, form, clip, nesterov):
    """Reference LARS: params is {name: array}; rank <= 1 arrays are excluded (plain momentum, no
    decay)."""
    params = {k: v.astype(np.float64).copy() for k, v in params.items()}
    vel = {k: np.zeros_like(v) for k, v in params.items()}
    for grads, lr in zip(grads_seq, lrs):
        for k in params:
            w, g = params[k], grads[k].astype(np.float64)
            if w.ndim <= 1:
                local, gp = lr, g
            else:
                trust = np_trust(w, g, eta, wd, eps, form)
                gp = g + wd * w
                local = min(trust / lr, 1.0) * lr if clip else lr * trust
            vel[k] = momentum * vel[k] + local * gp
            params[k] = w - (momentum * vel[k] + local * gp if nesterov else vel[k])
    return params


def _dense_model(seed=0, units=3, in_dim=5, kernel=None):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((in_dim,)), keras.layers.Dense(units, bias_initializer="ones")]
    )
    if kernel is not None:
        model.layers[0].kernel.assign(kernel)
    return model


def _grad_seq(model, n, seed=1):
    rng = np.random.default_rng(seed)
    return [
        [rng.normal(size=v.shape).astype(np.float32) for v in model.trainable_variables]
        for _ in range(n)
    ]


def _names(model):
    return ["kernel", "bias"]  # Dense's trainable_variables order


# ----------------------------------------------------------------------------------------------
# LARS updates


@pytest.mark.parametrize("form", ["you", "decayed_grad"])
@pytest.mark.parametrize(
    "clip,momentum,nesterov",
    [
        (False, 0.9, False),
        (False, 0.9, True),
        (True, 0.9, False),
        (False, 0.0, False),
        (True, 0.5, True),
    ],
)
def test_lars_matches_numpy_reference_over_five_steps(form, clip, momentum, nesterov):
    model = _dense_model()
    init = {k: v.numpy() for k, v in zip(_names(model), model.trainable_variables)}
    grads = _grad_seq(model, 5)
    # lr from a schedule (Keras' boundaries are inclusive: steps 0-1, 2, 3-4), so the test also
    # checks that update_step gets the step's learning rate.
    sched = keras.optimizers.schedules.PiecewiseConstantDecay([1, 2, 4], [0.05, 0.1, 0.2, 0.1])
    lr_values = [0.05, 0.05, 0.1, 0.2, 0.2]
    kw = dict(
        momentum=momentum,
        eta=0.5,
        weight_decay=0.05,
        epsilon=1e-3,
        trust_ratio=form,
        clip=clip,
        nesterov=nesterov,
    )
    opt = optim.LARS(learning_rate=sched, **kw)
    opt.build(model.trainable_variables)
    step = tf.function(lambda gs: opt.apply(gs, model.trainable_variables))
    for gs in grads:
        step([tf.constant(g) for g in gs])
    ref = np_lars(
        init,
        [dict(zip(_names(model), gs)) for gs in grads],
        lr_values,
        momentum=momentum,
        eta=0.5,
        wd=0.05,
        eps=1e-3,
        form=form,
        clip=clip,
        nesterov=nesterov,
    )
    for k, v in zip(_names(model), model.trainable_variables):
        np.testing.assert_allclose(v.numpy(), ref[k], rtol=2e-5, atol=1e-6, err_msg=k)
    assert int(opt.iterations.numpy()) == 5
    # The reference must be sensitive to what is tested: clipping, the form, and the exclusion all
    # change it.
    other = np_lars(
        init,
        [dict(zip(_names(model), gs)) for gs in grads],
        lr_values,
        momentum=momentum,
        eta=0.5,
        wd=0.05,
        eps=1e-3,
        form="decayed_grad" if form == "you" else "you",
        clip=not clip,
        nesterov=nesterov,
    )
    assert not np.allclose(other["kernel"], ref["kernel"], rtol=1e-4)


def test_lars_bias_is_excluded_from_adaptation_and_decay():
    """The bias (rank 1) gets plain momentum SGD with no weight decay, the kernel the trust
    ratio."""
    model = _dense_model()
    b0 = model.layers[0].bias.numpy().copy()
    opt = optim.LARS(learning_rate=0.1, momentum=0.0, eta=0.001, weight_decay=0.5)
    opt.build(model.trainable_variables)
    assert [opt.is_adapted(v) for v in model.trainable_variables] == [True, False]
    gb = np.full(3, 2.0, np.float32)
    opt.apply([tf.zeros_like(model.layers[0].kernel), tf.constant(gb)], model.trainable_variables)
    np.testing.assert_allclose(model.layers[0].bias.numpy(), b0 - 0.1 * gb, rtol=1e-6)


def test_lars_zero_norms_give_ratio_one():
    one = tf.constant(1.0)
    zero = tf.constant(0.0)
    for form in ("you", "decayed_grad"):
        assert float(optim.compute_trust_ratio(zero, one, one, 0.001, 0.0, 0.0, form)) == 1.0
        assert float(optim.compute_trust_ratio(one, zero, zero, 0.001, 0.0, 0.0, form)) == 1.0
    # |w| = 2, |g| = 3, wd = 0.5, eta = 0.1: 'you' -> 0.1*2/(3+1); a nonzero case for contrast.
    assert float(
        optim.compute_trust_ratio(tf.constant(2.0), tf.constant(3.0), zero, 0.1, 0.5, 0.0, "you")
    ) == pytest.approx(0.05)
    # Through update_step: a zero kernel with nonzero gradient moves by lr * g (ratio 1), not by 0
    # or NaN.
    model = _dense_model(kernel=np.zeros((5, 3), np.float32))
    opt = optim.LARS(learning_rate=0.1, momentum=0.9, eta=0.001, weight_decay=0.1)
    opt.build(model.trainable_variables)
    gk = np.arange(15, dtype=np.float32).reshape(5, 3)
    ratios = optim.lars_trust_ratios(opt, [tf.constant(gk), tf.ones(3)], model.trainable_variables)
    np.testing.assert_array_equal(ratios.numpy(), [1.0])
    opt.apply([tf.constant(gk), tf.zeros(3)], model.trainable_variables)
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), -0.1 * gk, rtol=1e-6)


def test_lars_trust_ratios_in_tf_function_match_numpy():
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(6),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2),
        ]
    )
    for form in ("you", "decayed_grad"):
        opt = optim.LARS(
            learning_rate=1.0, eta=0.02, weight_decay=0.01, epsilon=1e-4, trust_ratio=form
        )
        opt.build(model.trainable_variables)
        grads = _grad_seq(model, 1)[0]
        ratios = tf.function(
            lambda gs, opt=opt: optim.lars_trust_ratios(opt, gs, model.trainable_variables)
        )([tf.constant(g) for g in grads])
        expected = [
            np_trust(v.numpy(), g, 0.02, 0.01, 1e-4, form)
            for v, g in zip(model.trainable_variables, grads)
            if len(v.shape) > 1
        ]
        assert (
            len(expected) == 2
        )  # the two Dense kernels; the biases and BN gamma/beta are excluded
        np.testing.assert_allclose(ratios.numpy(), expected, rtol=1e-5)


def test_lars_config_round_trip():
    sched = schedules.WarmupDecaySchedule(0.4, 100, warmup_steps=10, decay="polynomial", power=2.0)
    opt = optim.LARS(
        learning_rate=sched,
        momentum=0.8,
        eta=0.002,
        weight_decay=1e-4,
        trust_ratio="decayed_grad",
        epsilon=1e-9,
        clip=True,
        nesterov=True,
    )
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(again, optim.LARS)
    assert again.get_config() == opt.get_config()
    assert isinstance(again._learning_rate, schedules.WarmupDecaySchedule)
    again2 = optim.LARS.from_config(opt.get_config())
    assert again2.get_config() == opt.get_config()


def _train(model, opt, grads):
    for gs in grads:
        opt.apply([tf.constant(g) for g in gs], model.trainable_variables)


def test_lars_checkpoint_restores_slots_and_iterations(tmp_path):
    model = _dense_model(seed=0)
    opt = optim.LARS(learning_rate=0.1, momentum=0.9, eta=0.1, weight_decay=1e-3)
    opt.build(model.trainable_variables)
    grads = _grad_seq(model, 5)
    _train(model, opt, grads[:3])
    path = tf.train.Checkpoint(optimizer=opt, model=model).save(str(tmp_path / "ckpt"))
    _train(model, opt, grads[3:])

    model2 = _dense_model(
        seed=7
    )  # different initial weights: everything must come from the checkpoint
    opt2 = optim.LARS(learning_rate=0.1, momentum=0.9, eta=0.1, weight_decay=1e-3)
    opt2.build(model2.trainable_variables)
    tf.train.Checkpoint(optimizer=opt2, model=model2).restore(path).assert_consumed()
    assert int(opt2.iterations.numpy()) == 3
    assert np.abs(opt2.velocities[0].numpy()).sum() > 0
    _train(model2, opt2, grads[3:])
    for a, b in zip(model.trainable_variables, model2.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    for a, b in zip(opt.velocities, opt2.velocities):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def _two_cpus():
    return len(tf.config.list_logical_devices("CPU")) >= 2


@pytest.mark.skipif(not _two_cpus(), reason="needs 2 logical CPU devices (tests/conftest.py)")
@pytest.mark.parametrize("name", ["lars", "momentum"])
def test_one_step_under_mirrored_strategy_equals_single_device(name):
    cfg = _cfg(name=name, base_lr=0.1, weight_decay=1e-3, lars_eta=0.05)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=8).astype(np.int32)

    def make(scope_strategy):
        with scope_strategy.scope():
            model = _dense_model(seed=0)
            opt = optim.build_optimizer(cfg, 8, 10, 100, variables=model.trainable_variables)
            opt.build(model.trainable_variables)
        return model, opt

    def loss_fn(model, xb, yb, global_batch):
        per_ex = keras.losses.sparse_categorical_crossentropy(yb, model(xb), from_logits=True)
        return tf.reduce_sum(per_ex) / global_batch

    # Single device.
    model1, opt1 = make(tf.distribute.get_strategy())
    with tf.GradientTape() as tape:
        loss = loss_fn(model1, x, y, 8)
    opt1.apply(tape.gradient(loss, model1.trainable_variables), model1.trainable_variables)

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    model2, opt2 = make(strategy)
    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    )

    @tf.function
    def train_step(batch):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(model2, xb, yb, 8)
            opt2.apply(tape.gradient(loss, model2.trainable_variables), model2.trainable_variables)

        strategy.run(replica_step, args=batch)

    train_step(next(iter(ds)))
    for a, b in zip(model1.trainable_variables, model2.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    init = _dense_model(seed=0).trainable_variables[0].numpy()
    assert not np.allclose(init, model2.trainable_variables[0].numpy())  # the step did something


# ----------------------------------------------------------------------------------------------
# schedules


def _cfg(**kw):
    """defaults.optim_config() with the linear scaling rule (the hand-computed values below use
    it), then `kw`."""
    cfg = defaults.optim_config()
    cfg.scaling = "linear"
    cfg.update(kw)
    return cfg


def test_scaling_rules_and_peak_lr():
    assert schedules.scaled_learning_rate(0.1, 1024, 256, "linear") == pytest.approx(0.4)
    assert schedules.scaled_learning_rate(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert schedules.scaled_learning_rate(0.1, 64, 256, "none") == pytest.approx(0.1)
    assert schedules.scaled_learning_rate(0.1, 64, 256, "sqrt") == pytest.approx(0.05)
    assert schedules.peak_learning_rate(
        _cfg(base_lr=0.1, scaling="linear", lr_multiplier=0.5), 512
    ) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="linear"):
        schedules.scaled_learning_rate(0.1, 64, 256, "cubic")


def _values(schedule, steps):
    f = tf.function(
        lambda s: schedule(s)
    )  # tensor step inside tf.function, as the optimizer calls it
    return np.array([float(f(tf.constant(s, tf.int64))) for s in steps])


def test_warmup_then_constant_and_warmup_fixed_policy():
    # batch 512, linear rule: peak 0.2; warm-up 2 epochs of 10 steps -> 20 steps.
    s = schedules.build_schedule(_cfg(warmup_epochs=2.0), 512, steps_per_epoch=10, total_steps=100)
    np.testing.assert_allclose(
        _values(s, [0, 5, 10, 19, 20, 99, 150]),
        [0.0, 0.05, 0.1, 0.19, 0.2, 0.2, 0.2],
        rtol=1e-6,
        atol=1e-8,
    )
    # Held fixed in epochs: twice the batch -> half the steps per epoch -> half the warm-up steps.
    assert schedules.build_schedule(_cfg(warmup_epochs=2.0), 1024, 5, 50).warmup_steps == 10
    assert schedules.build_schedule(_cfg(warmup_epochs=1.25), 1024, 5, 50).warmup_steps == round(
        6.25
    )
    # Held fixed in steps: the same at every batch size.
    for b, spe in ((512, 10), (1024, 5)):
        assert (
            schedules.build_schedule(
                _cfg(warmup_fixed="steps", warmup_steps=7, warmup_epochs=2.0), b, spe, 50
            ).warmup_steps
            == 7
        )
    with pytest.raises(ValueError):
        schedules.build_schedule(_cfg(warmup_fixed="examples"), 512, 10, 100)


def test_cosine_polynomial_multistep_values():
    # peak 0.1 at batch 256; warm-up 10 steps; total 110 -> decay over 100 steps.
    cos = schedules.build_schedule(
        _cfg(schedule="cosine", warmup_fixed="steps", warmup_steps=10, end_lr_fraction=0.1),
        256,
        10,
        110,
    )
    # t = 0.5 at step 60: end + (peak-end)/2 = 0.01 + 0.045; t=0.25 at 35: 0.01 +
    # 0.09*(1+cos(pi/4))/2.
    np.testing.assert_allclose(
        _values(cos, [5, 10, 35, 60, 110, 200]),
        [0.05, 0.1, 0.01 + 0.09 * (1 + math.cos(math.pi / 4)) / 2, 0.055, 0.01, 0.01],
        rtol=1e-5,
    )
    poly = schedules.build_schedule(
        _cfg(schedule="polynomial", poly_power=2.0, warmup_fixed="steps", warmup_steps=10),
        256,
        10,
        110,
    )
    # (1 - t)^2 * peak: t = 0.5 -> 0.025, t = 0.9 -> 0.001.
    np.testing.assert_allclose(
        _values(poly, [10, 60, 100, 110]), [0.1, 0.025, 0.001, 0.0], rtol=1e-5, atol=1e-9
    )
    multi = schedules.build_schedule(
        _cfg(schedule="multistep", decay_epochs=[3, 6], decay_factor=0.1, warmup_epochs=0.5),
        256,
        10,
        100,
    )
    # Boundaries 3 and 6 epochs -> steps 30 and 60; warm-up 5 steps.
    np.testing.assert_allclose(
        _values(multi, [0, 1, 5, 29, 30, 59, 60, 99]),
        [0.0, 0.02, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001],
        rtol=1e-5,
        atol=1e-9,
    )
    with pytest.raises(ValueError, match="cosine"):
        schedules.build_schedule(_cfg(schedule="exponential"), 256, 10, 100)


def test_schedule_serialisation_round_trip_and_warmup_init_fraction():
    s = schedules.WarmupDecaySchedule(
        1.0,
        20,
        warmup_steps=4,
        decay="multistep",
        boundaries=[10, 15],
        decay_factor=0.5,
        warmup_init_fraction=0.2,
    )
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(s))
    assert again.get_config() == s.get_config()
    np.testing.assert_allclose(
        _values(again, [0, 2, 4, 10, 15]), [0.2, 0.6, 1.0, 0.5, 0.25], rtol=1e-6
    )


# ----------------------------------------------------------------------------------------------
# factory


def test_build_optimizer_by_name():
    expected = {
        "sgd": keras.optimizers.SGD,
        "momentum": keras.optimizers.SGD,
        "nesterov": keras.optimizers.SGD,
        "lars": optim.LARS,
        "adam": keras.optimizers.Adam,
        "adamw": keras.optimizers.AdamW,
        "lamb": keras.optimizers.Lamb,
    }
    for name, cls in expected.items():
        opt = optim.build_optimizer(_cfg(name=name), 256, 10, 100)
        assert isinstance(opt, cls), name
        assert isinstance(opt._learning_rate, schedules.WarmupDecaySchedule)
    assert optim.build_optimizer(_cfg(name="sgd"), 256, 10, 100).momentum == 0.0
    assert optim.build_optimizer(_cfg(name="nesterov"), 256, 10, 100).nesterov
    lars = optim.build_optimizer(
        _cfg(
            name="lars",
            lars_eta=0.02,
            lars_trust_ratio="decayed_grad",
            lars_clip=True,
            weight_decay=1e-4,
        ),
        256,
        10,
        100,
    )
    assert (lars.eta, lars.trust_ratio, lars.clip, lars.weight_decay) == (
        0.02,
        "decayed_grad",
        True,
        1e-4,
    )
    with pytest.raises(ValueError, match="sgd, momentum, nesterov, lars, adam, adamw, lamb"):
        optim.build_optimizer(_cfg(name="rmsprop"), 256, 10, 100)
    with pytest.raises(ValueError, match="adamw"):
        optim.build_optimizer(_cfg(name="adam", weight_decay=1e-4), 256, 10, 100)


def test_registry_names_and_diagnostics():
    """Every optimizer of the schema (which validate.py reads, no TensorFlow there) has a builder,
    in the schema's order, and builds; only LARS reports diagnostics, its trust ratios'
    min/mean/max, inside a tf.function."""
    assert tuple(optim.OPTIMIZERS) == optimizers.NAMES
    assert set(optim._BUILDERS) == set(optimizers.NAMES)  # no builder without a spec entry
    for name in optimizers.NAMES:
        assert isinstance(
            optim.build_optimizer(_cfg(name=name), 256, 10, 100), keras.optimizers.Optimizer
        )
    with_diagnostics = {n for n, spec in optim.OPTIMIZERS.items() if spec.diagnostics}
    assert with_diagnostics == {"lars"}
    model = _dense_model(seed=0)
    opt = optim.build_optimizer(_cfg(name="lars", weight_decay=1e-3), 256, 10, 100)
    opt.build(model.trainable_variables)
    grads = [tf.constant(g) for g in _grad_seq(model, 1)[0]]
    hook = optim.OPTIMIZERS["lars"].diagnostics
    got = tf.function(lambda gs: hook.fn(opt, gs, model.trainable_variables))(grads)
    assert tuple(got) == hook.names
    ratios = optim.lars_trust_ratios(opt, grads, model.trainable_variables).numpy()
    np.testing.assert_allclose(
        [float(got[k]) for k in hook.names], [ratios.min(), ratios.mean(), ratios.max()]
    )


@pytest.mark.parametrize("name", ["momentum", "adamw", "lamb"])
@pytest.mark.parametrize("pass_variables", [True, False])
def test_keras_weight_decay_is_decoupled_and_skips_low_rank(name, pass_variables):
    """With zero gradients only the decay moves weights: kernel *= (1 - lr*wd), bias and BN
    untouched."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, bias_initializer="ones"),
            keras.layers.BatchNormalization(gamma_initializer="ones"),
        ]
    )
    before = [v.numpy().copy() for v in model.trainable_variables]
    opt = optim.build_optimizer(
        _cfg(name=name, base_lr=0.5, weight_decay=0.1),
        256,
        10,
        100,
        variables=model.trainable_variables if pass_variables else None,
    )
    opt.build(model.trainable_variables)
    opt.apply([tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables)
    after = [v.numpy() for v in model.trainable_variables]
    np.testing.assert_allclose(after[0], before[0] * (1 - 0.5 * 0.1), rtol=1e-6)
    for b, a in zip(before[1:], after[1:]):  # bias, gamma, beta
        np.testing.assert_array_equal(a, b)


def test_describe_exclusions_by_rank():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()]
    )
    d = optim.describe_exclusions(model.trainable_variables)
    assert len(d["adapted"]) == 1 and d["adapted"][0].endswith("kernel")
    assert len(d["excluded"]) == 3


def test_weight_decay_exclusion_uses_keras_public_api_only():
    """The exclusions go through Keras's public `exclude_from_weight_decay`: no private Keras
    attribute or method of the weight-decay machinery is read or written."""
    import inspect

    source = inspect.getsource(optim)
    for private in ("_exclude_from_weight_decay", "_var_key", "_use_weight_decay"):
        assert private not in source, private


@pytest.mark.parametrize("name", ["momentum", "adamw", "lars"])
def test_a_callers_exclusions_are_kept_beside_the_rank_rule(name):
    """A caller's `exclude_from_weight_decay(var_names=...)` before build still holds after the
    low-rank variables are added at build (and LARS applies it to its adaptation too)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, bias_initializer="ones")])
    opt = optim.build_optimizer(_cfg(name=name, base_lr=0.5, weight_decay=0.1), 256, 10, 100)
    opt.exclude_from_weight_decay(var_names=["kernel"])
    opt.build(model.trainable_variables)
    if name == "lars":
        assert [opt.is_adapted(v) for v in model.trainable_variables] == [False, False]
        return
    before = [v.numpy().copy() for v in model.trainable_variables]
    opt.apply([tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables)
    for b, v in zip(before, model.trainable_variables):  # kernel (by name) and bias (by rank)
        np.testing.assert_array_equal(v.numpy(), b)
