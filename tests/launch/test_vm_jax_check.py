"""The device stage of the launcher's `--check --backend=jax` (wide_tf/launch/vm/jax_check.py) on
CPU: JAX's devices through engine/jax/run.setup_runtime, here as two JAX processes of two virtual
CPU devices each under WIDE_TF_JAX_DISTRIBUTED=1 (jax.distributed.initialize(), the multi-host
path of a TPU slice): each sees all four devices, the psum over them meets across the processes,
and no TensorFlow is loaded; a wrong count is exit 3; usage errors are one line."""

import os
import socket
import subprocess
import sys

from helpers import REPO

from wide_tf.launch.vm import jax_check


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_jax_processes_see_every_device_and_meet_in_one_psum():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "WIDE_TF_JAX"))}
    env.update(
        PYTHONPATH=str(REPO),
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        WIDE_TF_JAX_DISTRIBUTED="1",
        JAX_COORDINATOR_ADDRESS=f"localhost:{_free_port()}",
        JAX_NUM_PROCESSES="2",
        JAX_PLATFORMS="cpu",
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wide_tf.launch.vm.jax_check",
                f"--replicas={n}",
                "--strategy=cpu",
            ],
            cwd=REPO,
            env=dict(env, JAX_PROCESS_ID=str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, n in ((0, 4), (1, 3))  # process 1 expects a wrong count: its exit is 3
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for i, out in enumerate(outs):
        assert f"process {i} of 2 (jax.distributed)" in out, out
        assert "4 device(s) (2 on this host), kind cpu" in out, out
        assert "a psum over every device gave 4 (expected 4); TensorFlow not loaded" in out, out
    assert "JAX sees 4 replica(s) (expected 4)" in outs[0]
    assert "JAX sees 4 replica(s) (expected 3)" in outs[1]
    assert [p.returncode for p in procs] == [0, 3]


def test_usage_errors_are_one_line(capsys):
    assert jax_check.main([]) == 2
    assert jax_check.main(["--replicas=four"]) == 2
    assert jax_check.main(["--replicas=4", "--strategy=gpu"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
