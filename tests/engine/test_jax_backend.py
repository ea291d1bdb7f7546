"""The JAX backend, in one child process with KERAS_BACKEND=jax and eight virtual CPU
devices (tests/jax_checks.py): a whole run imports no TensorFlow and writes a record of the
TensorFlow path's schema; SIGTERM resume equals the uninterrupted run; data parallel over 8
devices and micro-batching give the one-device update; the exact probe agrees with TensorFlow's
on the same weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO

pytest.importorskip("jax")


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax")
    env = dict(os.environ, KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.jax_checks", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("JSON "))
    return json.loads(line[5:]), out


def test_a_jax_run_imports_no_tensorflow_and_writes_the_same_record_schema(checks):
    found, _ = checks
    assert found["tensorflow_imported"] == []
    assert found["problems"] == []
    assert found["status"] in ("reached", "not_reached")
    assert found["final_train_accuracy"] > 0.5  # it learned: 10 classes, chance is 0.1


def test_sigterm_resume_on_jax_equals_the_uninterrupted_run(checks):
    found, _ = checks
    assert found["preempted_at"] is not None
    assert all(found["resume_equal"].values()), found["resume_equal"]


def test_eight_devices_and_micro_batches_give_the_one_device_update(checks):
    found, _ = checks
    assert found["devices"] == 8
    assert found["plan_eight"]["replicas"] == 8
    assert found["plan_eight_micro"]["micro_batches"] == 2
    assert found["max_diff_eight"] < 1e-5
    assert found["max_diff_eight_micro"] < 1e-5
    assert found["loss_eight"] == pytest.approx(found["loss_one"], rel=1e-5)


def test_ghost_batch_norm_is_exact_over_devices_and_micro_batches(checks):
    """Virtual batches of 4 lie inside every replica's micro-batch: the weights and the moving
    statistics (stepped once per update from the merged statistics) are the one-device ones."""
    found, _ = checks
    assert found["weights_ghost"] > found["weights"]  # the moving statistics are compared too
    assert found["max_diff_eight_ghost"] < 1e-5
    assert found["max_diff_eight_micro_ghost"] < 1e-5


def test_the_batch_norm_recompute_on_jax_matches_numpy(checks):
    """The evaluations' statistics from the training subset (average of per-batch statistics),
    and the training run's own moving statistics untouched (still their initial zeros)."""
    found, _ = checks
    assert found["recompute_mean_diff"] < 1e-4
    assert found["recompute_var_diff"] < 1e-3
    assert found["recompute_left_training_alone"]


def test_the_jax_probe_agrees_with_tensorflows_on_the_same_weights(checks):
    found, out = checks
    import keras

    from tests.jax_checks import tiny_config
    from wide_tf.engine import arrays, train
    from wide_tf.engine.tf import per_example

    config = tiny_config()
    config.runtime.backend = "tensorflow"
    info = arrays.dataset_info(config.data)
    model = train.new_model(config, info)
    with np.load(out / "probe_weights.npz") as f:
        model.set_weights([f[f"arr_{i}"] for i in range(len(f.files))])
    x, y = arrays.train_arrays(config.data)
    from wide_tf.schema import datasets

    xs = arrays.normalize(x, datasets.of(config.data))
    ref = per_example.gradient_stats(model, xs, np.asarray(y, np.int32), chunk_size=100)
    probe = found["probe"]
    assert probe["n"] == len(y)
    assert probe["s1"] == pytest.approx(ref["sum_sq_norms"], rel=1e-4)
    assert probe["q"] == pytest.approx(ref["sq_norm_of_sum"], rel=1e-4)
    assert keras.backend.backend() == "tensorflow"
