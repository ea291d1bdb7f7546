"""--dry_run --accelerator: the memory model where runs start (checks/dry_run.py), per config and
replica count, before TensorFlow starts."""

import pytest
from helpers import run_main

from wide_tf.checks import dry_run, loader
from wide_tf.checks.hardware_fit import EXIT_DOES_NOT_FIT
from wide_tf.schema import problems


@pytest.mark.parametrize(
    "name, key",
    [
        ("v4-8", "v4"),
        ("v5litepod-16", "v5e"),
        ("v5litepod", "v5e"),
        ("a100-40gb", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("Tesla V100-SXM2-16GB", "v100-16gb"),
    ],
)
def test_accelerator_names(name, key):
    assert dry_run.accelerator_key(name) == key


def test_unknown_accelerator_is_a_usage_error():
    with pytest.raises(problems.UsageError, match="--accelerator=v9-8: unknown"):
        dry_run.accelerator_key("v9-8")


def test_run_prints_the_checked_line_and_the_memory_line():
    config = loader.load_config("configs/wrn.py")
    lines = []
    assert dry_run.run(config, 4, "v4-8", lines.append) == 0
    assert lines[0].startswith("dry run: the config fits 4 replica(s)")
    assert lines[1].startswith("memory: the config fits 4 x v4 ")
    lines = []
    assert dry_run.run(config, 1, "a100-40gb", lines.append) == EXIT_DOES_NOT_FIT
    assert "does not fit 1 x a100-40gb" in lines[1] and "max_device_batch=" in lines[1]
    lines = []
    assert dry_run.run(config, 4, None, lines.append) == 0 and len(lines) == 1


def test_main_dry_run_with_an_accelerator():
    p = run_main(
        "--config=configs/wrn.py", "--dry_run", "--replicas=8", "--accelerator=v5litepod-8"
    )
    assert "memory: the config fits 8 x v5e" in p.stdout
    p = run_main("--config=configs/wrn.py", "--dry_run", "--accelerator=t4", check=False)
    assert p.returncode == EXIT_DOES_NOT_FIT and "does not fit 1 x t4" in p.stdout
    p = run_main("--config=configs/wrn.py", "--accelerator=t4", "--workdir=/tmp/x", check=False)
    assert p.returncode == 2 and "--accelerator is for --dry_run" in p.stderr


def test_several_jax_processes_run_one_run_never_a_study():
    """WIDE_TF_JAX_DISTRIBUTED=1 (launch_tpu.sh --backend=jax on a multi-host slice): every host
    runs the same program, so a sweep, whose hosts would each claim their own group, is refused;
    one run passes; the flag without the JAX backend is refused too."""
    from wide_tf.checks import preflight

    on = {"WIDE_TF_JAX_DISTRIBUTED": "1"}
    study = loader.load_config("configs/mlp.py:check")
    study.runtime.backend = "jax"
    with pytest.raises(problems.UsageError, match="a study .a sweep. cannot run as one JAX"):
        preflight.check_processes(study, on)
    preflight.check_processes(study, {})  # one process: fine
    one = loader.load_config("configs/mlp.py:single")
    one.runtime.backend = "jax"
    preflight.check_processes(one, on)
    one.runtime.backend = "tensorflow"
    with pytest.raises(problems.UsageError, match="is for runtime.backend=jax"):
        preflight.check_processes(one, on)
