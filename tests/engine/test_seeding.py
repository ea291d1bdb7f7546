"""A run of a kept build is seeded without TensorFlow's global seed (engine/seeding.py): the same
host-side draws and initial weights as keras.utils.set_random_seed, no clearing of the kept
functions' kernels, the same record as a fresh build, and no traced function of the engine that
reads TensorFlow's global seed."""

import json
import random

import keras
import numpy as np
import tensorflow as tf
from helpers import probed_mlp, without
from tensorflow.python.eager import context

from wide_tf.engine import seeding, train
from wide_tf.engine.tf import reuse
from wide_tf.schema import defaults

TIMINGS = ("wall_time_s", "examples_per_s", "time_s", "provenance", "trial_id")


def _draws():
    return (
        random.random(),
        float(np.random.rand()),
        keras.random.normal([4]).numpy().tolist(),
        _dense_weights(),
    )


def _dense_weights():
    layer = keras.layers.Dense(3)
    layer.build((None, 5))
    return [w.numpy().tolist() for w in layer.weights]


def test_seed_host_draws_what_keras_set_random_seed_draws():
    keras.utils.set_random_seed(11)
    expected = _draws()
    random.seed(0), np.random.seed(0)
    keras.utils.set_random_seed(12)  # another global seed first: seed_host must replace it
    seeding.seed_host(11)
    assert _draws() == expected
    seeding.seed_host(12)
    assert _draws() != expected


def _mlp(seed: int):
    return probed_mlp(global_batch=32, max_epochs=1.0, seed=seed)


def _strip(record):
    return without(record, TIMINGS)


def test_a_kept_build_never_sets_tensorflows_seed_and_records_what_a_fresh_build_does(
    tmp_path, monkeypatch
):
    from wide_tf.engine.tf.strategy import setup_runtime

    runtime = setup_runtime(_mlp(0).runtime)
    train.clear_cache()
    train.train_and_evaluate(_mlp(0), str(tmp_path / "s0"), runtime)
    kept = next(iter(reuse._BUILT.values()))

    def clears_the_kernels(seed):
        raise AssertionError("tf.random.set_seed in a kept build clears every kept kernel")

    monkeypatch.setattr(tf.random, "set_seed", clears_the_kernels)
    second = train.train_and_evaluate(_mlp(1), str(tmp_path / "s1"), runtime)
    assert next(iter(reuse._BUILT.values())) is kept  # the kept build ran it
    monkeypatch.undo()
    train.clear_cache()
    fresh = train.train_and_evaluate(_mlp(1), str(tmp_path / "fresh"), runtime)
    assert json.dumps(_strip(second), sort_keys=True) == json.dumps(_strip(fresh), sort_keys=True)


def _reads_the_global_seed():
    """The ops of every function in the eager context that take TensorFlow's global seed: the
    stateful random ops carry it as their `seed`/`seed2` attributes (stateless ones take a key
    as an input)."""
    ctx = context.context()
    found = set()
    for name in ctx.list_function_names():
        for node in ctx.get_function_def(name).node_def:
            if "seed2" in node.attr:
                found.add((name, node.op))
    return found


def test_no_traced_function_of_the_engine_reads_tensorflows_global_seed(tmp_path):
    """Why seeding.seed_host may leave TensorFlow's seed alone: an MLP with the probe (the
    executor's loop and the fused XLA loop) and a WRN with ghost batch norm, augmentation and the
    batch-norm recompute, each traced whole (training, evaluation, probe, snapshot), hold no op
    that reads it."""
    from wide_tf.engine.tf.strategy import setup_runtime

    train.clear_cache()
    mlp = _mlp(0)
    runtime = setup_runtime(mlp.runtime)
    train.train_and_evaluate(mlp, str(tmp_path / "mlp"), runtime)
    fused = _mlp(0)
    fused.runtime.jit_compile = "fused"
    train.clear_cache()
    train.train_and_evaluate(fused, str(tmp_path / "fused"), setup_runtime(fused.runtime))

    wrn = defaults.base_config("wrn", "digits_embedded")
    wrn.sweep = None
    wrn.model.depth, wrn.model.width = 10, 0.5
    wrn.model.norm, wrn.model.ghost_batch_size = "ghost", 16
    wrn.data.augment = True
    wrn.train.target_bn = "recompute"
    wrn.runtime.strategy = "cpu"
    wrn.train.global_batch = 32
    wrn.train.max_steps = 12
    wrn.train.eval_every_examples = 192
    wrn.train.gradient_at_init = True
    wrn.train.gradient_every_examples = 192
    wrn.train.probe_size = 64
    wrn.train.eval_economy = False
    train.clear_cache()
    train.train_and_evaluate(wrn, str(tmp_path / "wrn"), setup_runtime(wrn.runtime))
    assert len(context.context().list_function_names()) > 10  # the check saw the traced ones
    assert _reads_the_global_seed() == set()
    train.clear_cache()

    @tf.function(autograph=False)
    def stateful(x):
        return x + tf.random.uniform([2])

    stateful(tf.zeros([2]))  # the check finds such an op
    assert {op for _, op in _reads_the_global_seed()} == {"RandomUniform"}
