"""On the CPU, the same config and seed give the same result.json (timings aside) and the same
metrics history, twice: every number a study compares is a function of the config alone."""

import json

import keras
import pytest
from helpers import without

from wide_tf.engine import train
from wide_tf.schema import defaults

TIMINGS = ("wall_time_s", "examples_per_s", "time_s")


def _config(arch):
    config = defaults.base_config(arch, "digits_embedded")
    config.sweep = None
    if arch == "mlp":
        config.model.depth, config.model.width, config.model.norm = 2, 48, "batch"
        config.train.global_batch = 64
    else:
        config.model.depth, config.model.width = 10, 0.5
        config.model.norm, config.model.ghost_batch_size = "ghost", 16
        config.train.global_batch = 32
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy = "cpu"
    config.train.max_steps = 30
    config.train.eval_every_examples = 400
    config.train.steps_per_loop = 10
    config.train.target_value = 0.999  # not reached: every step runs
    config.train.eval_economy = False  # every evaluation whole: the curves are compared
    config.train.gradient_at_init = True
    config.train.gradient_every_examples = 960
    config.train.probe_size = 128
    return config


def _strip(record):
    return without(record, TIMINGS)


@pytest.mark.parametrize("arch", ["mlp", "wrn"])
def test_same_config_and_seed_give_an_identical_result(tmp_path, arch):
    runs = []
    for name in ("a", "b"):
        # A fresh build each time: a kept model would also share the step-0 measurements
        # (Run.at_init), which would make part of the comparison trivially equal.
        train.clear_cache()
        keras.backend.clear_session()
        train.train_and_evaluate(_config(arch), str(tmp_path / name))
        result = json.loads((tmp_path / name / "result.json").read_text())
        history = [
            json.loads(line)
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        runs.append((_strip(result), _strip(history)))
    (ra, ha), (rb, hb) = runs
    assert ra["steps"] == 30 and len(ha) > 2 and ra["gradient"]["history"]
    assert ra == rb  # exactly: no rounding
    assert ha == hb
    train.clear_cache()
