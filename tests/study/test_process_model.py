"""One process model: study/processes.py opens the workdir's study once, before
TensorFlow and before any worker; a worker is `python -m wide_tf.study.worker`, reads the config
its parent checked (frozen in the logs folder) and checks nothing again; one "die with the
parent" (study/worker.py); the one map from a config to a worker's environment (KERAS_BACKEND).
That each check runs once per process in a real two-worker study is counted in
tests/study/test_workers.py (tests/call_spy)."""

import json
import pathlib
import subprocess

import pytest

from wide_tf.checks import loader, validate
from wide_tf.study import processes, worker, workers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _read_frozen(path):
    """What a worker reads: the frozen file, thawed."""
    return worker.thaw(json.loads(pathlib.Path(path).read_text()))


def test_the_parent_refuses_another_study_before_starting_any_worker(tmp_path, monkeypatch):
    config = loader.load_config("configs/mlp.py:smoke")
    (tmp_path / "config.json").write_text(json.dumps({"model": {"arch": "wrn"}}))

    def started(*args, **kwargs):
        raise AssertionError("a worker (or TensorFlow) was started")

    monkeypatch.setattr(workers, "start", started)
    monkeypatch.setattr(processes.tf_start, "import_tensorflow", started)
    for n in ("2", "1"):
        with pytest.raises(validate.UsageError, match="different study"):
            processes.run(config, str(tmp_path), n_workers=n)
    assert not (tmp_path / "logs").exists()


def test_a_frozen_config_reads_back_as_the_checked_one(tmp_path):
    """Every config variant in configs/ through the file a worker reads: the same ConfigDict,
    types included (tuples stay tuples), so the workers' trial ids are their parent's."""
    n = 0
    for path in sorted((ROOT / "configs").glob("*.py")):
        text = path.read_text()
        if "def get_config" not in text:
            continue
        module = loader.load_module(str(path))
        for variant in loader.variants(module) or [None]:
            spec = f"{path.relative_to(ROOT)}" + (f":{variant}" if variant else "")
            config = loader.load_config(spec)
            back = _read_frozen(workers.freeze_config(config, str(tmp_path), str(n)))
            assert back == config and back.to_dict() == config.to_dict(), spec
            n += 1
    assert n > 10


def test_the_workers_get_the_configs_backend_before_keras(tmp_path, monkeypatch):
    config = loader.load_config("configs/mlp.py:smoke")
    assert worker.environment(config) == {"KERAS_BACKEND": "tensorflow"}  # no field: the default
    frozen = json.loads(json.dumps(config.to_dict()))
    frozen["runtime"]["backend"] = "jax"
    assert worker.environment(frozen) == {"KERAS_BACKEND": "jax"}
    monkeypatch.setattr(workers, "cpu_cores", lambda: [0, 1])
    seen, real = [], subprocess.Popen

    def popen(cmd, **kwargs):
        seen.append((cmd, kwargs["env"]))
        return real(["true"])

    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    monkeypatch.setenv("KERAS_BACKEND", "something else")
    started = workers.start(config, str(tmp_path), 2, shard="0/2")
    workers._stop_all(started)
    assert len(seen) == 2
    for cmd, env in seen:
        assert cmd[1:3] == ["-m", "wide_tf.study.worker"] and "--shard=0/2" in cmd
        assert env["KERAS_BACKEND"] == "tensorflow"
        frozen_path = next(a.split("=", 1)[1] for a in cmd if a.startswith("--config_json="))
        assert _read_frozen(frozen_path) == config
    # The worker module sets it from the frozen config before it imports anything of Keras.
    source = (ROOT / "wide_tf" / "study" / "worker.py").read_text()
    # (Only the workdir store, which loads neither Keras nor TensorFlow, comes before it.)
    main = source[source.index("def main(") :].replace("from wide_tf.store import workdir", "")
    assert main.index("backend.select(frozen)") < main.index("import")


def test_one_die_with_the_parent():
    hits = [
        p.relative_to(ROOT)
        for p in (ROOT / "wide_tf").rglob("*.py")
        if "PR_SET_PDEATHSIG" in p.read_text() or "prctl(" in p.read_text()
    ]
    assert hits == [pathlib.Path("wide_tf/study/worker.py")]


def test_a_worker_started_by_hand_is_one_line():
    proc = subprocess.run(
        [*worker.command("x.json", "wd", None, False)[:3], "--workers=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
