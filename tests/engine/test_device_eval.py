"""Evaluation sets held on the devices (engine/tf/step.DeviceEvalSet): the same sums, bit for bit,
as the streaming pass they replace, bounded passes that stop where it stopped, and the one-program
pass (the TPU's: the loop inside the replica function, stopped on all-reduced sums) on one CPU."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine import arrays
from wide_tf.engine.models import build_model
from wide_tf.engine.tf import data
from wide_tf.engine.tf.step import BatchPlan, DeviceEvalSet, Stepper, weighted_sums
from wide_tf.schema import datasets, defaults


def _cfg():
    cfg = defaults.base_config("mlp", "digits_embedded").data
    return cfg


def _model_and_stepper(strategy):
    with strategy.scope():
        model = build_model("mlp", 1, 16, 10, (8, 8, 1), norm="none")
        opt = keras.optimizers.SGD(0.1)
        opt.build(model.trainable_variables)
        plan = BatchPlan.make(16, strategy.num_replicas_in_sync)
        stepper = Stepper(model, opt, strategy, plan, input_spec=datasets.of(_cfg()))
    return model, stepper


def _two():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def test_two_replicas_hold_the_packed_set_and_sum_as_the_stream_did():
    two = _two()
    cfg = _cfg()
    model, stepper = _model_and_stepper(two)
    spec = datasets.of(cfg)
    streamed = data.make_eval_dataset(cfg, "test", 64, two)  # 359 examples: a padded last batch
    held = DeviceEvalSet(*data.packed_eval_arrays(cfg, "test"), 64, two, model, spec)
    assert held.num_batches == streamed.num_batches == 6
    for part in held.data:  # each share on its replica's device, none left on the host
        shares = two.experimental_local_results(part)
        assert [t.device for t in shares] == list(two.extended.worker_devices)
    whole = stepper.evaluate(held)
    assert whole == stepper.evaluate(streamed)  # bit for bit: the same per-replica batches
    assert whole["examples"] == 359
    # A bound met only by the whole set goes on to the end; one out of reach stops both early.
    hits = round(whole["accuracy"] * 359)
    assert stepper.evaluate(held, (hits, -np.inf)) == whole
    # 40 hits more than the set has: out of reach before the last batch (39 examples).
    assert stepper.evaluate(held, (hits + 40, -np.inf)) is None
    assert stepper.evaluate(streamed, (hits + 40, -np.inf)) is None
    stops = held.sums(tf.constant([hits + 200.0, -np.inf, 359.0])).numpy()
    assert 0 < stops[2] < 359 and stops[2] % 64 == 0  # stopped after whole batches
    assert held._fn.experimental_get_tracing_count() == 1  # one trace for every bound


@pytest.mark.parametrize("in_replica", [False, True])
def test_one_replica_sums_the_float_batches_in_order(in_replica):
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    model, stepper = _model_and_stepper(one)
    x, y = arrays.load_arrays(_cfg(), "test")
    held = DeviceEvalSet(x, y, 100, one, model, in_replica=in_replica)
    xp, yp, w = arrays.pad_for_evaluation(x, y, 100)
    expected = tf.zeros([3])
    for b in range(4):  # the loop the single-replica in-memory set ran before
        rows = slice(100 * b, 100 * (b + 1))
        expected = expected + weighted_sums(model, xp[rows], yp[rows], w[rows])
    np.testing.assert_array_equal(held.sums().numpy(), expected.numpy())
    assert stepper.evaluate(held)["examples"] == 359
    # Every example a hit: reachable before the first batch, out of reach after it (an untrained
    # model misses some of its 100), so the pass stops there, on the (all-reduced) sums.
    got = held.sums(tf.constant([359.0, -np.inf, 359.0])).numpy()
    assert got[2] == 100
    np.testing.assert_array_equal(got, weighted_sums(model, xp[:100], yp[:100], w[:100]).numpy())


def test_mirrored_strategy_refuses_the_one_program_pass():
    """Why the pass stays a loop around strategy.run off TPUs: a replica-context all-reduce in a
    loop needs a merge_call that MirroredStrategy does not allow there."""
    two = _two()
    model, _ = _model_and_stepper(two)
    x, y = arrays.load_arrays(_cfg(), "test")
    held = DeviceEvalSet(x[:64], y[:64], 32, two, model, in_replica=True)
    with pytest.raises(RuntimeError, match="merge_call"):
        held.sums()


def test_a_streamed_pass_is_traced_once_for_every_batch_size_of_a_member():
    two = _two()
    cfg = _cfg()
    model, first = _model_and_stepper(two)
    streamed = data.make_eval_dataset(cfg, "test", 64, two)
    with two.scope():  # the next batch size: a new Stepper on the same model (engine/tf/reuse.py)
        second = Stepper(
            model, first.optimizer, two, BatchPlan.make(32, 2), input_spec=datasets.of(cfg)
        )
    assert first.evaluate(streamed) == second.evaluate(streamed)
    assert second.eval_fn(streamed) is first.eval_fn(streamed)
    assert first.eval_fn(streamed).experimental_get_tracing_count() == 1


@pytest.mark.parametrize("devices", [[], ["/cpu:0", "/cpu:1"]])
def test_a_run_holds_both_sets_and_evaluates_them_as_streamed(tmp_path, devices):
    from wide_tf.engine import train
    from wide_tf.engine.tf.strategy import setup_runtime

    if devices:
        _two()
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = 1, 16, "none"
    config.runtime.strategy, config.runtime.devices = "cpu", devices
    config.train.global_batch, config.train.eval_batch, config.train.eval_train_limit = 32, 96, 500
    train.clear_cache()
    try:
        _, backend = train.setup(config, str(tmp_path), setup_runtime(config.runtime))
        built = backend.built
        assert all(isinstance(s, DeviceEvalSet) for s in built.eval_sets.values())
        judged = backend.evaluator.evaluate(1)
        strategy = built.stepper.strategy
        for split, limit in (("train", 500), ("test", None)):
            streamed = data.make_eval_dataset(config.data, split, 96, strategy, limit=limit)
            expected = built.stepper.evaluate(streamed)
            if devices:  # the same per-replica batches: bit for bit
                assert dataclasses.asdict(judged[split]) == expected, split
            else:  # host-normalised floats (as before) against the device's normalisation
                assert judged[split].loss == pytest.approx(expected["loss"], rel=1e-6)
                assert judged[split].examples == expected["examples"]
    finally:
        train.clear_cache()
