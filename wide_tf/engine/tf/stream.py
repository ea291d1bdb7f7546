"""Owns the in-memory training stream: engine/tf/data.py's training batches for one CPU replica,
produced inside the traced training loop from variables instead of by a tf.data iterator."""

from __future__ import annotations

import tensorflow as tf

from wide_tf.engine import arrays
from wide_tf.engine.tf import data
from wide_tf.schema import datasets


class InMemoryTrainStream:
    """data.make_train_dataset's stream for one replica, as variables and a `get_next()` that
    the traced training loop calls like an iterator's: the same global batches (the same
    `data.epoch_order`, gathered from the same arrays, augmented with the same keyed crops and
    flips, packed the same way), without a tf.data pipeline and iterator per run.

    Opening a distributed dataset's iterator cost 0.1-0.25 s per run here (its threads and
    functions), a tenth of a local-study run; closing an augmenting one, whose threads run ahead
    on a worker's one core, took 10-60 s of a 45-90 s WRN run. One stream is kept per (member,
    batch) build (engine/tf/reuse.py) and `start`ed per run by three assigns, so the traced loop,
    which sees the same Python object, is kept too. Needs global_batch <= num_train (a batch
    spans at most two epochs: the orders of the current and the next epoch are held, recomputed
    when the stream enters a new epoch)."""

    def __init__(self, data_cfg, global_batch: int, open_batch: bool = False):
        images, labels = arrays.train_arrays(data_cfg)
        self.n, self.batch = int(len(labels)), int(global_batch)
        if not 0 < self.batch <= self.n:
            raise ValueError(f"need 0 < global batch <= {self.n} examples, got {self.batch}")
        # `open_batch`: the batch a variable of the trace (`rebatch`), so a member's batch sizes
        # share one stream and the loops traced on it (step.Stepper's open_batch); else a
        # constant, the batch dimension static.
        self.batch_size = (
            tf.Variable(self.batch, dtype=tf.int64, trainable=False) if open_batch else None
        )
        self.shuffle_buffer = int(data_cfg.shuffle_buffer)
        self.spec = datasets.of(data_cfg)
        self.augment = bool(data_cfg.augment)
        # Augmented: uint8 images, cropped and flipped, then packed; else packed rows, gathered.
        self.x = tf.constant(images) if self.augment else data.pack_images(tf.constant(images))
        self.y = tf.constant(labels)
        self.seed = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.position = tf.Variable(0, dtype=tf.int64, trainable=False)  # in the epoch stream
        self.order_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)  # -1: none held
        self.order = tf.Variable(tf.zeros([2 * self.n], tf.int64), trainable=False)

    def start(self, seed: int, start_step: int = 0) -> InMemoryTrainStream:
        """Ready for a run with this seed at global step `start_step` (0, or a resume's)."""
        self.seed.assign(int(seed))
        self.position.assign(int(start_step) * self.batch)
        self.order_epoch.assign(-1)
        return self

    def rebatch(self, global_batch: int) -> None:
        """Serves `global_batch` from the next `start` on (an `open_batch` stream only)."""
        if not 0 < global_batch <= self.n:
            raise ValueError(f"need 0 < global batch <= {self.n} examples, got {global_batch}")
        self.batch = int(global_batch)
        self.batch_size.assign(self.batch)

    def get_next(self):
        """The next global batch: (packed images, labels), as the dataset yields it."""
        n = tf.constant(self.n, tf.int64)
        seed = tf.identity(self.seed)
        epoch = self.position // n

        def refresh():
            both = tf.concat(
                [
                    data.epoch_order(self.n, seed, epoch, self.shuffle_buffer),
                    data.epoch_order(self.n, seed, epoch + 1, self.shuffle_buffer),
                ],
                0,
            )
            with tf.control_dependencies([self.order.assign(both), self.order_epoch.assign(epoch)]):
                return tf.identity(both)

        order = tf.cond(tf.equal(self.order_epoch, epoch), lambda: tf.identity(self.order), refresh)
        batch = self.batch if self.batch_size is None else self.batch_size.read_value()
        places = self.position - epoch * n + tf.range(batch, dtype=tf.int64)
        index = tf.gather(order, places)
        with tf.control_dependencies([index]):
            self.position.assign_add(batch)
        images = tf.gather(self.x, index)
        if self.augment:
            epochs = epoch + places // n  # each example's own: a batch may straddle two

            def one(args):
                image, e, i = args
                return data.augment_image(image, data.augment_key(seed, e, i), self.spec)

            images = data.pack_images(
                tf.map_fn(
                    one,
                    (images, epochs, index),
                    fn_output_signature=tf.TensorSpec(images.shape[1:], images.dtype),
                )
            )
        return images, tf.gather(self.y, index)
