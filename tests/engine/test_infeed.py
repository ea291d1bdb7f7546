"""Images travel host-to-device as their uint8 bytes (packed four to an int32, a layout every
platform shares) and are normalised inside the compiled step: the same numbers as normalising them
on the host in float32, a quarter of the bytes per example."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from wide_tf.engine import arrays
from wide_tf.engine.models import build_model
from wide_tf.engine.tf import data
from wide_tf.engine.tf.step import BatchPlan, Stepper
from wide_tf.schema import defaults


def _cfg(name="digits_embedded", **kw):
    cfg = defaults.data_config(name)
    cfg.update(kw)
    return cfg


@pytest.mark.parametrize("name", ["digits_embedded", "mnist_embedded", "cifar10"])
def test_unpacked_on_the_device_equals_the_float32_path(name):
    spec = data.DATASETS[name]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(5,) + spec.input_shape).astype(np.uint8)
    raw[0] = 255  # every bit of every byte set: no sign extension survives the unpacking
    raw[1] = 0
    packed = data.pack_images(tf.constant(raw))
    assert packed.dtype == tf.int32 and packed.shape == (5, raw[0].size // 4)
    np.testing.assert_array_equal(
        data.device_inputs(packed, spec).numpy(), data._normalize(raw, spec).numpy()
    )
    one = data.pack_images(tf.constant(raw[2]))  # a single example, as the per-example maps pack
    np.testing.assert_array_equal(one.numpy(), packed[2].numpy())


def test_what_enters_the_step_is_a_quarter_of_float32():
    """Training and evaluation elements carry the images' bytes; per example 64 bytes for the
    8x8 digits (256 as float32), 3,072 for CIFAR (12,288)."""
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    with tfds.testing.mock_data(num_examples=16):
        for name, values in (("digits_embedded", 64), ("cifar10", 3072)):
            cfg = _cfg(name, augment=True)
            for ds in (
                data.make_train_dataset(cfg, 8, one, seed=0),
                data.make_eval_dataset(cfg, "test", 8, one).dataset,
            ):
                images = ds.element_spec[0]
                assert images.dtype == tf.int32 and images.shape == (8, values // 4)
                assert images.shape[1:].num_elements() * images.dtype.size == values


def _train(packed: bool, steps=3):
    """A few steps of a small CNN with ghost batch norm on the embedded digits, augmented: fed
    packed (normalised in the step), or normalised on the host in float32 (the old path)."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    cfg = _cfg(augment=True)
    spec = data.DATASETS[cfg.name]
    fn = data.train_input_fn(cfg, 16, seed=3)
    if not packed:
        source = fn

        def fn(ctx=None):
            return source(ctx).map(lambda x, y: (data.device_inputs(x, spec), y))

    keras.utils.set_random_seed(4)
    with strategy.scope():
        model = build_model("wrn", 10, 1, 10, spec.input_shape, norm="ghost", ghost_batch_size=8)
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        opt.build(model.trainable_variables)
        stepper = Stepper(
            model, opt, strategy, BatchPlan.make(16, 1), input_spec=spec if packed else None
        )
    out = stepper.train(iter(strategy.distribute_datasets_from_function(fn)), steps)
    evaluation = packed and stepper.evaluate(data.make_eval_dataset(cfg, "test", 32, strategy))
    return out, [v.numpy() for v in model.variables], evaluation


def test_training_and_evaluation_give_the_numbers_of_the_float32_path():
    packed, packed_weights, packed_eval = _train(True)
    host, host_weights, _ = _train(False)
    assert packed["loss_sum"] == pytest.approx(host["loss_sum"], rel=1e-6)
    assert packed["correct"] == host["correct"] and packed["steps"] == 3
    for a, b in zip(packed_weights, host_weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # The packed evaluation set (padded: 359 examples, batches of 32) against the float arrays.
    x, y = arrays.load_arrays(_cfg(), "test")
    logits = keras.ops.convert_to_numpy(_model_of(packed_weights)(x, training=False))
    losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).numpy()
    assert packed_eval["examples"] == 359
    assert packed_eval["loss"] == pytest.approx(losses.mean(), rel=1e-5)
    assert packed_eval["accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == y))


def _model_of(weights):
    model = build_model("wrn", 10, 1, 10, (8, 8, 1), norm="ghost", ghost_batch_size=8)
    model.set_weights(weights)
    return model


def test_no_comment_cites_the_retired_uint8_limit():
    """TensorFlow 2.1's TPU runtime had no uint8 kernels (tensorflow/tensorflow#37426); current
    TensorFlow lists DT_UINT8 among the TPU's types (tensorflow/core/tpu/tpu_defs.h), so the
    packing's comment and docs/tpu.md may not give that limit as its reason."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    stale = "TPUs take " + "no uint8"
    for path in (root / "wide_tf/engine/tf/data.py", root / "docs/tpu.md"):
        assert stale not in " ".join(path.read_text().split()), path
