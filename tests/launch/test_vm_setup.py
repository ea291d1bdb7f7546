"""What the launcher runs on the VM after the install (wide_tf/launch/vm/setup.py) and --check's
TPU stage (wide_tf/launch/vm/tpu_check.py), on the CPU: the environment file of each runtime, the
runtime named from the environment, usage errors as one line."""

import shlex
import subprocess

from wide_tf.launch.software import RECIPE_XLA_FLAGS
from wide_tf.launch.vm import setup, tpu_check


def _sourced(lines, tmp_path):
    """The variables a shell has after sourcing the file."""
    (tmp_path / "env.sh").write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        ["sh", "-c", f". {tmp_path}/env.sh && env"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_pjrt_sets_the_recipes_variables_before_tensorflow(tmp_path):
    lines = setup.env_lines(
        "pjrt", "tensorflow-tpu==2.19.1 libtpu==0.0.10", "", False, lambda: "/v/libtpu.so"
    )
    env = _sourced(lines, tmp_path)
    assert env["PJRT_DEVICE"] == "TPU" and env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    assert env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/v/libtpu.so"
    assert env["TF_XLA_FLAGS"] == RECIPE_XLA_FLAGS and env["WIDE_TF_TPU_RUNTIME"] == "pjrt"
    assert env["WIDE_TF_TPU_STACK"] == "tensorflow-tpu==2.19.1 libtpu==0.0.10"
    assert "TPU_NAME" not in env and "WIDE_TF_JAX_DISTRIBUTED" not in env
    assert tpu_check.runtime("local", env).startswith("PJRT (pluggable device /v/libtpu.so")


def test_a_pod_names_its_tpu_and_loads_no_library(tmp_path):
    def never():
        raise AssertionError("libtpu is not looked up off PJRT")

    env = _sourced(setup.env_lines("grpc_tpu_server", "s", "wide-v4", False, never), tmp_path)
    assert env["TPU_NAME"] == "wide-v4" and env["TPU_LOAD_LIBRARY"] == "0"
    assert env["TF_XLA_FLAGS"] == RECIPE_XLA_FLAGS and "PJRT_DEVICE" not in env
    assert tpu_check.runtime("wide-v4", env).startswith("gRPC TPU servers")


def test_stream_executor_and_jax_set_no_runtime_variables(tmp_path):
    env = _sourced(setup.env_lines("stream_executor", "s", "", False, None), tmp_path)
    assert "PJRT_DEVICE" not in env and "TF_XLA_FLAGS" not in env
    assert tpu_check.runtime("local", env).startswith("stream executor")
    env = _sourced(
        setup.env_lines("jax", "jax[tpu]==0.10.2 libtpu==0.0.42.*", "", True, None), tmp_path
    )
    assert env["WIDE_TF_JAX_DISTRIBUTED"] == "1" and "TF_XLA_FLAGS" not in env
    assert (
        env["WIDE_TF_TPU_STACK"] == shlex.split(shlex.quote("jax[tpu]==0.10.2 libtpu==0.0.42.*"))[0]
    )


def test_the_libtpu_mapped_in_a_process_is_named(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 0:0 0 /venv/libtpu/libtpu.so\n")
    assert tpu_check.loaded_libtpu(str(maps)) == "/venv/libtpu/libtpu.so"
    assert tpu_check.loaded_libtpu(str(tmp_path / "none")) == "no libtpu"


def test_usage_errors_are_one_line(capsys):
    assert setup.main(["--runtime=cuda", "--env=x", "--stack=s"]) == 2
    assert tpu_check.main(["--tpu=local"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "--runtime=pjrt|" in err and "--replicas=N" in err
