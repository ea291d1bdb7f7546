"""The final death signal: a worker whose parent is killed (SIGKILL) while the worker is blocked in
a read that never returns (a FIFO nobody writes: the stand-in for a hung NFS or bucket read)
exits within seconds, although its SIGTERM (PR_SET_PDEATHSIG) only sets a flag, as the preemption
handler's does. Without the watchdog the same worker is still alive (the control case)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl")

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from wide_tf.study import worker
    flags = []
    signal.signal(signal.SIGTERM, lambda *_: flags.append("stop"))  # a flag, as preemption sets
    fifo, parent, ready = sys.argv[1], sys.argv[2], sys.argv[3]
    worker.die_with_parent(parent or None, grace_s=1.0)
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    open(fifo).read()  # blocks for ever: nobody opens the FIFO for writing
    """
)
# The parent: starts the child with its own pid (or none: no watchdog), then sleeps until killed.
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    fifo, watch, ready, log = sys.argv[1:5]
    parent = str(os.getpid()) if watch == "1" else ""
    subprocess.Popen([sys.executable, "-c", sys.argv[5], fifo, parent, ready],
                     stderr=open(log, "w"))
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start(tmp_path, watch: bool):
    fifo, ready, log = tmp_path / "claim.json", tmp_path / "ready", tmp_path / "worker.log"
    os.mkfifo(fifo)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PARENT,
            str(fifo),
            "1" if watch else "0",
            str(ready),
            str(log),
            CHILD,
        ]
    )
    deadline = time.time() + 60
    while not (ready.exists() and ready.read_text()):
        assert time.time() < deadline, "the worker did not start"
        time.sleep(0.1)
    return parent, int(ready.read_text()), log


def test_an_orphan_blocked_in_a_read_exits_within_seconds(tmp_path):
    parent, child, log = _start(tmp_path, watch=True)
    time.sleep(0.5)  # blocked in open() of the FIFO by now
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    killed = time.time()
    while _alive(child) and time.time() - killed < 20:
        time.sleep(0.1)
    took = time.time() - killed
    assert not _alive(child), "the orphaned worker is still running 20 s after its parent died"
    assert took < 10  # grace 1 s + the watchdog's poll
    lines = log.read_text().strip().splitlines()
    assert lines and lines[-1].startswith("error: the study's process (pid ")


def test_without_the_watchdog_the_same_worker_outlives_its_parent(tmp_path):
    parent, child, _ = _start(tmp_path, watch=False)
    time.sleep(0.5)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(3)
    try:
        assert _alive(child)  # SIGTERM arrived, set a flag, and the read went on
    finally:
        os.kill(child, signal.SIGKILL)
