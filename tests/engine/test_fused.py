"""The fused training loop (engine/tf/fused.py): it reads the stream's batches exactly, and a run
trained with it follows the executor's run of the same config within float tolerance, with the
same evaluation steps, crossing and status (a few seconds: two small MLP runs)."""

import json
import math

import numpy as np
import pytest

from wide_tf.engine import train
from wide_tf.engine.tf import fused
from wide_tf.engine.tf.stream import InMemoryTrainStream
from wide_tf.schema import defaults


def _config(jit: str):
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = 2, 32, "none"
    config.optim.name, config.optim.momentum, config.optim.base_lr = "sgd", 0.0, 0.1
    config.runtime.strategy = "cpu"
    config.runtime.jit_compile = jit
    config.train.global_batch = 16
    config.train.max_steps = 120
    config.train.eval_every_examples = 144  # 9 steps a call, as the local study's batch 16
    config.train.target_value = 0.8
    config.train.gradient_at_init = False
    config.train.gradient_every_examples = 0
    return config


def test_held_orders_give_the_streams_own_batches():
    data_cfg = _config("auto").data
    a = InMemoryTrainStream(data_cfg, 176)
    b = InMemoryTrainStream(data_cfg, 176)
    held = fused.HeldOrders(b, fused.HeldOrders.epochs_for(5 * 176, b.n))
    for stream in (a, b):
        stream.start(seed=3, start_step=7)  # from inside an epoch, across the next one
    for _ in range(3):
        held.ready(5)
        for _ in range(5):
            want, got = a.get_next(), held.get_next()
            np.testing.assert_array_equal(want[0].numpy(), got[0].numpy())
            np.testing.assert_array_equal(want[1].numpy(), got[1].numpy())
    b.start(seed=4)  # a new run of the kept stream: its own orders, not the last seed's
    a.start(seed=4)
    held.ready(1)
    np.testing.assert_array_equal(a.get_next()[1].numpy(), held.get_next()[1].numpy())


def test_a_call_longer_than_the_held_epochs_is_refused():
    stream = InMemoryTrainStream(_config("auto").data, 176)
    held = fused.HeldOrders(stream.start(seed=0), 2)
    with pytest.raises(ValueError, match="spans 3 epochs"):
        held.ready(2 * stream.n // 176 + 1)


def test_applies_only_where_measured():
    runtime = type("R", (), {"platform": "cpu", "num_replicas": 1})()
    assert fused.applies(_config("fused"), runtime)
    assert not fused.applies(_config("auto"), runtime)  # opt-in: the executor's sums by default
    assert not fused.applies(_config("false"), runtime)
    assert not fused.applies(_config("true"), runtime)  # XLA around the step alone, as before
    wrn = _config("fused")
    wrn.model.arch = "wrn"
    assert not fused.applies(wrn, runtime)
    runtime.num_replicas = 2
    assert not fused.applies(_config("fused"), runtime)


def test_a_fused_run_follows_the_executors(tmp_path):
    runs = {}
    for jit in ("false", "fused"):
        train.clear_cache()
        result = train.train_and_evaluate(_config(jit), str(tmp_path / jit))
        history = [
            json.loads(line) for line in (tmp_path / jit / "metrics.jsonl").read_text().splitlines()
        ]
        runs[jit] = result, history
    train.clear_cache()
    (old, old_h), (new, new_h) = runs["false"], runs["fused"]
    assert (new["status"], new["steps_to_target"]) == (old["status"], old["steps_to_target"])
    assert [r.get("step") for r in new_h] == [r.get("step") for r in old_h]
    for a, b in zip(old_h, new_h):
        for k, v in a.items():
            if isinstance(v, float) and math.isfinite(v) and "per_s" not in k and "time" not in k:
                assert b[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert new["final"]["train_loss"] == pytest.approx(old["final"]["train_loss"], rel=1e-4)
