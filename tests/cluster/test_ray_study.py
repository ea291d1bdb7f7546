"""The study on a Ray cluster (wide_tf/cluster/), on three simulated nodes: every record written
once; a node removed mid-study, its group finished elsewhere; the driver killed and started again,
it resumes from the records; a second driver on the same workdir refused in one line. Each test
runs the smoke study cut to one seed (4 groups of one trial) and takes about a minute on 2 cores,
most of it TensorFlow starting in three actors."""

import json
import os
import signal
import threading
import time

import pytest
from helpers import start_main

pytestmark = pytest.mark.ray

STUDY = [
    "--config=configs/mlp.py:smoke",
    "--config.sweep.seeds=(0,)",
    "--config.sweep.confirm_seeds=()",
    "--no_report",
]
TRIALS = 4  # 2 members x 2 batch sizes, one seed, no confirmation runs


class Driver:
    """`python -m wide_tf.main --cluster=...` in its own session, its stderr collected live."""

    def __init__(self, cluster, workdir):
        self.proc = start_main(*STUDY, f"--workdir={workdir}", f"--cluster={cluster.address}")
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text, timeout=240):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in ln for ln in self.lines):
                return
            if self.proc.poll() is not None:
                self._reader.join(5)
                if any(text in ln for ln in self.lines):
                    return
                raise AssertionError(f"driver exited {self.proc.returncode}:\n" + self.tail())
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} in {timeout}s:\n" + self.tail())

    def finish(self, timeout=300):
        self.proc.wait(timeout)
        self._reader.join(10)
        return self.proc.returncode

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def tail(self):
        return "\n".join(self.lines[-40:])

    def count(self, text):
        return sum(text in ln for ln in self.lines)


def _records(workdir):
    folder = workdir / "results"
    names = sorted(p.name for p in folder.iterdir())
    return names, [json.loads((folder / n).read_text()) for n in names if n.endswith(".json")]


def _starts(driver):
    """trial id -> how many times a host started it, from the hosts' lines."""
    out = {}
    for ln in driver.lines:
        if "] mlp-d" in ln and " params, batch " in ln:
            tid = ln.split("[mlp-", 1)[1].split("]", 1)[0]
            out[tid] = out.get(tid, 0) + 1
    return out


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("PPid:")).split()[1])


def _busy_worker_node(cluster, driver, timeout=240):
    """A node other than the head whose host has started a trial (a host's lines name its pid;
    its parent is its node's raylet)."""
    raylets = {n.all_processes["raylet"][0].process.pid: n for n in cluster.worker_nodes}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ln in list(driver.lines):
            if "=== trial" in ln and "Host pid=" in ln:
                pid = int(ln.split("Host pid=", 1)[1].split(")", 1)[0])
                try:
                    node = raylets.get(_parent(pid))
                except (OSError, StopIteration):
                    continue
                if node is not None:
                    return node
        time.sleep(0.1)
    raise AssertionError("no host of a worker node started a trial:\n" + driver.tail())


def test_every_record_written_once_and_a_lost_node_s_group_finishes_elsewhere(cluster, tmp_path):
    workdir = tmp_path / "study"
    d = Driver(cluster, workdir)
    victim = _busy_worker_node(cluster, d)
    cluster.remove_node(victim)
    assert d.finish() == 0, d.tail()
    names, records = _records(workdir)
    assert names == sorted(f"{r['trial_id']}.json" for r in records)  # no temporary left over
    assert len(records) == TRIALS and all(r["status"] for r in records)
    assert d.count("host lost while running group") == 1, d.tail()
    assert d.count(") done on ") == TRIALS  # each group done once (one trial each)
    cluster.add_node(num_cpus=1)  # the next test has three nodes again
    cluster.wait_for_nodes()


def test_a_second_driver_is_refused_and_a_killed_driver_resumes(cluster, tmp_path):
    workdir = tmp_path / "study"
    first = Driver(cluster, workdir)
    first.wait_for("Study on the Ray cluster")
    second = Driver(cluster, workdir)
    assert second.finish(120) == 1
    errors = [ln for ln in second.lines if ln.startswith("error:")]
    assert len(errors) == 1 and "another driver" in errors[0], second.tail()
    first.wait_for(") done on ")  # one group recorded, then the driver dies without a word
    first.kill()
    before, _ = _records(workdir)
    assert 1 <= len(before) < TRIALS
    again = Driver(cluster, workdir)
    assert again.finish() == 0, again.tail()
    names, records = _records(workdir)
    assert len(records) == TRIALS
    done_first = {n[: -len(".json")] for n in before}
    # The restarted driver ran only what the records did not hold.
    assert not done_first & {"mlp-" + t for t in _starts(again)}, again.tail()
    assert again.count(") done on ") == TRIALS - len(before)
