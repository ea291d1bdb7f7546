"""Every file read from a workdir is a regular file of sane size, and its JSON is not nested
deeper than a config or record ever is: a FIFO as config.json, as a claim or as a result, a
folder, a device, a huge file and a 200k-deep config.json are each answered (one line, or skipped
as unreadable), never a hang or a traceback. Each read runs under an alarm, so a regression hangs
for seconds, not forever."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from wide_tf.checks import preflight
from wide_tf.schema.problems import RuntimeProblem
from wide_tf.store import claims
from wide_tf.store import workdir as wd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def _no_hang(seconds=10):
    def _hung(*_):
        raise AssertionError(f"the read blocked for over {seconds} s")

    old = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fifo(path) -> str:
    os.mkfifo(path)
    return str(path)


def test_special_files_and_huge_ones_are_refused_without_blocking(tmp_path, monkeypatch):
    fifo = _fifo(tmp_path / "config.json")
    (tmp_path / "folder.json").mkdir()
    with _no_hang():
        for path, what in (
            (fifo, "a FIFO (named pipe)"),
            (str(tmp_path / "folder.json"), "a folder"),
            ("/dev/null", "a character device"),
        ):
            with pytest.raises(wd.NotARegularFile) as e:
                wd.read_json(path)
            assert (
                str(e.value)
                == f"{path} is {what}, not a regular file; nothing reads it: move it aside"
            )
            assert isinstance(e.value, OSError)  # every reader that skips unreadable files skips it
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 2000}))
    monkeypatch.setattr(wd, "MAX_JSON_BYTES", 1000)
    with pytest.raises(wd.NotARegularFile, match="over the"):
        wd.read_checked(str(big), wd.MAX_JSON_BYTES)
    assert wd.read_checked(str(big), 10_000) == big.read_bytes()


def test_deep_json_is_refused_and_brackets_in_strings_do_not_count(tmp_path):
    assert wd.json_depth('{"a": [1, {"b": "[[[\\"]]{"}]}') == 3
    assert wd.loads_checked('{"a": "[[[[[[[[[[[["}') == {"a": "[[[[[[[[[[[["}
    deep = tmp_path / "config.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(json.JSONDecodeError, match="nested 200000 levels deep"):
        wd.read_json(str(deep))
    ok = "[" * wd.MAX_JSON_DEPTH + "]" * wd.MAX_JSON_DEPTH
    assert wd.loads_checked(ok) is not None


def test_a_fifo_config_json_is_one_line_before_the_study(tmp_path):
    _fifo(tmp_path / wd.CONFIG)
    with _no_hang(), pytest.raises(RuntimeProblem) as e:
        preflight.check_same_study(None, str(tmp_path))
    assert "is a FIFO (named pipe)" in str(e.value) and "\n" not in str(e.value)


def test_a_fifo_result_or_claim_is_skipped_as_unreadable(tmp_path):
    results = tmp_path / wd.RESULTS_DIR
    results.mkdir()
    _fifo(results / "t1.json")
    (results / "t2.json").write_text("[" * 5000 + "]" * 5000)
    with _no_hang():
        assert wd.read_results_counted(str(tmp_path)) == ([], 2)
        warnings = preflight._result_files_warnings(str(tmp_path))
    assert any("cannot be read (a FIFO" in w for w in warnings)
    folder = tmp_path / claims.CLAIMS_DIR
    folder.mkdir()
    _fifo(folder / "g.1.json")
    store = claims._LocalStore(claims.claims_folder(str(tmp_path)))
    with _no_hang(), pytest.raises(wd.NotARegularFile):
        store.read("g.1.json")  # Claims turns this OSError into one broken claim
    assert claims._parse(b"[" * 5000 + b"]" * 5000)[1].startswith("is not JSON (nested 5000")


def test_main_answers_a_fifo_config_json_in_one_line(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    _fifo(work / wd.CONFIG)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "wide_tf.main",
            "--config=configs/mlp.py:smoke",
            f"--workdir={work}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a FIFO (named pipe), not a regular file" in lines[0], p.stderr
