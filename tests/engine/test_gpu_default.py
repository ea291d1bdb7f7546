"""The GPU default of train.max_device_batch (engine/tf/strategy.py): the memory model's largest
micro-batch on the GPU found by its CUDA name, only when the config sets none and the batch does
not fit whole."""

import pytest

from wide_tf.checks import loader
from wide_tf.engine.tf.strategy import Runtime, max_device_batch
from wide_tf.schema import memory, rules

A100 = "NVIDIA A100-SXM4-40GB"


def _config(batch):
    """The paper's widest-member run on CIFAR-10 (about 5.7 MB per example in float32)."""
    config = loader.load_config("configs/wrn.py:single")
    config.data.name = "cifar10"
    config.model.depth, config.model.width = 40, 1.64
    config.train.global_batch = batch
    return config


def _runtime(platform, replicas=1):
    return Runtime(None, platform, replicas, False, "float32")


def test_a_gpu_gets_the_largest_micro_batch_that_fits():
    config = _config(16384)
    cap = max_device_batch(config, _runtime("gpu"), A100)
    ghost = config.model.ghost_batch_size
    assert 0 < cap < 16384 and cap % ghost == 0
    micro = 16384 // rules.micro_batches(16384, cap)
    assert micro <= cap and micro % ghost == 0
    elements = memory.activation_elements("wrn", 40, 1.64, 10, (32, 32, 3), "ghost")
    largest = memory.largest_batch(elements, 0, memory.gpu_from_name(A100), "float32")
    assert cap <= largest and 16384 // largest < rules.micro_batches(16384, cap) + 1
    # Two GPUs: the per-replica half (8,192) is what must fit.
    cap2 = max_device_batch(config, _runtime("gpu", 2), A100)
    assert 0 < cap2 <= largest and (8192 // rules.micro_batches(8192, cap2)) % ghost == 0


def test_no_default_off_gpus_when_set_or_when_it_fits():
    assert max_device_batch(_config(16384), _runtime("cpu"), A100) == 0
    assert max_device_batch(_config(16384), _runtime("tpu"), A100) == 0
    given = _config(16384)
    given.train.max_device_batch = 64
    assert max_device_batch(given, _runtime("gpu"), A100) == 64
    assert max_device_batch(_config(64), _runtime("gpu"), A100) == 0


def test_an_unknown_gpu_is_capped_from_the_memory_its_driver_reports(monkeypatch):
    """A GPU outside the table got no cap and ran out of memory at 16,384. Its total
    memory is read (nvidia-smi, stubbed here as a 40 GiB device): the same cap as the table's A100
    at about that size; unreadable, the run is refused with a line naming the field."""
    from wide_tf.engine.tf import strategy
    from wide_tf.schema import hardware

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    smi = hardware.subprocess.CompletedProcess([], 0, f"{40 * 1024}\n", "")
    monkeypatch.setattr(hardware.subprocess, "run", lambda cmd, **kw: smi)
    cap = max_device_batch(_config(16384), _runtime("gpu"), "NVIDIA Future GPU 9000")
    assert 0 < cap < 16384 and cap % _config(16384).model.ghost_batch_size == 0
    dev = strategy.gpu_device("NVIDIA Future GPU 9000")
    assert dev.memory == 40 * 2**30 and "nvidia-smi" in dev.source

    def no_smi(cmd, **kw):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(hardware.subprocess, "run", no_smi)
    with pytest.raises(strategy.StrategyError, match="train.max_device_batch") as e:
        max_device_batch(_config(16384), _runtime("gpu"), "NVIDIA Future GPU 9000")
    assert "not in the memory table" in str(e.value) and "\n" not in str(e.value)
    # Given a cap, the GPU's memory is never asked for.
    given = _config(16384)
    given.train.max_device_batch = 64
    assert max_device_batch(given, _runtime("gpu"), "NVIDIA Future GPU 9000") == 64


def test_a_newly_tabled_gpu_gets_its_cap_by_name():
    for name in ("NVIDIA L40S", "NVIDIA RTX A6000", "NVIDIA A10"):
        assert 0 < max_device_batch(_config(16384), _runtime("gpu"), name) < 16384
    # 16,384 x 8.2 MB fits a B200's 180 GB whole: no split
    assert max_device_batch(_config(16384), _runtime("gpu"), "NVIDIA B200") == 0


def test_float32_on_an_ampere_gpu_is_recorded_as_tf32(monkeypatch):
    from wide_tf.engine.tf import strategy

    tf = strategy.tf
    assert "TF32" in Runtime(None, "gpu", 1, True, "float32", tf32=True).describe()
    assert "TF32" not in _runtime("gpu").describe()
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [gpu])
    details = {"compute_capability": (8, 0)}
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda d: details)
    assert strategy.tensor_float_32("gpu", "float32")
    assert not strategy.tensor_float_32("gpu", "mixed_bfloat16")
    assert not strategy.tensor_float_32("cpu", "float32")
    details["compute_capability"] = (7, 0)  # a V100: no TF32
    assert not strategy.tensor_float_32("gpu", "float32")


def test_the_report_names_tf32_where_the_record_says_so():
    from wide_tf.report import protocol

    tf32 = {
        "dtype_policy": "float32",
        "runtime": "... policy=float32 (TF32 matmuls and convolutions)",
    }
    assert "TF32" in protocol._precision({}, tf32)
    assert protocol._precision({}, {"dtype_policy": "float32", "runtime": "policy=float32"}) == (
        "float32"
    )
