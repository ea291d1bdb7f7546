"""Owns the data sets a config may name: their shapes, classes, split sizes, normalisation and
how each is loaded. The config checks read it before TensorFlow starts, engine/data.py builds its
pipelines from it, the planner and the simulator size a study with it."""

from __future__ import annotations

import dataclasses

LOADERS = ("embedded", "tfds")  # in memory from a Python package, or a prepared TFDS copy


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    tfds_name: str | None  # None: embedded in-memory data
    num_train: int  # the whole training split (data.num_train may take a subset)
    num_test: int
    num_classes: int
    input_shape: tuple
    scale: float  # raw stored value / scale is in [0, 1]
    mean: tuple  # per-channel, of the [0, 1] values
    std: tuple
    flip: bool  # horizontal flips are label-preserving (not for digits / house numbers)

    @property
    def loader(self) -> str:
        return "embedded" if self.tfds_name is None else "tfds"


_MNIST = dict(input_shape=(28, 28, 1), num_classes=10, scale=255.0, flip=False)
_CIFAR = dict(input_shape=(32, 32, 3), scale=255.0)

# Normalisation constants are the usual published per-channel training-set statistics; fixed
# constants (not computed per run) so that every trial and every subset sees the same inputs.
# mnist_embedded uses the MNIST constants (its own 5,000 images give 0.1313 / 0.3086), digits the
# statistics of load_digits()/16. The embedded sets' sizes are their fixed 80/20 stratified split.
DATASETS = {
    d.name: d
    for d in (
        Dataset("mnist_embedded", None, 4000, 1000, mean=(0.1307,), std=(0.3081,), **_MNIST),
        Dataset(
            "digits_embedded", None, 1438, 359, 10, (8, 8, 1), 16.0, (0.3053,), (0.3760,), False
        ),
        Dataset("mnist", "mnist", 60000, 10000, mean=(0.1307,), std=(0.3081,), **_MNIST),
        Dataset(
            "fashion_mnist", "fashion_mnist", 60000, 10000, mean=(0.2860,), std=(0.3530,), **_MNIST
        ),
        Dataset(
            "cifar10",
            "cifar10",
            50000,
            10000,
            num_classes=10,
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2470, 0.2435, 0.2616),
            flip=True,
            **_CIFAR,
        ),
        Dataset(
            "cifar100",
            "cifar100",
            50000,
            10000,
            num_classes=100,
            mean=(0.5071, 0.4865, 0.4409),
            std=(0.2673, 0.2564, 0.2762),
            flip=True,
            **_CIFAR,
        ),
        Dataset(
            "svhn_cropped",
            "svhn_cropped",
            73257,
            26032,
            num_classes=10,
            mean=(0.4377, 0.4438, 0.4728),
            std=(0.1980, 0.2010, 0.1970),
            flip=False,
            **_CIFAR,
        ),
    )
}
NAMES = tuple(DATASETS)


def get(name: str) -> Dataset:
    """The data set called `name`; ValueError naming the valid ones otherwise."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; valid choices: {', '.join(DATASETS)}")
    return DATASETS[name]
