"""Owns what the benchmark's parts share: the benchmarked models (Case), their synthetic data, the
package's optimizer as a run builds it, the repository's root and the median."""

from __future__ import annotations

import dataclasses
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from wide_tf.engine import optim as optim_lib  # noqa: E402
from wide_tf.engine.models import build_model  # noqa: E402
from wide_tf.schema import defaults  # noqa: E402

# The repository (configs/, the package's parent): tools/bench/common.py is 2 folders down.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmarked model and the batch it is trained with."""

    arch: str
    depth: int
    width: float
    input_shape: tuple
    batch: int  # training batch of the loop-vs-fit comparison
    steps_per_loop: int  # steps per Stepper.train call and fit's steps_per_execution
    norm: str = "none"
    num_classes: int = 10

    @property
    def name(self) -> str:
        if self.arch == "mlp":
            return f"mlp-d{self.depth}-w{int(self.width)}"
        side = "x".join(str(s) for s in self.input_shape)
        return f"wrn-{self.depth}-{self.width:g}@{side}"

    def build(self) -> keras.Model:
        return build_model(
            self.arch, self.depth, self.width, self.num_classes, self.input_shape, norm=self.norm
        )


def default_cases(quick: bool) -> list[Case]:
    if quick:  # seconds, for the test: the code paths, not meaningful numbers
        return [
            Case("mlp", 1, 64, (8, 8, 1), batch=16, steps_per_loop=3),
            Case("wrn", 10, 1, (8, 8, 3), batch=8, steps_per_loop=2, norm="batch"),
        ]
    # WRN-16-2 (CIFAR's weights) on 16x16 inputs: on 32x32 a batch of 128 takes ~0.5 s on 2 idle CPU
    # cores (9 s per 10-step call under load), too slow for a bench of a few minutes.
    return [
        Case("mlp", 2, 1024, (28, 28, 1), batch=128, steps_per_loop=50),
        Case("wrn", 16, 2, (16, 16, 3), batch=128, steps_per_loop=10, norm="batch"),
        # Overhead-bound: a step of this tiny MLP at batch 16 costs less than the host's work
        # around it, so the row compares what the loop does besides computing.
        OVERHEAD_CASE,
    ]


OVERHEAD_CASE = Case("mlp", 1, 32, (8, 8, 1), batch=16, steps_per_loop=20)


def _arrays(case: Case, n: int, seed: int):
    """Synthetic in-memory examples: speed does not depend on the pixel values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n,) + tuple(case.input_shape)).astype(np.float32)
    y = rng.integers(0, case.num_classes, size=n).astype(np.int32)
    return x, y


def _train_dataset(x, y, batch: int) -> tf.data.Dataset:
    # The shape of a real run's stream (wide_tf.engine.tf.data): in memory, repeating, fixed
    # batches, prefetched.
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def _optimizer(batch: int):
    """The package's momentum SGD (constant schedule), as a run builds it; lr small enough to never
    diverge on random labels (a diverged Stepper stops stepping, which would fake its speed)."""
    cfg = defaults.optim_config("momentum", base_lr=0.01)
    cfg.scaling = "none"
    return optim_lib.build_optimizer(cfg, batch, steps_per_epoch=100, total_steps=10**9)


def _median(values):
    return float(statistics.median(values))
