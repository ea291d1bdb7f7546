"""The GPU default of train.max_device_batch (engine/strategy.py): the memory model's largest
micro-batch on the GPU found by its CUDA name, only when the config sets none and the batch does
not fit whole."""

from wide_tf.config import loader
from wide_tf.engine.strategy import Runtime, max_device_batch
from wide_tf.spec import memory, rules

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


def test_no_default_off_gpus_when_set_when_it_fits_or_for_an_unknown_gpu():
    assert max_device_batch(_config(16384), _runtime("cpu"), A100) == 0
    assert max_device_batch(_config(16384), _runtime("tpu"), A100) == 0
    given = _config(16384)
    given.train.max_device_batch = 64
    assert max_device_batch(given, _runtime("gpu"), A100) == 64
    assert max_device_batch(_config(64), _runtime("gpu"), A100) == 0
    assert max_device_batch(_config(16384), _runtime("gpu"), "Some Future GPU") == 0
