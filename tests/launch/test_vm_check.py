"""`--check`'s study stage (wide_tf/launch/vm/check.py) on the CPU with a tiny config: the worst
row of the memory model stepped, the peak said to be not reported on a CPU, 20 steps timed, a
checkpoint written to the workdir and read back; the TPU runtime as the environment and the
process show it."""

import pytest

from wide_tf.checks import loader
from wide_tf.launch.vm import check


def test_the_stage_steps_the_worst_row_and_round_trips_a_checkpoint(tmp_path):
    config = loader.load_config("configs/mlp.py:smoke")
    config.runtime.strategy = "cpu"
    lines = []
    check.run(config, str(tmp_path / "wd"), out=lines.append)
    text = "\n".join(lines)
    worst = check.worst_row(loader.load_config("configs/mlp.py:smoke"), 1, "float32", 0)
    assert f"worst row {worst.member} at batch {worst.batch}" in lines[1]
    assert worst.batch == max(loader.load_config("configs/mlp.py:smoke").sweep.batch_sizes)
    assert "memory model" in lines[1] and "measured peak not reported" in lines[1]
    assert "first call (trace, compile, 3 steps)" in lines[1]
    assert lines[2].startswith("check: 20 steps in ")
    assert "read back" in lines[3] and "the same weights" in lines[3]
    assert "TPU runtime: none (cpu)" in lines[0]
    assert not (tmp_path / "wd" / "check").exists(), text  # removed after the read-back


def test_the_worst_row_is_the_largest_member_at_the_largest_per_replica_batch():
    config = loader.load_config("configs/mlp.py:smoke")
    rows = check.hardware_fit.rows(config, 2, "float32", 0)
    worst = check.worst_row(config, 2, "float32", 0)
    assert worst.bytes == max(r.bytes for r in rows)
    assert worst.batch == max(r.batch for r in rows)
    assert worst.params == max(r.params for r in rows if r.batch == worst.batch)


def test_the_tpu_runtime_is_named_and_how_it_is_known(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 0:0 0 /venv/libtpu/libtpu.so\n")
    pjrt = {
        "PJRT_DEVICE": "TPU",
        "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/venv/libtpu/libtpu.so",
    }
    assert check.tpu_runtime(pjrt, str(maps)).startswith("PJRT (pluggable device")
    assert "mapped in this process" in check.tpu_runtime(pjrt, str(maps))
    maps.write_text("")
    assert "NOT mapped" in check.tpu_runtime(pjrt, str(maps))
    assert check.tpu_runtime({}, str(maps)).startswith("stream executor")


@pytest.mark.parametrize(
    "args,code,words",
    [
        ([], 2, "give a config and a workdir"),
        (["--config=configs/mlp.py:smoke"], 2, "give a config and a workdir"),
        (["--config=configs/mlp.py:smoke", "--workdir=/x", "--oops"], 2, "unknown: --oops"),
    ],
)
def test_usage_errors_are_one_line(args, code, words, capsys):
    assert check.main(args) == code
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
