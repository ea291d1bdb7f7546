"""A damaged newest checkpoint no longer throws the run away: on both backends a run whose newest
checkpoint is cut short (or is a FIFO) resumes from the older whole one, names the one it skipped
and why, and ends with the uninterrupted run's result; with every checkpoint damaged it stops in
one line. Each case is two real runs of `python -m wide_tf.main` (about 30-60 s a backend on a
shared two-core machine)."""

import json
import os
import shutil

import pytest
from helpers import comparable, run_main

from wide_tf.engine import restore
from wide_tf.store import checkpoint_state

ARGS = [
    "--config=configs/mlp.py:single",
    "--config.data.name=digits_embedded",
    "--config.train.max_steps=60",
    "--config.train.global_batch=32",
    "--config.train.checkpoint_every_steps=20",
    "--config.train.steps_per_loop=20",
    "--config.train.eval_every_examples=640",
]


def _cut(path):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


@pytest.fixture(scope="module", params=["tensorflow", "jax"])
def finished(request, tmp_path_factory):
    """A finished single run (checkpoints at steps 40 and 60) and its result."""
    if request.param == "jax":
        pytest.importorskip("jax")  # the TF 2.19.1 CI job has no JAX
    work = tmp_path_factory.mktemp(request.param) / "run"
    args = [*ARGS, f"--config.runtime.backend={request.param}"]
    run_main(*args, f"--workdir={work}")
    assert restore.steps_on_disk(str(work / "checkpoints")) == [60, 40]
    return request.param, args, work, json.loads((work / "result.json").read_text())


def _copy(finished, tmp_path):
    backend, args, work, result = finished
    copy = tmp_path / "run"
    shutil.copytree(work, copy)
    os.remove(copy / "result.json")  # the run is resumed from its checkpoints
    ckpt = copy / "checkpoints"
    newest = sorted(ckpt.glob("ckpt-60.*"))
    return backend, args, copy, result, ckpt, newest


def test_a_cut_newest_checkpoint_is_skipped_and_named(finished, tmp_path):
    backend, args, copy, result, ckpt, newest = _copy(finished, tmp_path)
    data = [p for p in newest if p.suffix == ".npz" or ".data-" in p.name]
    _cut(data[0])
    proc = run_main(*args, f"--workdir={copy}")
    assert "ckpt-60" in proc.stderr and "skipped, it does not read whole" in proc.stderr
    assert "resumed from" in proc.stderr and "at step 40" in proc.stderr
    assert comparable(json.loads((copy / "result.json").read_text())) == comparable(result)


def test_a_fifo_as_the_newest_checkpoint_is_skipped(finished, tmp_path):
    backend, args, copy, result, ckpt, newest = _copy(finished, tmp_path)
    target = [p for p in newest if p.suffix in (".npz", ".index")][0]
    os.remove(target)
    os.mkfifo(target)
    proc = run_main(*args, f"--workdir={copy}", timeout=240)
    assert "a FIFO (named pipe), not a regular file" in proc.stderr
    assert comparable(json.loads((copy / "result.json").read_text())) == comparable(result)


def test_every_checkpoint_damaged_is_one_line(finished, tmp_path):
    backend, args, copy, result, ckpt, _ = _copy(finished, tmp_path)
    for p in ckpt.glob("ckpt-*"):
        if p.suffix in (".npz", ".index"):
            _cut(p)
    proc = run_main(*args, f"--workdir={copy}", check=False)
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (copy / "result.json").exists()


def test_a_save_cut_short_before_any_finished_starts_the_run_afresh(finished, tmp_path):
    """A kill during the first save leaves an empty ckpt-N.index that the CheckpointManager's state
    file does not name: no whole save was lost, so the run sets it aside and starts from step 0
    (it used to be refused in one line, a kill -9 at the wrong moment stopping every rerun)."""
    backend, args, copy, result, ckpt, _ = _copy(finished, tmp_path)
    if backend != "tensorflow":
        pytest.skip("the JAX backend writes each checkpoint whole, by rename")
    assert checkpoint_state.committed_steps(str(ckpt)) == {40, 60}
    for p in ckpt.glob("ckpt-60.*"):
        os.remove(p)
    os.remove(ckpt / "checkpoint")
    (ckpt / "ckpt-40.index").write_bytes(b"")
    proc = run_main(*args, f"--workdir={copy}")
    assert "left by a save that never finished" in proc.stderr
    assert "the run starts from the beginning" in proc.stderr
    assert "resumed from" not in proc.stderr
    assert list(ckpt.glob("ckpt-40.index.damaged-*"))  # kept, not read
    assert comparable(json.loads((copy / "result.json").read_text())) == comparable(result)
