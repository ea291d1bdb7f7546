"""MultiWorkerMirroredStrategy through the package: two local worker processes (TF_CONFIG) must give
the same weights as one process on the same global batches, and a whole run must finish."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import keras
import multiworker_worker
import numpy as np
import pytest
from helpers import REPO, env

WORKER = REPO / "tests" / "multiworker_worker.py"
TIMEOUT_S = 150  # a healthy cluster finishes in ~15 s on 2 cores; a hung collective never does
# stderr text that means the cluster could not be formed for a reason outside the package.
ENVIRONMENTAL = (
    "Address already in use",
    "Failed to add port",
    "Could not start gRPC server",
    "failed to bind",
    "Cannot assign requested address",
)


@pytest.fixture(autouse=True)
def _keep_policy():
    # The in-process references go through setup_runtime, which sets the global dtype policy.
    policy = keras.mixed_precision.global_policy().name
    yield
    keras.mixed_precision.set_global_policy(policy)


def _free_ports(n=2):
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tf_config(ports, index):
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )


def _kill(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and anything it started
        except ProcessLookupError:
            pass
    proc.wait()


def _start(args, index, ports, tmp_path):
    e = env()
    e["TF_CONFIG"] = _tf_config(ports, index)
    with open(tmp_path / f"w{index}.out", "w") as out, open(tmp_path / f"w{index}.err", "w") as err:
        return subprocess.Popen(
            args, cwd=REPO, env=e, stdout=out, stderr=err, start_new_session=True
        )


def _run_cluster(make_args, tmp_path, attempts=2):
    """Runs `make_args(i)` as worker i of a two-worker cluster; returns both stdouts.

    A worker that fails leaves its peer waiting in a collective forever, so both are killed as
    soon as one fails or after TIMEOUT_S. Skips only when the cluster could not bind its ports
    (after one retry with fresh ports); any other failure is a test failure."""
    for attempt in range(attempts):
        ports = _free_ports()
        procs = [_start(make_args(i), i, ports, tmp_path) for i in range(2)]
        deadline = time.time() + TIMEOUT_S
        failed = None
        try:
            while any(p.poll() is None for p in procs):
                bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
                if bad:
                    failed = bad[0]
                    break
                if time.time() > deadline:
                    failed = "timeout"
                    break
                time.sleep(0.2)
            if failed is None:
                failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
        finally:
            for p in procs:
                _kill(p)
        errs = [(tmp_path / f"w{i}.err").read_text() for i in range(2)]
        if failed is None:
            return [(tmp_path / f"w{i}.out").read_text() for i in range(2)]
        env_lines = [
            line for e in errs for line in e.splitlines() if any(m in line for m in ENVIRONMENTAL)
        ]
        if env_lines:
            if attempt + 1 < attempts:
                continue
            pytest.skip(
                f"could not form a 2-worker cluster on 127.0.0.1 (ports {ports}): "
                f"{env_lines[0].strip()}"
            )
        if failed == "timeout":
            what = f"the workers did not finish in {TIMEOUT_S} s"
        else:
            what = f"worker {failed} exited {procs[failed].returncode}"
        raise AssertionError(
            f"{what}:\n--- worker 0 ---\n{errs[0][-3000:]}\n--- worker 1 ---\n{errs[1][-3000:]}"
        )


def test_two_workers_match_one_process(tmp_path):
    outs = _run_cluster(
        lambda i: [sys.executable, str(WORKER), "multi_worker", str(tmp_path / f"weights{i}.npz")],
        tmp_path,
    )
    # The reference: the same script, one process, one device, global batch 16.
    ref_info = multiworker_worker.main("cpu", str(tmp_path / "ref.npz"))
    assert ref_info["replicas"] == 1 and ref_info["strategy"] == "OneDeviceStrategy"
    for out in outs:
        info = json.loads(out.strip().splitlines()[-1])
        # Two workers of one CPU each: two replicas in sync, 8 examples per replica per step.
        assert info["replicas"] == 2, info
        assert info["strategy"] in ("MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy")
        assert info["iterations"] == info["steps"] == multiworker_worker.STEPS
        assert info["examples"] == ref_info["examples"] == 16 * multiworker_worker.STEPS
        np.testing.assert_allclose(info["loss_sum"], ref_info["loss_sum"], rtol=1e-5)
    ref = np.load(tmp_path / "ref.npz")
    for i in range(2):  # the chief's weights, and the other worker's copy
        got = np.load(tmp_path / f"weights{i}.npz")
        assert sorted(got.files) == sorted(ref.files)
        for k in ref.files:
            np.testing.assert_allclose(
                got[k], ref[k], rtol=1e-5, atol=1e-7, err_msg=f"worker {i}, {k}"
            )
    # The comparison can fail: the three momentum steps moved the weights well past the tolerance.
    from wide_tf.engine.models import build_model

    keras.utils.set_random_seed(multiworker_worker.SEED)
    init = build_model("mlp", 2, 16, 4, (6, 6, 1), norm="none").get_weights()
    assert any(not np.allclose(a, ref[k], rtol=1e-3, atol=1e-4) for a, k in zip(init, ref.files))


def test_main_runs_under_multi_worker(tmp_path):
    """The whole entry point, two workers sharing one workdir, against one process."""
    overrides = [
        "--config.data.name=digits_embedded",
        "--config.train.max_steps=6",
        "--config.train.steps_per_loop=3",
    ]
    _run_cluster(
        lambda i: [
            sys.executable,
            "-m",
            "wide_tf.main",
            "--config=configs/mlp.py:single",
            *overrides,
            f"--workdir={tmp_path / 'mw'}",
            "--config.runtime.strategy=multi_worker",
        ],
        tmp_path,
    )
    got = json.loads((tmp_path / "mw" / "result.json").read_text())

    from wide_tf.checks.loader import load_config
    from wide_tf.engine import train

    config = load_config("configs/mlp.py:single")
    config.data.name = "digits_embedded"
    config.train.max_steps = 6
    config.train.steps_per_loop = 3
    config.runtime.strategy = "cpu"
    ref = train.train_and_evaluate(config, str(tmp_path / "one"))

    assert "2 replica(s)" in got["runtime"] and "1 replica(s)" in ref["runtime"]
    assert got["steps"] == ref["steps"] == 6
    assert got["status"] == ref["status"]
    for k in ("train_accuracy", "test_accuracy", "train_loss", "test_loss"):
        np.testing.assert_allclose(got["final"][k], ref["final"][k], rtol=1e-4, err_msg=k)
