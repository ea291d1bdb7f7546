"""Micro-batching changes nothing but memory: every variable (moving statistics and optimizer
slots included) of k = 1, 2, 4 micro-batches, on one and two replicas, for ghost batch norm; the
whole per-replica batch's statistics for batch norm; no merge_call inside the micro-batch loop."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine.models import build_model, norm
from wide_tf.engine.tf.step import BatchPlan, Stepper

GLOBAL_BATCH = 32


def _strategy(replicas):
    if replicas == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _run(replicas, micro_batches, steps, norm_name, depth=2, ghost_batch_size=4, arch="mlp"):
    """Every variable of the model and optimizer after `steps` updates, each replica's copy."""
    strategy = _strategy(replicas)
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 2.0, size=(64, 6, 6, 1)).astype(np.float32)
    y = rng.integers(0, 4, size=64).astype(np.int32)
    keras.utils.set_random_seed(3)
    per_replica = GLOBAL_BATCH // replicas
    with strategy.scope():
        model = build_model(
            arch,
            depth,
            16 if arch == "mlp" else 1,
            4,
            (6, 6, 1),
            norm=norm_name,
            ghost_batch_size=ghost_batch_size,
        )
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        opt.build(model.trainable_variables)
        plan = BatchPlan.make(GLOBAL_BATCH, replicas, per_replica // micro_batches)
        assert plan.num_micro_batches == micro_batches
        stepper = Stepper(model, opt, strategy, plan)
    initial = [v.numpy().copy() for v in model.variables]

    def fn(ctx):
        per = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(per, drop_remainder=True).repeat()

    stepper.train(iter(strategy.distribute_datasets_from_function(fn)), steps)
    variables = {}
    # The optimizer's names differ between instances (sgd, sgd_1, ...): keyed by position.
    named = [(v.path, v) for v in model.variables] + [
        (f"optimizer{i}/{v.name}", v) for i, v in enumerate(opt.variables)
    ]
    for name, v in named:
        for r, local in enumerate(strategy.experimental_local_results(v.value)):
            variables[f"{name}@{r}"] = local.numpy()
    return variables, x, initial


def _assert_same(a, b, atol=2e-6):
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=2e-5, atol=atol, err_msg=name)


@pytest.mark.parametrize("replicas", [1, 2])
def test_ghost_batch_norm_every_variable_is_the_same_for_1_2_4_micro_batches(replicas):
    # The reproduction: 3 steps with k = 4 decayed the moving means 0.9^12 instead of
    # 0.9^3 (0.030 vs 0.067); on two replicas k > 1 crashed ("merge_call called while defining a
    # new graph": ghost batch norm's all-reduce ran inside the micro-batch loop).
    reference, _, _ = _run(1, 1, 3, "ghost")
    moving = [k for k in reference if "moving_" in k]
    assert moving and all(np.abs(reference[k]).max() > 0 for k in moving)
    for k in (1, 2, 4):
        variables, _, _ = _run(replicas, k, 3, "ghost")
        _assert_same({n: v for n, v in variables.items() if n.endswith("@0")}, reference)
        if replicas == 2:  # the replicas' copies stay equal (ghost statistics are all-reduced)
            for n in variables:
                if n.endswith("@1"):
                    np.testing.assert_allclose(variables[n], variables[n[:-1] + "0"], atol=1e-6)


def test_ghost_batch_norm_micro_batches_on_a_wide_resnet_under_two_replicas():
    reference, _, _ = _run(1, 1, 2, "ghost", depth=10, arch="wrn")
    variables, _, _ = _run(2, 2, 2, "ghost", depth=10, arch="wrn")
    _assert_same({n: v for n, v in variables.items() if n.endswith("@0")}, reference, atol=1e-5)


@pytest.mark.parametrize("replicas", [1, 2])
def test_batch_norm_moving_statistics_are_the_whole_batch_statistics(replicas):
    """One batch-norm layer, one step: its moving mean and variance are those of the whole
    per-replica batch for every k (the variance is not the mean of the micro-batches'
    variances), on every replica's copy. (The weights differ with k: each micro-batch is
    normalised with its own statistics, as before.)"""
    per_replica = GLOBAL_BATCH // replicas
    for k in (1, 2, 4):
        variables, x, initial = _run(replicas, k, 1, "batch", depth=1)
        kernel = initial[0]  # dense_1's kernel (no bias: the norm follows it)
        assert kernel.shape == (36, 16)
        for r in range(replicas):
            h = x[r * per_replica : (r + 1) * per_replica].reshape(per_replica, -1) @ kernel
            mean = [v for n, v in variables.items() if "moving_mean" in n and n.endswith(f"@{r}")]
            var = [v for n, v in variables.items() if "moving_var" in n and n.endswith(f"@{r}")]
            np.testing.assert_allclose(mean[0], 0.1 * h.mean(0), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(var[0], 0.9 + 0.1 * h.var(0), rtol=1e-4, atol=1e-5)
    assert not getattr(norm._DEFERRED, "stack", None)  # no deferred trace left open
