"""Tests of the data sources and data options: idx files (written here, a few images; never the
installed package), the missing-files line, the pooling option through the packed infeed, the
seeded subset, and Fashion-MNIST's Debian files against TFDS's copy where both are present."""

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from wide_tf.checks import preflight
from wide_tf.engine import arrays, sources
from wide_tf.engine.tf import data
from wide_tf.schema import datasets, defaults, identity
from wide_tf.schema.problems import RuntimeProblem


def write_idx(path, array):
    """An idx file of unsigned bytes (gzipped if the name ends in .gz), LeCun's layout."""
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def fake_fashion(folder, n_train=24, n_test=8, gz=True, seed=0):
    """A Fashion-MNIST-shaped idx folder of random images; returns the arrays written."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n, dtype=np.uint8)
        images, labels = datasets.IDX_FILES[split]
        ext = ".gz" if gz else ""
        write_idx(os.path.join(folder, images + ext), x)
        write_idx(os.path.join(folder, labels + ext), y)
        out[split] = (x, y)
    return out


@pytest.fixture(autouse=True)
def fresh_caches():
    """The sources cache arrays per (name, folder) for the process: clear them around each test."""
    yield
    sources._EMBEDDED_CACHE.clear()
    arrays._TRAIN_CACHE.clear()
    arrays._ARRAYS_CACHE.clear()


def cfg(folder, **kw):
    c = defaults.data_config("fashion_mnist_idx")
    c.data_dir = str(folder)
    c.update(kw)
    return c


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_read_as_written(tmp_path, gz):
    written = fake_fashion(tmp_path, gz=gz)
    info = arrays.dataset_info(cfg(tmp_path))
    assert (info.num_train, info.num_test, info.input_shape) == (24, 8, (28, 28, 1))
    for split in ("train", "test"):
        x, y = sources.memory_arrays("fashion_mnist_idx", split, str(tmp_path))
        np.testing.assert_array_equal(x[..., 0], written[split][0])  # the files' own order
        np.testing.assert_array_equal(y, written[split][1].astype(np.int32))
    xn, _ = arrays.load_arrays(cfg(tmp_path), "test")
    np.testing.assert_allclose(
        xn[..., 0], (written["test"][0] / 255.0 - 0.2860) / 0.3530, rtol=1e-5, atol=1e-5
    )


def test_a_broken_idx_file_is_named(tmp_path):
    fake_fashion(tmp_path)
    with open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(gzip.compress(b"\x00\x00\x0d\x01\x00\x00\x00\x03abc"))  # type 0x0d: floats
    with pytest.raises(sources.DataUnavailableError, match="train-labels.*not an idx file"):
        arrays.dataset_info(cfg(tmp_path))


def test_missing_files_name_the_apt_package_in_one_line(tmp_path):
    with pytest.raises(sources.DataUnavailableError) as e:
        arrays.dataset_info(cfg(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and "apt-get install -y dataset-fashion-mnist" in msg
    assert str(tmp_path) in msg and "--config.data.data_dir" in msg
    config = defaults.base_config("mlp", "fashion_mnist_idx")
    config.data.data_dir = str(tmp_path)
    with pytest.raises(RuntimeProblem, match="apt-get install -y dataset-fashion-mnist"):
        preflight.check_data_present(config, None)
    fake_fashion(tmp_path)
    preflight.check_data_present(config, None)  # present: no problem


def test_pooling_averages_blocks_and_survives_the_packed_infeed(tmp_path):
    written = fake_fashion(tmp_path)
    x = written["train"][0].astype(np.float64)
    for pool, side in ((4, 7), (2, 14)):
        c = cfg(tmp_path, pool=pool)
        assert datasets.of(c).input_shape == (side, side, 1)
        assert arrays.dataset_info(c).input_shape == (side, side, 1)
        raw, _ = arrays.train_arrays(c)
        want = x.reshape(-1, side, pool, side, pool).mean(axis=(2, 4))
        assert raw.dtype == np.uint8 and raw.shape == (24, side, side, 1)
        assert np.abs(raw[..., 0] - want).max() <= 0.5  # the block mean, rounded
        # The streaming path's pooling gives the same bytes.
        streamed = np.stack([data.pool_image_tf(tf.constant(im[..., None]), pool) for im in x])
        np.testing.assert_array_equal(streamed, raw)
        # Packed four pixels an int32 (49 is not a multiple of 4: padded), unpacked on the device
        # into the normalised pooled images load_arrays gives.
        spec = datasets.of(c)
        unpacked = data.device_inputs(data.pack_images(tf.constant(raw)), spec).numpy()
        np.testing.assert_allclose(unpacked, arrays.load_arrays(c, "train")[0], atol=1e-6)
    with pytest.raises(ValueError, match="data.pool=3 does not divide.*use one of 1, 2, 4"):
        datasets.pooled(datasets.get("fashion_mnist_idx"), 3)


def test_a_pooled_training_stream_yields_every_example_once_an_epoch(tmp_path):
    fake_fashion(tmp_path)
    c = cfg(tmp_path, pool=4, shuffle_buffer=0)
    spec = datasets.of(c)
    ds = data.train_input_fn(c, global_batch=8, seed=3)()
    seen = [data.device_inputs(xb, spec).numpy() for xb, _ in ds.take(3)]  # one epoch of 24
    got = np.concatenate(seen)
    want = arrays.load_arrays(c, "train")[0]
    assert got.shape == (24, 7, 7, 1)
    assert sorted(g.tobytes() for g in np.round(got, 4)) == sorted(
        w.tobytes() for w in np.round(want, 4)
    )


def test_the_subset_is_fixed_by_its_seed(tmp_path):
    written = fake_fashion(tmp_path)
    rows = {r.tobytes(): i for i, r in enumerate(written["train"][0])}

    def picked(**kw):
        x, _ = arrays.train_arrays(cfg(tmp_path, num_train=10, **kw))
        return [rows[r[..., 0].tobytes()] for r in x]

    a = picked()
    assert len(set(a)) == 10 and a == picked()  # the same subset every time (default seed)
    b = picked(subset_seed=7)
    assert b == picked(subset_seed=7) and set(b) != set(a)
    assert arrays.dataset_info(cfg(tmp_path, num_train=10)).num_train == 10


def test_data_options_at_their_neutral_values_keep_a_study_its_identity():
    config = defaults.base_config("mlp", "mnist_embedded")
    old = identity.study_part(config)
    assert "pool" not in old["data"] and "subset_seed" not in old["data"]
    config.data.pool = 4
    assert identity.study_part(config)["data"]["pool"] == 4


def test_the_embedded_mnist_is_a_study_data_set_pooled_to_7x7():
    c = defaults.data_config("mnist_embedded")
    c.pool = 4
    info = arrays.dataset_info(c)
    assert (info.num_train, info.input_shape) == (4000, (7, 7, 1))
    x, y = arrays.load_arrays(c, "train")
    assert x.shape == (4000, 7, 7, 1) and np.all(np.bincount(y) == 400)


def _tfds_fashion_dir():
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder("fashion_mnist", data_dir=os.environ.get("TFDS_DATA_DIR"))
    except Exception:
        return None
    return builder if builder.is_prepared() else None


def test_the_debian_files_hold_tfds_fashion_mnist_records():
    """Where both copies are present: TFDS's first records are records of the Debian files, with
    the same labels (TFDS stores them in another order)."""
    spec = datasets.get("fashion_mnist_idx")
    try:
        datasets.idx_paths(spec, None, "train")
    except FileNotFoundError:
        pytest.skip("dataset-fashion-mnist is not installed")
    builder = _tfds_fashion_dir()
    if builder is None:
        pytest.skip("TFDS fashion_mnist is not prepared here (needs the network once)")
    x, y = sources.memory_arrays("fashion_mnist_idx", "train")
    assert x.shape == (60000, 28, 28, 1)
    table = {}
    for i, im in enumerate(x):
        table.setdefault(im.tobytes(), []).append(int(y[i]))
    ds = builder.as_dataset(split="train", shuffle_files=False).take(20)
    for ex in ds.as_numpy_iterator():
        assert int(ex["label"]) in table[ex["image"].tobytes()]
