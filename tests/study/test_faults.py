"""Issue 38's lesser faults, each as it was seen: the parent's stop on a worker that cannot act on
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
