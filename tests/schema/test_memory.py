"""The memory model (wide_tf/schema/memory.py) and the fit check (wide_tf/checks/hardware_fit.py):
hand-computed sizes, the Keras models' own layer sizes, and the paper config on each slice."""

import math

import pytest
from helpers import REPO

from wide_tf.checks import hardware_fit, loader
from wide_tf.schema import memory

WRN_CONFIG = str(REPO / "configs" / "wrn.py")


def test_mlp_elements_by_hand():
    # 8x8 digits: Flatten 64; per hidden layer Dense and ReLU (and the norm) of `width`; the
    # logits and their float32 copy, 10 each.
    assert memory.activation_elements("mlp", 2, 10, 10, (8, 8, 1), "none") == 64 + 4 * 10 + 20
    assert memory.activation_elements("mlp", 3, 7, 10, (8, 8, 1), "batch") == 64 + 9 * 7 + 20


def test_wrn_elements_by_hand():
    # WRN-10-1 on 8x8x1: channels 16, 32, 64, one block per group.
    stem = 8 * 8 * 16  # 1,024
    g1 = 2 * 1024 + 5 * 1024  # pre norm + ReLU at the input; conv1, norm, ReLU, conv2, Add
    g2 = 2 * 1024 + 6 * (4 * 4 * 32)  # ... and the 1x1 projection shortcut (stride 2)
    g3 = 2 * 512 + 6 * (2 * 2 * 64)
    head = 2 * 256 + 64 + 10 + 10  # final norm + ReLU, pooling, logits, float32 logits
    assert memory.activation_elements("wrn", 10, 1.0, 10, (8, 8, 1), "ghost") == (
        stem + g1 + g2 + g3 + head
    )
    # Without a norm layer: per block the pre norm (at the input's size) and the middle one (at
    # the output's) go, and the final norm.
    no_norm = (1024 + 1024) + (1024 + 512) + (512 + 256) + 256
    assert no_norm == 4608
    assert memory.activation_elements("wrn", 10, 1.0, 10, (8, 8, 1), "none") == (
        stem + g1 + g2 + g3 + head - no_norm
    )


def test_wrn_40_1_64_per_example():
    # 2,055,485 elements: 8.2 MB in float32. Measured on CPU (peak RSS of a float32 step inside
    # tf.function, per example, between batches 16, 144 and 272): 5.2 to 5.7 MB, as an earlier
    # measurement's 5.7 MB; the model errs high by about 1.45x (eager execution measured 13.6 MB:
    # its tape keeps every op's inputs, but the trainer runs its steps in tf.function).
    el = memory.activation_elements("wrn", 40, 1.64, 10, (32, 32, 3), "ghost")
    assert el == 2_055_485
    assert 8.2e6 < el * 4 < 8.25e6


def test_step_bytes_devices_and_the_largest_batch_by_hand():
    assert memory.step_bytes(1000, 50, 8, "float32") == 8 * 1000 * 4 + 50 * 16
    assert memory.step_bytes(1000, 50, 8, "mixed_bfloat16") == 8 * 1000 * 2 + 50 * 16
    v4 = memory.device("v4")
    assert v4.memory == 32 * 2**30 and v4.usable == int(32 * 2**30 * 0.85)
    assert memory.device("v2").memory == 8 * 2**30  # a replica is one of a chip's 2 TensorCores
    assert memory.device("v5litepod") is memory.DEVICES["v5e"]
    v5e = memory.DEVICES["v5e"]
    # 13.6e9 usable bytes / (1e6 elements x 2 bytes) = 6,800 examples.
    assert memory.largest_batch(10**6, 0, v5e, "mixed_bfloat16", 16) == 6800
    assert memory.largest_batch(10**6, 0, v5e, "mixed_bfloat16", 64) == 6784
    # 625M parameters hold 10 GB of state: (13.6 - 10) GB / 2 MB = 1,800.
    assert memory.largest_batch(10**6, 625_000_000, v5e, "mixed_bfloat16") == 1800
    assert memory.largest_batch(10**6, 10**12, v5e, "float32") == 0
    for d in memory.DEVICES.values():
        assert d.source and d.stated, d
        if d.platform == "tpu":
            assert d.source.startswith("https://cloud.google.com/tpu/docs/"), d
    with pytest.raises(ValueError, match="unknown accelerator"):
        memory.device("v9")


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("Tesla V100-SXM2-16GB", "v100-16gb"),
        ("Tesla V100-SXM2-32GB", "v100-32gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_from_cuda_names(name, key):
    dev = memory.gpu_from_name(name)
    assert (dev.name if dev else None) == key


@pytest.mark.parametrize(
    "per_replica, cap, expected",
    [(4096, 0, 1), (4096, 4096, 1), (4096, 3296, 2), (100, 30, 4), (98, 30, 7), (7, 1, 7)],
)
def test_micro_batches(per_replica, cap, expected):
    assert memory.micro_batches(per_replica, cap) == expected


def test_the_paper_config_on_the_slices():
    config = loader.load_config(WRN_CONFIG)
    fit = hardware_fit.check(config, 4, "v4")  # v4-8
    assert fit.fits and fit.policy == "mixed_bfloat16" and fit.suggested_cap == 0
    worst = max(fit.rows, key=lambda r: r.bytes)
    # WRN-40-1.64 at 16,384 over 4 chips, bfloat16: 4,096 x 2,055,485 x 2 + 1,504,291 x 16 bytes.
    assert (worst.member, worst.batch, worst.micro_batch) == ("wrn-40-1.64", 16384, 4096)
    assert worst.bytes == 4096 * 2_055_485 * 2 + 1_504_291 * 16
    assert "fits 4 x v4" in fit.line() and "peak 16.9 GB" in fit.line()
    for replicas, accelerator in [(1, "v5e"), (4, "v5e"), (1, "v6e"), (8, "v2")]:
        fit = hardware_fit.check(config, replicas, accelerator)
        assert not fit.fits, (replicas, accelerator)
        cap = fit.suggested_cap
        assert cap > 0 and f"max_device_batch={cap}" in fit.line()
        config.train.max_device_batch = cap
        capped = hardware_fit.check(config, replicas, accelerator)
        assert capped.fits, (replicas, accelerator, capped.line())
        assert all(r.micro_batch % 16 == 0 for r in capped.rows)  # whole virtual batches
        config.train.max_device_batch = 0
    for replicas, accelerator in [(8, "v5e"), (4, "v6e"), (4, "v5p"), (16, "v4"), (8, "v3")]:
        assert hardware_fit.check(config, replicas, accelerator).fits, (replicas, accelerator)
    # GPUs run float32 by default: one A100 40GB holds 4,096 per step at most.
    gpu = hardware_fit.check(config, 1, "a100-40gb")
    assert gpu.policy == "float32" and not gpu.fits and 0 < gpu.suggested_cap < 4200


def test_the_command_line(capsys):
    assert hardware_fit.main([f"--config={WRN_CONFIG}", "--accelerator=v4", "--replicas=4"]) == 0
    assert capsys.readouterr().out.startswith("memory: the config fits 4 x v4")
    args = [f"--config={WRN_CONFIG}", "--accelerator=v5litepod", "--replicas=4", "--shard=0/2"]
    assert hardware_fit.main(args) == hardware_fit.EXIT_DOES_NOT_FIT
    assert "does not fit 4 x v5e" in capsys.readouterr().out
    assert hardware_fit.main([*args, "--config.train.max_device_batch=2048"]) == 0
    capsys.readouterr()
    assert hardware_fit.main([f"--config={WRN_CONFIG}", "--table"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + 5 and table[-1].startswith("| wrn-40-1.64 | 1,504,291 | 8.22 |")
    assert hardware_fit.main([f"--config={WRN_CONFIG}", "--accelerator=v9"]) == 2
    assert hardware_fit.main([f"--config={WRN_CONFIG}"]) == 2


def test_the_counts_are_the_keras_models_layer_sizes():
    """The closed forms against the models the engine builds: the sum over layers of each output's
    size per example; and the micro-batch rule against the engine's BatchPlan."""
    from wide_tf.engine import models
    from wide_tf.engine.tf.step import BatchPlan

    cases = [
        ("wrn", 40, 1.64, (32, 32, 3), "ghost"),
        ("wrn", 10, 0.79, (8, 8, 1), "ghost"),
        ("wrn", 16, 0.5, (8, 8, 1), "none"),
        ("mlp", 2, 10, (8, 8, 1), "none"),
        ("mlp", 3, 7, (8, 8, 1), "batch"),
    ]
    for arch, depth, width, shape, norm in cases:
        model = models.BUILDERS[arch](depth, width, 10, shape, norm=norm, ghost_batch_size=8)
        keras_count = sum(
            math.prod(layer.output.shape[1:])
            for layer in model.layers
            if type(layer).__name__ != "InputLayer"
        )
        assert keras_count == memory.activation_elements(arch, depth, width, 10, shape, norm)
    for per_replica, cap in [(4096, 3296), (98, 30), (100, 30), (64, 0)]:
        plan = BatchPlan.make(per_replica, 1, cap)
        assert plan.num_micro_batches == memory.micro_batches(per_replica, cap)


@pytest.mark.parametrize(
    "cuda_name,key,gb",
    [
        ("NVIDIA L40S", "l40s", 48),
        ("NVIDIA L40", "l40", 48),
        ("NVIDIA A40", "a40", 48),
        ("NVIDIA A10", "a10", 24),
        ("NVIDIA A10G", "a10g", 24),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada", 48),
        ("NVIDIA RTX A6000", "rtx-a6000", 48),
        ("NVIDIA B200", "b200", 180),
        ("NVIDIA GH200 480GB", "gh200", 96),
        ("NVIDIA H200", "h200", 141),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb", 40),
    ],
)
def test_the_gpus_issue_35_named_are_in_the_table(cuda_name, key, gb):
    dev = memory.gpu_from_name(cuda_name)
    assert dev is memory.DEVICES[key] and dev.memory == gb * memory.GB and dev.source


def test_a_mig_slice_is_not_its_whole_gpu():
    name = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert memory.gpu_from_name(name) is None  # before: the A100's 40 GB
    assert memory.mig_device(name).memory == 5 * memory.GB
    assert memory.gpu_from_name("Quadro RTX 6000") is None  # Turing, 24 GB: not the Ada card
