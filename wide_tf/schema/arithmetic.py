"""Owns the arithmetic of training: each member's forward multiply-adds per example from its
architecture alone, a training example's floating-point operations, and each accelerator's peak
rate per replica (with its source); pure Python, no TensorFlow.

A training step costs about three forward passes per example (the forward, and a backward pass
that forms the gradients of both the activations and the weights, each about one forward's
multiply-adds): 3 x 2 FLOP per forward multiply-add. Counted: the dense layers' and convolutions'
multiply-adds (the normalisation, activations, pooling and the loss are a few operations per
activation, under 1% of a WRN's). The peak rates are the vendors' dense bfloat16 figures: a small
model keeps a chip far below them (docs/benchmarks.md measured 3-20% of a CPU's own matmul rate),
so a time computed at peak is a floor."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from wide_tf.schema import architectures

FLOP_PER_MULTIPLY_ADD = 2
TRAINING_PASSES = 3  # forward + backward (activations' and weights' gradients)


def _wrn_multiply_adds(depth: int, width: float, num_classes: int, input_shape) -> int:
    spec = architectures.WRN_SPEC
    n = spec.blocks_per_group(depth)
    h, w, channels_in = input_shape
    total = h * w * 9 * channels_in * spec.stem_channels  # stem: 3x3, stride 1, 'same'
    prev = spec.stem_channels
    for c, stride in zip(spec.channels(width), spec.group_strides):
        for b in range(n):
            s = stride if b == 0 else 1
            h, w = math.ceil(h / s), math.ceil(w / s)
            total += h * w * 9 * prev * c  # conv1 (its stride)
            total += h * w * 9 * c * c  # conv2
            if prev != c or s != 1:  # the 1x1 projection shortcut
                total += h * w * prev * c
            prev = c
    return total + prev * num_classes  # the logits (after global pooling)


def _mlp_multiply_adds(depth: int, width, num_classes: int, input_shape) -> int:
    widths = [math.prod(input_shape)] + [int(width)] * depth + [num_classes]
    return sum(a * b for a, b in zip(widths, widths[1:]))


def forward_multiply_adds(
    arch: str, depth: int, width, num_classes: int, input_shape: Sequence[int]
) -> int:
    """Multiply-adds of one example's forward pass (dense layers and convolutions)."""
    if arch == "wrn":
        return _wrn_multiply_adds(depth, width, num_classes, tuple(input_shape))
    if arch == "mlp":
        return _mlp_multiply_adds(depth, width, num_classes, tuple(input_shape))
    raise ValueError(
        f"no arithmetic model for arch {arch!r}; add one to wide_tf/schema/arithmetic.py"
    )


def training_flop(multiply_adds: int) -> int:
    """FLOP of one training example (forward and backward) from its forward multiply-adds."""
    return TRAINING_PASSES * FLOP_PER_MULTIPLY_ADD * multiply_adds


@dataclasses.dataclass(frozen=True)
class PeakRate:
    flop_per_s: float  # per replica (wide_tf.schema.memory.DEVICES' unit: a chip, a TensorCore)
    stated: str
    source: str


# Dense bfloat16 (the TPU runtime's default policy, and the GPUs' tensor cores); per replica.
PEAK_RATES: dict[str, PeakRate] = {
    # 123 TFLOPs per chip of two TensorCores, each a replica.
    "v3": PeakRate(
        123e12 / 2, "123 TFLOPs (bf16) per chip", "https://cloud.google.com/tpu/docs/v3"
    ),
    "v4": PeakRate(275e12, "275 TFLOPs (bf16) per chip", "https://cloud.google.com/tpu/docs/v4"),
    "v5e": PeakRate(197e12, "197 TFLOPs (bf16) per chip", "https://cloud.google.com/tpu/docs/v5e"),
    "v6e": PeakRate(918e12, "918 TFLOPs (bf16) per chip", "https://cloud.google.com/tpu/docs/v6e"),
    # The SXM part: NVIDIA states 1,979 TFLOPS with 2:4 sparsity, half of it dense.
    "h100-80gb": PeakRate(
        989e12,
        "989 TFLOPS (bf16, dense) per GPU",
        "NVIDIA H100 data sheet (copy: https://glennklockwood.com/garden/processors/h100)",
    ),
}


def peak_rate(device_name: str) -> PeakRate | None:
    """The peak rate of one replica of `device_name` (a wide_tf.schema.memory.DEVICES key); None
    where none is recorded."""
    return PEAK_RATES.get(device_name)
