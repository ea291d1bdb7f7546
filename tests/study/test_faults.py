"""The lesser faults, each as it was seen: the parent's stop on a worker that cannot act on
SIGTERM, what the parent says after a second SIGTERM, a result file that is a folder."""

import os
import signal
import subprocess
import sys
import threading
import time
import types

from wide_tf.study import workers


def test_the_stop_kills_a_worker_that_cannot_act_on_sigterm_and_says_so(monkeypatch, capfd):
    """The parent's stop waited forever, silently, on a worker that ignores SIGTERM."""
    deaf = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert deaf.stdout.readline().strip() == "ready"
    monkeypatch.setattr(workers, "STOP_GRACE_S", 0.5, raising=False)
    started = types.SimpleNamespace(procs=[deaf], signals=types.SimpleNamespace(__exit__=print))
    stop = threading.Thread(target=workers._stop_all, args=(started,), daemon=True)
    t0 = time.monotonic()
    stop.start()
    stop.join(timeout=15)
    if stop.is_alive():
        deaf.kill()
        raise AssertionError("the stop still waits on a worker that ignores SIGTERM")
    assert deaf.returncode == -signal.SIGKILL and time.monotonic() - t0 < 10
    err = capfd.readouterr().err
    assert f"worker 0 (pid {deaf.pid}) did not stop within 0.5s of SIGTERM: killed" in err, err


def test_after_a_second_sigterm_the_parent_does_not_claim_a_checkpoint(tmp_path):
    """Workers killed by the second SIGTERM (exit -15) did not checkpoint; the parent said they
    had."""
    procs = [types.SimpleNamespace(returncode=143), types.SimpleNamespace(returncode=-15)]
    started = types.SimpleNamespace(
        procs=procs,
        paths=[str(tmp_path / "w0.log"), str(tmp_path / "w1.log")],
        signals=types.SimpleNamespace(received=signal.SIGTERM),
        remote_logs=False,
        start=time.time(),
    )
    lines = []
    out = workers._outcome(started, None, str(tmp_path), {}, {1: -15}, lines.append)
    assert out.exit_code == 143 and not out.report_due
    assert "checkpointed" not in lines[-1], lines
    assert "workers 1 were killed before they saved" in lines[-1], lines
    procs[1].returncode = 143
    workers._outcome(started, None, str(tmp_path), {}, {}, lines.append)
    assert "the workers checkpointed" in lines[-1]
    assert os.listdir(tmp_path) == []


def test_a_results_entry_that_cannot_be_read_is_skipped_with_a_named_warning(tmp_path):
    """A results/<id>.json that is a folder (or a file without read permission: tests run as
    root, so its read is stubbed) stopped every worker with IsADirectoryError."""
    from wide_tf.store import workdir as wd

    (tmp_path / "results" / "folder.json").mkdir(parents=True)
    (tmp_path / "results" / "locked.json").write_text("{}")
    load = wd._load

    def refuse(path):
        if path.endswith("locked.json"):
            raise PermissionError(13, "Permission denied", path)
        return load(path)

    wd._load = refuse
    try:
        lines = wd.set_aside_partial(str(tmp_path))
    finally:
        wd._load = load
    assert len(lines) == 2, lines
    assert "folder.json cannot be read (a folder, not a regular file): skipped" in lines[0], lines
    assert "locked.json cannot be read (Permission denied): skipped" in lines[1], lines
    assert sorted(os.listdir(tmp_path / "results")) == ["folder.json", "locked.json"]
    assert wd.read_results_counted(str(tmp_path)) == ([], 2)  # counted as bad, never fatal


def test_a_partial_record_is_named_in_the_console_before_the_study_starts(tmp_path):
    """A partial record set aside was said only in a worker's log; the checks before a run (whose
    warnings main prints) name it, and an unreadable entry too."""
    from wide_tf.checks import preflight
    from wide_tf.checks.loader import load_config

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t1.json").write_text('{"trial_id": "t1"}')
    (tmp_path / "results" / "t2.json").mkdir()
    warnings = preflight.check_workdir(load_config("configs/mlp.py:smoke"), str(tmp_path))
    assert any("t1.json is not a whole result" in w and "moves it aside" in w for w in warnings)
    assert any("t2.json cannot be read (a folder, not a regular file)" in w for w in warnings), (
        warnings
    )


def test_eval_batch_is_part_of_the_study_but_not_of_trial_ids():
    """train.eval_batch was declared operational yet changes the last bits of the evaluations'
    losses: a workdir refuses another eval_batch; trial ids stay as before (existing studies)."""
    from wide_tf.checks.loader import load_config
    from wide_tf.schema import identity
    from wide_tf.study import trials as trials_lib

    a, b = load_config("configs/mlp.py:smoke"), load_config("configs/mlp.py:smoke")
    b.train.eval_batch = a.train.eval_batch * 2
    assert identity.differing_fields(a, b) == ["train.eval_batch"]
    ids = [t.trial_id for t in trials_lib.list_trials(a)]
    assert ids == [t.trial_id for t in trials_lib.list_trials(b)]
    b.train.steps_per_loop = 7  # still operational
    assert identity.differing_fields(a, b) == ["train.eval_batch"]


def test_an_empty_shard_says_that_it_runs_nothing(caplog):
    """Shard 0/3 of the smoke study holds none of its 4 groups (a hash split); it exited 0 without
    saying so."""
    import logging

    from wide_tf.checks.loader import load_config
    from wide_tf.study import progress
    from wide_tf.study import trials as trials_lib

    config = load_config("configs/mlp.py:smoke")
    trials = trials_lib.list_trials(config)
    assert trials_lib.in_shard(trials, "0/3") == [] and trials_lib.in_shard(trials, "1/3")
    with caplog.at_level(logging.INFO):
        progress.log_plan(config, trials, 1, 3)
        assert "runs nothing" not in caplog.text
        progress.log_plan(config, trials, 0, 3)
    assert "Shard 0/3 holds none of this study's 4 groups" in caplog.text
    assert "this command runs nothing" in caplog.text


def test_a_worker_without_output_on_a_full_disk_is_explained(tmp_path, monkeypatch):
    """A re-run on a still-full disk said "(no output)": the worker could not write even its
    log. The parent names the full disk (statvfs stubbed: the test disk is not full)."""
    log = tmp_path / "worker-0.x.log"
    log.write_text("")
    assert workers._no_output(str(log)) == "(no output)"
    full = types.SimpleNamespace(f_bavail=0, f_frsize=4096)
    monkeypatch.setattr(os, "statvfs", lambda path: full)
    line = workers._no_output(str(log))
    assert f"{tmp_path} has 0 bytes free" in line and "the disk is full" in line, line
