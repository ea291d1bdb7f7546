"""Inputs that were accepted or answered unclearly, each now one line and a non-zero exit before
TensorFlow starts (or handled as a user expects): gs:// workdirs without a bucket or with `..`,
configs found from any folder, a dotted model.arch located without running its code, a
get_config that exits, is interrupted or returns None, flags given twice, empty and repeated
batch lists."""

import os
import re
import subprocess
import sys

import pytest

from wide_tf.checks import loader, overrides, preflight
from wide_tf.schema import architectures
from wide_tf.schema.problems import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "wide_tf.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("workdir", "piece"),
    [
        ("gs://", "names no bucket"),
        ("gs:///x", "names no bucket"),
        ("gs://../x", "'..' is not a Cloud Storage bucket name"),
        ("gs://Bad_Bucket/x", "is not a Cloud Storage bucket name"),
        ("gs://my-bucket/../other", "has a '.' or '..' part"),
        ("gs://my-bucket/a/./b", "has a '.' or '..' part"),
        ("gs://192.168.5.4/x", "an IP address"),
        ("gs://google-runs/x", "no 'goog' prefix"),
    ],
)
def test_bad_gs_workdirs_are_one_line(workdir, piece):
    with pytest.raises(UsageError) as e:
        preflight.check_workdir_scheme(workdir)
    assert piece in str(e.value) and "\n" not in str(e.value)


def test_good_gs_workdirs_pass():
    for ok in ("gs://my-bucket", "gs://my-bucket/runs/a", "gs://a.b-c_d/x/", "gs://abc"):
        preflight.check_workdir_scheme(ok)


@pytest.mark.parametrize("flag", ["workdir", "shard", "workers", "config"])
def test_a_flag_given_twice_is_refused(flag):
    with pytest.raises(UsageError, match=f"--{flag} is given 2 times"):
        overrides.check_config_once(["main", f"--{flag}=1/2", f"--{flag}", "0/2"])


def test_an_empty_batch_list_on_the_command_line_is_refused():
    for empty in ("()", "( )", "[]", "(,)"):
        with pytest.raises(UsageError, match="is empty, which would make the study one run"):
            overrides.check_config_once(["main", f"--config.sweep.batch_sizes={empty}"])
    overrides.check_config_once(["main", "--config.sweep.batch_sizes=(32,)"])


def test_config_files_are_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, variant = loader.resolve_path("configs/mlp.py:smoke")
    assert path == os.path.join(ROOT, "configs", "mlp.py") and variant == "smoke"
    argv = loader.with_found_config(["m", "--config=configs/mlp.py:smoke", "--config.a=1"])
    assert argv == ["m", f"--config={path}:smoke", "--config.a=1"]
    (tmp_path / "configs").mkdir()  # the current folder first
    (tmp_path / "configs" / "mlp.py").write_text("def get_config(arg=None):\n    return {}\n")
    assert loader.resolve_path("configs/mlp.py")[0] == "configs/mlp.py"
    with pytest.raises(UsageError) as e:
        loader.resolve_path(os.path.join(ROOT, "configs"))
    assert "configs/mlp.py" in str(e.value) and "errors.py" not in str(e.value)


@pytest.mark.parametrize(
    ("body", "piece"),
    [
        ("import sys\n    sys.exit(0)", "raised SystemExit(0)"),
        ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
        ("return None", "returned NoneType, not a config"),
    ],
)
def test_a_get_config_that_exits_or_returns_nothing_is_one_line(tmp_path, body, piece):
    cfg = tmp_path / "bad.py"
    cfg.write_text(f"def get_config(arg=None):\n    {body}\n")
    with pytest.raises(UsageError, match=re.escape(piece)):
        loader.load_config(str(cfg))


def test_a_config_that_exits_on_import_is_one_line(tmp_path):
    cfg = tmp_path / "bad.py"
    cfg.write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(UsageError, match="raises SystemExit on import"):
        loader.load_config(str(cfg))


def test_a_dotted_arch_is_located_before_any_of_its_code_runs(tmp_path, monkeypatch):
    pkg = tmp_path / "evilpkg"
    pkg.mkdir()
    ran = tmp_path / "RAN"
    (pkg / "__init__.py").write_text(f"open({str(ran)!r}, 'w').write('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "no module 'evilpkg.model'" in architectures.module_problem("evilpkg.model")
    assert "not a dotted module name" in architectures.module_problem("os.system(1)")
    with pytest.raises(ValueError, match="no module 'evilpkg.model' is found"):
        architectures.ensure("evilpkg.model")
    assert not ran.exists()  # the package's __init__ never ran
    assert architectures.module_problem("wide_tf.schema.fields") == ""


def test_main_answers_each_in_one_line_from_another_folder(tmp_path):
    cfg = tmp_path / "exits.py"
    cfg.write_text("import sys\ndef get_config(arg=None):\n    sys.exit(0)\n")
    cases = [
        ([f"--config={cfg}", "--workdir=w"], "raised SystemExit(0)"),
        (["--config=configs/mlp.py:smoke", "--workdir=gs://", "--dry_run"], "names no bucket"),
        (["--config=configs/mlp.py:smoke", "--workdir=a", "--workdir=b"], "given 2 times"),
    ]
    for args, piece in cases:
        p = _main(*args, cwd=tmp_path)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and piece in lines[0], p.stderr
    p = _main("--config=configs/mlp.py:smoke", "--workdir=w", "--dry_run", cwd=tmp_path)
    assert p.returncode == 0 and "dry run:" in p.stdout + p.stderr, p.stderr
