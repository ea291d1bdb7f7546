"""What a new user meets first: --help lists the configs and each variant in one line, with no
internal file names; --print_config shows the resolved config; a variant takes k=v arguments;
--list_trials needs no data set. All of it before TensorFlow starts (a fake that fails on
import is first on the path)."""

import pytest
from test_errors import _env, _main

from wide_tf.checks import loader


def test_help_lists_every_config_and_variant_for_a_user(tmp_path):
    p = _main(["--help"], _env(True, tmp_path))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for path in ("configs/mlp.py", "configs/wrn.py", "configs/theory.py"):
        assert f"  {path}\n" in out
    for name, _ in loader.variant_lines(loader.load_module("configs/mlp.py")):
        assert f"    {name}" in out
    assert "seeds" in out and "--print_config" in out and "--list_trials" in out
    # for users: no module file names of the package, no absl module header
    assert "wide_tf/" not in out and "main.py" not in out and "validate" not in out
    assert all(len(line) <= 100 for line in out.splitlines())


def test_print_config_shows_the_variant_and_its_arguments(tmp_path):
    p = _main(
        [
            "--config=configs/mlp.py:smoke:seeds=3,epochs=5",
            "--config.train.target_value=0.6",
            "--print_config",
        ],
        _env(True, tmp_path),
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "  seeds: [0, 1, 2]" in lines and "  max_epochs: 5.0" in lines
    assert "  target_value: 0.6" in lines and "python/tuple" not in p.stdout


def test_variant_arguments():
    c = loader.load_config("configs/mlp.py:local:seeds=3,epochs=20")
    base = loader.load_config("configs/mlp.py:local")
    assert c.sweep.seeds == (0, 1, 2) and c.train.max_epochs == 20.0
    assert len(c.sweep.confirm_seeds) == len(base.sweep.confirm_seeds)
    assert min(c.sweep.confirm_seeds) == 3  # after the tuning seeds: none run twice
    c = loader.load_config("configs/mlp.py:smoke:batches=32/64:train.target_value=0.7")
    assert c.sweep.batch_sizes == (32, 64) and c.train.target_value == 0.7
    assert loader.load_config("configs/mlp.py:seeds=1,confirm=0").sweep.confirm_seeds == ()
    for spec, words in (
        ("configs/mlp.py:local:sedes=3", "did you mean 'seeds'"),
        ("configs/mlp.py:single:seeds=3", "runs no sweep"),
        ("configs/mlp.py:local:seeds=0", "1 or more"),
        ("configs/mlp.py:local:seeds", "not key=value"),
        ("configs/mlp.py:local:train.no_field=1", "no field train.no_field"),
    ):
        with pytest.raises(loader.UsageError, match=words):
            loader.load_config(spec)


def test_list_trials_needs_no_data_set(tmp_path):
    # configs/wrn.py's default study reads CIFAR-10 (TFDS), not prepared here
    p = _main(["--config=configs/wrn.py", "--list_trials"], _env(True, tmp_path))
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) > 10 and "wrn-" in p.stdout
