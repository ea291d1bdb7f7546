"""Owns a data set's arrays in host memory, without TensorFlow: its sizes (dataset_info), the
training subset trained on (train_arrays: data.num_train, data.subset_seed, data.pool), an
in-memory test split, and the float32 normalisation. engine/tf/data.py builds TensorFlow's pipelines
from these arrays; the JAX backend (engine/jax/data.py) builds its own from the same arrays."""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from wide_tf.engine.sources import (  # noqa: F401  (DataUnavailableError: the engine's data error)
    DataUnavailableError,
    _tfds_builder,
    _tfds_mocked,
    _tfds_split,
    _tfds_split_size,
    _to_numpy,
    memory_arrays,
    pool_images,
)
from wide_tf.schema import datasets

_SUBSET_SEED = 20180601  # data.subset_seed's default: the subset is never the run's seed's


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_train: int
    num_test: int
    num_classes: int
    input_shape: tuple


def steps_per_epoch(num_train: int, global_batch: int) -> float:
    """Optimizer steps per epoch with concatenated epochs: num_train / global_batch (a float)."""
    return num_train / global_batch


_TRAIN_CACHE = {}


def _subset(images, labels, num_train, subset_seed=_SUBSET_SEED):
    """The first num_train examples after a permutation fixed by data.subset_seed (never the run's
    seed: every run of a study trains on the same subset); 0 = all."""
    n = len(labels)
    if not num_train or num_train >= n:
        if num_train and num_train > n:
            logging.warning(
                "data.num_train=%d exceeds the %d training examples; using all", num_train, n
            )
        return images, labels
    idx = np.random.default_rng(int(subset_seed)).permutation(n)[:num_train]
    return images[idx], labels[idx]


def data_options(data_cfg):
    """(num_train, subset_seed, pool) of a data section (sections written before the options
    existed read as their neutral values)."""
    return (
        int(data_cfg.num_train),
        int(data_cfg.get("subset_seed", _SUBSET_SEED)),
        int(data_cfg.get("pool", 1) or 1),
    )


def train_arrays(data_cfg):
    """Canonical training set (uint8 images, int32 labels), data.num_train and data.pool
    applied."""
    name = data_cfg.name
    spec = datasets.get(name)
    num_train, subset_seed, pool = data_options(data_cfg)
    datasets.of(data_cfg)  # a pool that does not divide the images: one clear error first
    mocked = not spec.in_memory and _tfds_mocked()
    key = (name, data_cfg.data_dir or None, num_train, subset_seed, pool)
    if not mocked and key in _TRAIN_CACHE:  # mocked data change between tests: never cache them
        return _TRAIN_CACHE[key]
    if spec.in_memory:
        raw = memory_arrays(name, "train", data_cfg.data_dir)
    else:
        raw = _to_numpy(*_tfds_split(_tfds_builder(data_cfg), "train"), spec)
    images, labels = _subset(*raw, num_train, subset_seed)
    arrays = (pool_images(images, pool), labels)
    if not mocked:
        _TRAIN_CACHE[key] = arrays
    return arrays


def memory_test(data_cfg):
    """An in-memory set's test split, data.pool applied."""
    images, labels = memory_arrays(data_cfg.name, "test", data_cfg.data_dir)
    return pool_images(images, data_options(data_cfg)[2]), labels


def dataset_info(data_cfg) -> DatasetInfo:
    """Sizes and shapes, without reading the data; DataUnavailableError in seconds if missing."""
    name = data_cfg.name
    spec = datasets.of(data_cfg)
    num_train = int(data_cfg.num_train)
    if spec.in_memory:
        n_train = len(memory_arrays(name, "train", data_cfg.data_dir)[1])
        n_test = len(memory_arrays(name, "test", data_cfg.data_dir)[1])
    else:
        builder = _tfds_builder(data_cfg)
        n_train = _tfds_split_size(builder, "train")
        n_test = _tfds_split_size(builder, "test")
    if num_train:
        n_train = min(n_train, num_train)
    return DatasetInfo(name, n_train, n_test, spec.num_classes, spec.input_shape)


def normalize(images, spec) -> np.ndarray:
    """uint8 images as the model's float32 inputs: (x / scale - mean) / std, per channel."""
    x = images.astype(np.float32) / spec.scale - np.asarray(spec.mean, np.float32)
    return (x / np.asarray(spec.std, np.float32)).astype(np.float32, copy=False)


_TEST_CACHE = {}


def _test_arrays(data_cfg):
    """A TFDS test split as uint8 images and int32 labels, read once per process (evaluation
    runs on a cadence in every run of a study; re-reading the split each time cost more than the
    forward passes). None for mocked data, which change between tests."""
    if _tfds_mocked():
        return None
    spec = datasets.of(data_cfg)
    pool = data_options(data_cfg)[2]
    key = (data_cfg.name, data_cfg.data_dir or None, pool)
    if key not in _TEST_CACHE:
        split = _tfds_split(_tfds_builder(data_cfg), "test")
        images, labels = _to_numpy(*split, datasets.get(spec.name))
        _TEST_CACHE[key] = pool_images(images, pool), labels
    return _TEST_CACHE[key]


def eval_arrays(data_cfg, split, limit):
    """(raw images, labels) when the split is held in memory (training splits, embedded sets, and
    TFDS test splits, cached once per process)."""
    spec = datasets.of(data_cfg)
    if split == "train":
        images, labels = train_arrays(data_cfg)
    elif split == "test" and spec.in_memory:
        images, labels = memory_test(data_cfg)
    elif split == "test" and _test_arrays(data_cfg) is not None:
        images, labels = _test_arrays(data_cfg)
    else:
        return None
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images, labels


def eval_padding(num_examples: int, batch_size: int) -> int:
    """How many padding examples fill the last evaluation batch."""
    return (-num_examples) % batch_size


def pad_for_evaluation(images, labels, batch_size: int, dtype=None):
    """(images, int32 labels, float32 weights), padded to a multiple of `batch_size` with zero
    images of label 0 and weight 0: every batch has the same static shape and sum(weights) is the
    number of examples. The images keep their dtype unless `dtype` is given."""
    images = np.asarray(images, dtype)
    n, pad = len(labels), eval_padding(len(labels), batch_size)
    return (
        np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)]),
        np.concatenate([np.asarray(labels, np.int32), np.zeros(pad, np.int32)]),
        np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)]),
    )


def tfds_split(data_cfg, split: str):
    """(tf.data dataset of raw (image, label), number of examples) of a TFDS split that is not held
    in host memory: TensorFlow's evaluation streams it (engine/tf/data.py)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return _tfds_split(_tfds_builder(data_cfg), split)


_ARRAYS_CACHE = {}


def load_arrays(data_cfg, split: str, limit: int | None = None):
    """(x float32 normalised NHWC, y int32) of a split in canonical order, first `limit` if given.

    Cached per process (not for mocked data): every run of a study asks for the same evaluation
    and probe sets. The arrays are shared: do not modify them."""
    spec = datasets.of(data_cfg)
    key = (data_cfg.name, data_cfg.data_dir or None, data_options(data_cfg), split, limit)
    cacheable = spec.in_memory or not _tfds_mocked()
    if cacheable and key in _ARRAYS_CACHE:
        return _ARRAYS_CACHE[key]
    arrays = eval_arrays(data_cfg, split, limit)
    if arrays is not None:
        images, labels = arrays
    else:  # a TFDS split not held in memory (mocked in tests): read whole, then pooled
        ds, n = tfds_split(data_cfg, split)
        n = n if limit is None else min(n, int(limit))
        raw = _to_numpy(ds.take(n), n, datasets.get(spec.name))
        images, labels = pool_images(raw[0], data_options(data_cfg)[2]), raw[1]
    x = (images.astype(np.float32) / spec.scale - np.asarray(spec.mean, np.float32)) / np.asarray(
        spec.std, np.float32
    )
    out = (x.astype(np.float32, copy=False), np.asarray(labels, np.int32))
    if cacheable:
        for a in out:
            a.setflags(write=False)
        _ARRAYS_CACHE[key] = out
    return out
