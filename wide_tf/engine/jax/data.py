"""Owns the JAX backend's data: the training set held on the devices, the order of its examples
(which examples make global batch t, a pure function of the seed and the epoch), the keyed
augmentation, and the evaluation and probe sets as padded device arrays. No TensorFlow: the arrays
come from engine/arrays.py and the orders from NumPy.

The semantics are engine/tf/data.py's (docs/science.md, "Quantities"): epochs are concatenated
before batching, so global batch t is examples [t*B, (t+1)*B) of the stream epoch 0, epoch 1, ...;
each epoch's order is a stateless function of (seed, epoch); `data.shuffle_buffer` is the local
shuffle (each example moves by fewer than that many places) or a uniform permutation. The orders are
NumPy's (PCG64 keyed by seed, salt and epoch), not TensorFlow's stateless Philox, so the two
backends train on the same examples in a different order: a study's records never mix backends
(runtime.backend is part of its identity)."""

from __future__ import annotations

import numpy as np

from wide_tf.engine import arrays
from wide_tf.schema import datasets

_PERM_SALT, _AUG_SALT = 0x5EED01, 0x5EED02  # engine/tf/data.py's salts, the same streams' names


def epoch_order(n: int, seed: int, epoch: int, shuffle_buffer: int) -> np.ndarray:
    """Index order of one epoch: a pure function of (n, seed, epoch, shuffle_buffer)."""
    u = np.random.Generator(np.random.PCG64([int(seed), _PERM_SALT, int(epoch)])).random(n)
    if 0 < shuffle_buffer < n:
        u = np.arange(n, dtype=np.float64) + float(shuffle_buffer) * u
    return np.argsort(u, kind="stable").astype(np.int32)


class TrainOrder:
    """Which examples make each global batch: `take(step, k)` is the [k, B] int32 index block of
    global steps step .. step+k-1 (and `epochs(step, k)`, each index's epoch, for the augmentation
    keys). Resuming at step s needs s alone."""

    def __init__(self, n: int, batch: int, seed: int, shuffle_buffer: int):
        if not 0 < batch:
            raise ValueError(f"need a positive global batch, got {batch}")
        self.n, self.batch, self.seed = int(n), int(batch), int(seed)
        self.shuffle_buffer = int(shuffle_buffer)
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) > 4:  # the stream moves forwards: old epochs are not read again
                self._orders.pop(min(self._orders))
            self._orders[epoch] = epoch_order(self.n, self.seed, epoch, self.shuffle_buffer)
        return self._orders[epoch]

    def take(self, step: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """([k, B] example indices, [k, B] their epochs) of global steps step .. step+k-1."""
        start, count = int(step) * self.batch, int(k) * self.batch
        positions = start + np.arange(count, dtype=np.int64)
        epochs = positions // self.n
        index = np.empty(count, np.int32)
        for e in np.unique(epochs):
            mask = epochs == e
            index[mask] = self._order(int(e))[positions[mask] - int(e) * self.n]
        shape = (int(k), self.batch)
        return index.reshape(shape), epochs.astype(np.int32).reshape(shape)


def normalize(images, spec):
    """uint8 images (a device array) as the model's float32 inputs, on the device."""
    import jax.numpy as jnp

    x = images.astype(jnp.float32) / spec.scale - jnp.asarray(spec.mean, jnp.float32)
    return x / jnp.asarray(spec.std, jnp.float32)


def augment(images, index, epochs, seed: int, spec):
    """Pad (black) and random crop, and a left-right flip where the data set allows, per example,
    keyed by (seed, epoch, example index): engine/tf/data.augment_image's recipe, with JAX's
    keys."""
    import jax
    import jax.numpy as jnp

    h, w, c = spec.input_shape
    pad = max(1, round(h / 8))  # 4 pixels at 32x32 (the usual CIFAR recipe), 1 at 8x8
    base = jax.random.fold_in(jax.random.key(seed), _AUG_SALT)

    def one(image, i, e):
        key = jax.random.fold_in(jax.random.fold_in(base, e), i)
        k_crop, k_flip = jax.random.split(key)
        padded = jnp.pad(image, ((pad, pad), (pad, pad), (0, 0)))
        dy, dx = jax.random.randint(k_crop, (2,), 0, 2 * pad + 1)
        image = jax.lax.dynamic_slice(padded, (dy, dx, 0), (h, w, c))
        if spec.flip:
            image = jnp.where(jax.random.bernoulli(k_flip), image[:, ::-1, :], image)
        return image

    return jax.vmap(one)(images, index, epochs)


def eval_arrays(data_cfg, split: str, batch_size: int, limit: int | None = None):
    """(uint8 images [nb, bs, H, W, C], labels [nb, bs], weights [nb, bs], examples) of an
    evaluation split in canonical order, padded with weight-0 zero images to whole batches (as
    engine/arrays.pad_for_evaluation pads). In-memory splits only: the training subset, and the
    test split of an in-memory data set (TFDS test splits are read through engine/tf/data.py on
    TensorFlow only)."""
    spec = datasets.of(data_cfg)
    if split == "train":
        images, labels = arrays.train_arrays(data_cfg)
    elif spec.in_memory:
        images, labels = arrays.memory_test(data_cfg)
    else:
        raise ValueError(
            f"the JAX backend evaluates in-memory data sets only; {data_cfg.name!r}'s test split "
            f"is read through TFDS: use runtime.backend='tensorflow' or an in-memory data set"
        )
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    n = len(labels)
    pad = (-n) % batch_size
    images = np.concatenate([images, np.zeros((pad,) + images.shape[1:], images.dtype)])
    labels = np.concatenate([np.asarray(labels, np.int32), np.zeros(pad, np.int32)])
    weights = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
    nb = len(labels) // batch_size
    return (
        images.reshape((nb, batch_size) + images.shape[1:]),
        labels.reshape(nb, batch_size),
        weights.reshape(nb, batch_size),
        n,
    )
