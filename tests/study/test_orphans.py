"""Workers that die with their parent: a parent killed by SIGKILL at any moment leaves
no worker running; a parent that fails while starting its workers stops those it started; the
workers' log folder being a file is one line."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import run_main, start_main

from wide_tf.checks import validate
from wide_tf.checks.loader import load_config
from wide_tf.study import workers

SMOKE = ["--config=configs/mlp.py:smoke"]
# Trials long enough that a worker left behind would still be running when the test looks.
SLOW = [*SMOKE, "--config.train.target_value=0.97", "--config.train.max_epochs=12.0"]


def _workers_of(workdir) -> list[int]:
    """The pids of live processes started as workers on `workdir`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if "wide_tf.study.worker" in cmd and str(workdir) in cmd:
            out.append(int(pid))
    return out


def _wait(condition, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("after", ["parent_start", "worker_start", "worker_start_0"])
def test_a_parent_killed_early_leaves_no_worker(tmp_path, after):
    """SIGKILL to the parent 0.2 s after its own start, 0.2 s after its first worker started, and
    the moment it did (the worker still booting): every worker is gone within seconds."""
    proc = start_main(*SLOW, f"--workdir={tmp_path}", "--workers=2", "--no_report")
    try:
        if after == "parent_start":
            time.sleep(0.2)
        else:
            assert _wait(lambda: _workers_of(tmp_path), 60), "no worker started"
            time.sleep(0.2 if after == "worker_start" else 0.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait(lambda: not _workers_of(tmp_path), 10), _workers_of(tmp_path)
    finally:
        for pid in _workers_of(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_that_cannot_start_stops_those_already_started(tmp_path, monkeypatch):
    config = load_config("configs/mlp.py:smoke")
    monkeypatch.setattr(workers, "cpu_cores", lambda: [0, 1])
    real, first = subprocess.Popen, []

    def popen(cmd, **kwargs):
        if first:
            raise IsADirectoryError(21, "Is a directory")
        first.append(real(["sleep", "60"], **kwargs))
        return first[0]

    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    with pytest.raises(
        validate.RuntimeProblem,
        match=r"cannot start worker 1: .*worker-1\.[0-9a-f]{12}\.log: Is a directory",
    ):
        workers.start(config, str(tmp_path), 2)
    assert first[0].poll() is not None  # worker 0 was stopped, not left running


def test_a_logs_file_is_one_line_and_nothing_starts(tmp_path):
    (tmp_path / "logs").write_text("not a folder")
    proc = run_main(*SMOKE, f"--workdir={tmp_path}", "--workers=2", check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(lines) == 1 and "logs is a file, not a folder" in lines[0], lines
    assert not _workers_of(tmp_path)
