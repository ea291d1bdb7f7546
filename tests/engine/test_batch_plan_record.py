"""result.json records the batch layout really used (`batch_plan`): the micro-batch cap in force,
the config's or the GPU default the memory model chose (engine/tf/strategy.max_device_batch), and
the micro-batch split, where the protocol shows only the config's train.max_device_batch."""

import json

from wide_tf.engine import train
from wide_tf.engine.tf import strategy as strategy_lib
from wide_tf.engine.tf.step import BatchPlan
from wide_tf.schema import defaults, result_fields


def test_the_plan_describes_itself_against_the_schema():
    plan = BatchPlan.make(64, 2, 8)
    described = plan.describe()
    assert described == {
        "max_device_batch": 8,
        "replicas": 2,
        "per_replica": 32,
        "micro_batches": 4,
        "micro_batch": 8,
    }
    assert [f.name for f in result_fields.BATCH_PLAN] == list(described)
    assert BatchPlan.make(64, 1).describe()["max_device_batch"] == 0
    assert "batch_plan" in result_fields.NAMES
    assert not next(f for f in result_fields.FIELDS if f.name == "batch_plan").required


def test_a_run_records_the_cap_it_really_used(tmp_path, monkeypatch):
    """The config says 0; the cap chosen for the device (here, as a GPU's default would be: 8)
    is what the record shows, with the split it gave."""
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width = 1, 16
    config.runtime.strategy = "cpu"
    config.train.global_batch, config.train.max_steps = 32, 3
    config.train.max_device_batch = 0
    chosen = []

    def gpu_default(cfg, runtime, device_name=None):
        chosen.append(cfg.train.max_device_batch)
        return 8

    monkeypatch.setattr(strategy_lib, "max_device_batch", gpu_default)
    train.clear_cache()
    result = train.train_and_evaluate(config, str(tmp_path))
    train.clear_cache()
    assert chosen == [0]
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["protocol"]["max_device_batch"] == 0  # the config's
    assert on_disk["batch_plan"] == result["batch_plan"]
    assert on_disk["batch_plan"] == {
        "max_device_batch": 8,
        "replicas": 1,
        "per_replica": 32,
        "micro_batches": 4,
        "micro_batch": 8,
    }
    assert result_fields.problems(on_disk) == []
