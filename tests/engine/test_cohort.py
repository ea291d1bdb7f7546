"""Cohorts on JAX (engine/cohort.py, engine/jax/cohort.py): a run trained in a cohort follows the
same run trained alone (same seed, data order and learning rate) to its record's targets, status
and steps, and to its final weights within float tolerance: MLPs at K = 1 (the lockstep around a
lone run's own call), 3 and 8, WRNs with ghost batch norm, LARS and micro-batches on two replicas
at K = 3, runs that end at different steps (a target met early, the budget, a divergence), the
device loop, and a cohort stopped by a preemption and resumed. The checks run in two child
processes with KERAS_BACKEND=jax (tests/cohort_checks.py), side by side. The lockstep's own rules
(the step mask's requests, the time shares, an exception in one run) are checked in-process with a
pure-Python backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from wide_tf.engine import cohort, timing
from wide_tf.engine.interface import HostCall, RunFacts
from wide_tf.engine.state import RunState

# Float tolerance of the final weights, each tensor's largest difference on its own scale: vmap
# batches the matrix products, so XLA may pick other kernels and round the last bits otherwise
# (measured: at most 7e-7 for these runs; K = 3 MLPs bit for bit).
RTOL = 1e-5


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("cohort")
    env = dict(os.environ, KERAS_BACKEND="jax", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    parts = {
        "mlp": ["mlp_sizes", "device_loop", "endings", "preempted"],
        "wrn": ["wrn_lars_micro"],
    }
    # The WRNs on two virtual devices: vmap over the step's shard_map on a mesh of two replicas.
    devices = {"mlp": {}, "wrn": {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}}
    procs = {}
    for name, checks in parts.items():
        (out / name).mkdir()
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "tests.cohort_checks", str(out / name), *checks],
            cwd=REPO,
            env=dict(env, **devices[name]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    found = {}
    for proc in procs.values():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-4000:]
        line = next(x for x in stdout.splitlines() if x.startswith("JSON "))
        found.update(json.loads(line[5:]))
    return found


def _follows(got: dict) -> None:
    assert all(got["fields"]), got  # status, steps, steps to every target, interpolated
    assert max(got["weights_rel"]) < RTOL, got["weights_rel"]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_an_mlp_in_a_cohort_follows_the_run_alone(checks, k):
    got = checks[f"mlp_k{k}"]
    assert len(got["fields"]) == k
    _follows(got)


def test_wrns_with_ghost_batch_norm_lars_micro_batches_and_two_replicas_follow_the_runs_alone(
    checks,
):
    got = checks["wrn"]
    assert got["replicas"] == 2 and got["micro_batches"] == 2
    _follows(got)


def test_runs_that_end_at_different_steps_each_get_their_own_record(checks):
    got = checks["endings"]
    assert got["statuses"] == ["reached", "not_reached", "not_reached", "diverged"]
    assert got["steps"][0] < got["steps"][1] and got["steps"][3] < got["steps"][0]
    _follows(got)


def test_the_device_loop_follows_the_runs_alone(checks):
    _follows(checks["device_loop"])


def test_a_preempted_cohort_resumes_to_the_uninterrupted_records(checks):
    assert checks["preempted_at"] is not None
    step = checks["preempted_at"]
    for names in checks["checkpoints_after_cut"]:  # every run checkpointed at the stop
        assert f"ckpt-{step}.npz" in names
    got = checks["resume"]
    assert all(got["same_records"]), got
    assert got["steps"][2] < got["steps"][0]  # one run left early: the cohort compacted
    _follows(got)


# ---- the lockstep with a pure-Python backend -------------------------------------------------


class _Trainer:
    """A run's trainer whose 'device' is a counter: the lockstep's requests are checked."""

    def __init__(self, name, steps):
        self.name, self.total, self.state = name, steps, RunState()

    def restore(self, state):
        self.state = state

    def host_call(self, scalars, dt):
        self.state.step += int(scalars["steps"])
        self.state.train_time_s += dt
        return HostCall({"batch_loss": 0.0}, False)

    def finish(self):
        pass

    def describe(self):
        return RunFacts("m", 1, 0.1, None, "cpu", "float32", {})


class _Controller:
    """A Controller's use of its trainer and checkpoints: steps of at most 3 up to its total;
    raises at `fail_at` steps."""

    def __init__(self, trainer, fail_at=None):
        self.trainer, self.fail_at, self.inner = trainer, fail_at, trainer
        self.checkpoints = type("Checkpoints", (), {"clock": None, "wall": 0.0, "last_time": 0.0})()
        self.asked: list = []

    def run(self):
        st = RunState()
        self.trainer.restore(st)
        while st.step < self.inner.total:
            if st.step == self.fail_at:
                raise RuntimeError(f"{self.inner.name} failed")
            n = min(3, self.inner.total - st.step)
            self.asked.append(n)
            self.trainer.train(n)
        return {"name": self.inner.name, "steps": st.step, "time_s": dict(st.time_s)}


def test_the_lockstep_asks_each_run_its_own_steps_and_shares_the_seconds_by_them():
    trainers = [_Trainer("a", 7), _Trainer("b", 3), _Trainer("c", 5)]
    controllers = [_Controller(t) for t in trainers]
    calls = []

    def call(requests):
        calls.append(list(requests))
        if len(calls) == 1:  # the first call compiles
            timing.note_trace()
        return [{"steps": float(n), "diverged": False} for _, n in requests]

    results = cohort.run(controllers, trainers, call)
    assert [r["steps"] for r in results] == [7, 3, 5]
    # Every live run in every call; a run that ended leaves; the last steps masked per run.
    assert calls == [[(0, 3), (1, 3), (2, 3)], [(0, 3), (2, 2)], [(0, 1)]]
    first = [r["time_s"]["compile"] for r in results]
    assert first[0] == pytest.approx(first[1]) == pytest.approx(first[2])  # equal steps asked
    a, c = (results[i]["time_s"]["train"] for i in (0, 2))
    assert a > c > 0  # a's share of the second call 3/5, c's 2/5, and a alone in the third


def test_an_exception_in_one_run_ends_the_cohort_after_its_round_and_is_raised():
    trainers = [_Trainer("a", 9), _Trainer("b", 9), _Trainer("c", 9)]
    controllers = [_Controller(trainers[0]), _Controller(trainers[1], fail_at=3)]
    controllers.append(_Controller(trainers[2]))
    calls = []

    def call(requests):
        calls.append(list(requests))
        return [{"steps": float(n), "diverged": False} for _, n in requests]

    with pytest.raises(RuntimeError, match="b failed"):
        cohort.run(controllers, trainers, call)
    assert len(calls) == 1  # the round with the failure made no call
    assert [t.state.step for t in trainers] == [3, 3, 3]  # c had its turn; a and c ended waiting
