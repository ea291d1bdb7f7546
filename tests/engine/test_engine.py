"""The distributed step: replica-count invariance, gradient accumulation, batch plans,
divergence."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine.models import build_model
from wide_tf.engine.tf.step import BatchPlan, BatchSplitError, Stepper


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6, 6, 1)).astype(np.float32)
    y = rng.integers(0, 4, size=n).astype(np.int32)
    return x, y


def _dist_dataset(strategy, x, y, global_batch):
    """Global batch t = rows [tB, (t+1)B); replica r of the one pipeline gets its r-th slice."""

    def fn(ctx):
        per = ctx.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(per, drop_remainder=True).repeat()

    return strategy.distribute_datasets_from_function(fn)


def _run(
    strategy,
    steps,
    global_batch,
    max_device_batch=0,
    optimizer="momentum",
    lr=0.1,
    norm="none",
    ghost_batch_size=32,
):
    x, y = _data()
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = build_model(
            "mlp", 2, 16, 4, (6, 6, 1), norm=norm, ghost_batch_size=ghost_batch_size
        )
        if optimizer == "momentum":
            opt = keras.optimizers.SGD(lr, momentum=0.9)
        else:
            opt = keras.optimizers.SGD(lr)
        opt.build(model.trainable_variables)
        plan = BatchPlan.make(global_batch, strategy.num_replicas_in_sync, max_device_batch)
        stepper = Stepper(model, opt, strategy, plan)
    it = iter(_dist_dataset(strategy, x, y, global_batch))
    out = stepper.train(it, steps)
    return [v.numpy() for v in model.trainable_variables], out, plan


def _two_replicas():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def test_one_and_two_replicas_give_the_same_weights():
    w1, out1, _ = _run(tf.distribute.OneDeviceStrategy("/cpu:0"), 4, 16)
    w2, out2, plan = _run(_two_replicas(), 4, 16)
    assert plan.per_replica == 8
    for a, b in zip(w1, w2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert out1["examples"] == out2["examples"] == 64
    np.testing.assert_allclose(out1["loss_sum"], out2["loss_sum"], rtol=1e-5)


def test_accumulation_gives_the_full_batch_update():
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    w_full, _, _ = _run(one, 4, 16)
    w_acc, _, plan = _run(one, 4, 16, max_device_batch=4)
    assert plan.num_micro_batches == 4 and plan.micro_batch == 4
    for a, b in zip(w_full, w_acc):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Accumulation and replicas together.
    w_both, _, plan = _run(_two_replicas(), 4, 16, max_device_batch=2)
    assert plan.num_micro_batches == 4
    for a, b in zip(w_full, w_both):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_accumulation_with_ghost_batch_norm_matches_when_virtual_batches_agree():
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    w_full, _, _ = _run(one, 3, 16, norm="ghost", ghost_batch_size=4)
    w_acc, _, _ = _run(one, 3, 16, max_device_batch=8, norm="ghost", ghost_batch_size=4)
    for a, b in zip(w_full, w_acc):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_step_matches_a_numpy_sgd_step_on_a_linear_model():
    """One plain-SGD step of a linear softmax model against a hand-written NumPy gradient."""
    x, y = _data(16)
    keras.utils.set_random_seed(0)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = build_model("mlp", 0, 1, 4, (6, 6, 1), norm="none")
        opt = keras.optimizers.SGD(0.5)
        opt.build(model.trainable_variables)
        stepper = Stepper(model, opt, strategy, BatchPlan.make(16, 1))
    w0, b0 = [v.numpy().copy() for v in model.trainable_variables]
    stepper.train(iter(_dist_dataset(strategy, x, y, 16)), 1)
    xf = x.reshape(16, -1)
    z = xf @ w0 + b0
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(16), y] -= 1
    gw, gb = xf.T @ p / 16, p.mean(0)
    np.testing.assert_allclose(
        model.trainable_variables[0].numpy(), w0 - 0.5 * gw, rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(
        model.trainable_variables[1].numpy(), b0 - 0.5 * gb, rtol=1e-4, atol=1e-6
    )


def test_reported_norms_and_two_batch_quantities():
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    _, out, _ = _run(one, 1, 16, max_device_batch=8, optimizer="sgd")
    # |G_big|^2 is the squared norm of the full-batch mean gradient; the mean of the two micro-batch
    # squared norms is at least as large (Jensen), and both are positive.
    assert out["big_grad_sq"] > 0 and out["small_grad_sq"] >= out["big_grad_sq"] * (1 - 1e-6)
    assert out["grad_norm_sq"] == pytest.approx(out["big_grad_sq"])
    assert out["update_norm_sq"] == pytest.approx(0.1**2 * out["big_grad_sq"], rel=1e-4)


def test_batch_plan_errors_and_splits():
    with pytest.raises(BatchSplitError, match="does not divide over 8 replicas"):
        BatchPlan.make(100, 8)
    with pytest.raises(BatchSplitError, match="must be positive"):
        BatchPlan.make(0, 1)
    p = BatchPlan.make(4096, 8, max_device_batch=100)
    assert (
        p.per_replica == 512 and p.micro_batch <= 100 and p.per_replica % p.num_micro_batches == 0
    )
    assert BatchPlan.make(256, 2, 0).num_micro_batches == 1


def test_divergence_stops_the_loop_and_is_flagged():
    stepper, batches = _diverging_stepper()
    out = stepper.train(batches, 50)
    assert bool(stepper.diverged.numpy())
    assert out["steps"] < 50  # stopped early, on the device


def test_xla_step_gives_the_same_weights_as_the_plain_step():
    """The accelerator path (jit_compile=True) on the CPU, against the CPU default."""
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _data()
    weights = []
    for jit in (False, True):
        keras.utils.set_random_seed(3)
        with one.scope():
            model = build_model("mlp", 2, 16, 4, (6, 6, 1))
            opt = keras.optimizers.SGD(0.1, momentum=0.9)
            opt.build(model.trainable_variables)
            stepper = Stepper(
                model, opt, one, BatchPlan.make(16, 1, max_device_batch=8), jit_compile=jit
            )
        stepper.train(iter(_dist_dataset(one, x, y, 16)), 3)
        weights.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_mixed_bfloat16_trains_with_float32_logits_and_loss():
    """The TPU precision policy on the CPU: variables and logits stay float32, the loss goes
    down."""
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _data()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(3)
        with one.scope():
            model = build_model("mlp", 2, 32, 4, (6, 6, 1))
            opt = keras.optimizers.SGD(0.1, momentum=0.9)
            opt.build(model.trainable_variables)
            stepper = Stepper(model, opt, one, BatchPlan.make(16, 1))
        assert model(x[:2]).dtype == "float32"
        assert all(v.dtype == "float32" for v in model.trainable_variables)
        it = iter(_dist_dataset(one, x, y, 16))
        first = stepper.train(it, 4)
        for _ in range(5):
            last = stepper.train(it, 4)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert last["loss_sum"] / last["examples"] < first["loss_sum"] / first["examples"]


def _diverging_stepper():
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _data()
    x = x * 1e3
    keras.utils.set_random_seed(0)
    with one.scope():
        model = build_model("mlp", 2, 16, 4, (6, 6, 1))
        opt = keras.optimizers.SGD(1e4)
        opt.build(model.trainable_variables)
        stepper = Stepper(model, opt, one, BatchPlan.make(16, 1), diverge_loss=50.0)
    return stepper, iter(_dist_dataset(one, x, y, 16))


def test_divergence_counts_up_to_the_first_diverged_step_only():
    """The loop checks divergence on the device (no read per step): a call of 50 steps reports the
    same step count, scalars and flag as calls of one step stopped at the first diverged one."""
    stepper, it = _diverging_stepper()
    first = None
    for k in range(1, 51):
        out = stepper.train(it, 1)
        if out["diverged"]:
            first = (k, out)
            break
    assert first is not None and first[0] < 50
    stepper, it = _diverging_stepper()
    out = stepper.train(it, 50)
    assert out["diverged"] and out["steps"] == first[0]
    assert out["examples"] == 16 * first[0]
    # The step-by-step calls' losses, summed, are the long call's (later steps added nothing).
    stepper2, it2 = _diverging_stepper()
    total = sum(stepper2.train(it2, 1)["loss_sum"] for _ in range(first[0]))
    assert out["loss_sum"] == pytest.approx(total, rel=1e-5)


def test_one_device_to_host_read_per_call_and_no_retrace_for_new_numbers():
    """Stepper.train reads one packed tensor; a new learning rate (schedule variables) and a new
    divergence threshold reuse the traced loop."""
    from tools.bench import speed as bench
    from wide_tf.engine import optim, schedules

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _data()
    from wide_tf.schema import defaults

    cfg = defaults.optim_config("momentum", base_lr=0.1)
    keras.utils.set_random_seed(0)
    with one.scope():
        model = build_model("mlp", 1, 8, 4, (6, 6, 1))
        opt = optim.build_optimizer(cfg, 16, steps_per_epoch=4, total_steps=100)
        opt.build(model.trainable_variables)
        stepper = Stepper(model, opt, one, BatchPlan.make(16, 1))
    it = iter(_dist_dataset(one, x, y, 16))
    stepper.train(it, 3)  # traces
    with bench._Counters() as c:
        out = stepper.train(it, 5)
    assert c.reads == 1 and out["steps"] == 5 and out["iteration"] == 8
    assert out["learning_rate"] == pytest.approx(0.1 * (16 / 256) ** 0.5)
    traces = stepper._train_fn.experimental_get_tracing_count()
    cfg.lr_multiplier = 4.0
    opt._learning_rate.assign_from(schedules.build_schedule(cfg, 16, 4, 100))
    stepper.reset(diverge_loss=123.0)
    out = stepper.train(it, 2)
    assert out["learning_rate"] == pytest.approx(0.4 * (16 / 256) ** 0.5)
    assert stepper._train_fn.experimental_get_tracing_count() == traces
