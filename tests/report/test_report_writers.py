"""One report writer at a time, and bad input that never touches a finished report:
two real `python -m wide_tf.report` processes at once leave one whole report; the report lock's
stale and live holders; a failed writer leaves the previous report; every bad flag of the report's
command line is one line, exit 2, with the workdir's bytes unchanged."""

import glob
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from test_report import MEMBERS, make_records, make_workdir

from wide_tf import report
from wide_tf.report import publish, writer
from wide_tf.report.__main__ import main as report_main

ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
REPORT_FILES = {
    "report.md",
    "all_trials.csv",
    "best_per_batch.csv",
    "members.csv",
    "steps_vs_batch.png",
    "epochs_vs_batch.png",
    "batch_vs_width.png",
}


def _small_records():
    return make_records(MEMBERS[:3], seeds=(0,), batches=(32, 64, 128))


def _snapshot(root) -> dict:
    """Every file under `root` with its bytes and modification time."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _hold_lock(wd, **body):
    body = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), **body}
    with open(os.path.join(wd, publish.LOCK), "w") as f:
        json.dump(dict(body, token="held-by-the-test"), f)


def _assert_one_whole_report(wd, records):
    out = os.path.join(wd, "report")
    assert REPORT_FILES <= set(os.listdir(out))
    assert open(os.path.join(out, "report.md")).read().startswith("# ")
    hdir = os.path.join(out, "tb")
    runs = sorted({f"{r['member']}/b{r['batch_size']}" for r in records})
    # each HParams session once: one event file per (member, batch), one experiment config
    for run in runs:
        assert len(glob.glob(os.path.join(hdir, run, "events.out.tfevents.*"))) == 1, run
    assert len(glob.glob(os.path.join(hdir, "events.out.tfevents.*"))) == 1
    # nothing left behind: no writer's folder, no previous report, no lock
    left = [n for n in os.listdir(wd) if n.startswith((".report.", publish.LOCK))]
    assert left == [], left


def test_two_writers_at_once_leave_one_whole_report(tmp_path):
    """Real processes, bounded time. The test holds the lock while both write, so that both have
    their whole report ready before either may swap: then it lets them race for the swap."""
    pytest.importorskip("tensorboard")
    records = _small_records()
    wd = make_workdir(tmp_path / "study", records)
    _hold_lock(wd)
    cmd = [sys.executable, "-m", "wide_tf.report", f"--workdir={wd}"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 400
        ready = []
        while len(ready) < 2 and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            tmp = glob.glob(os.path.join(wd, publish.TMP_PREFIX + "*"))
            ready = [d for d in tmp if os.path.exists(os.path.join(d, "report.md"))]
            time.sleep(0.2)
        assert len(ready) == 2, "the two writers did not both finish writing in time"
        assert not os.path.exists(os.path.join(wd, "report"))  # neither swapped under the lock
        os.remove(os.path.join(wd, publish.LOCK))
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == [os.path.join(wd, "report", "report.md")] * 2
    _assert_one_whole_report(wd, records)


def test_a_rerun_replaces_the_report_whole_and_keeps_the_theory_files(tmp_path):
    pytest.importorskip("tensorboard")
    records = _small_records()
    wd = make_workdir(tmp_path, records)
    report.write_report(wd)
    stale = os.path.join(wd, "report", "a_plot_of_an_older_report.png")
    theory = os.path.join(wd, "report", "theory.md")
    for path in (stale, theory):
        with open(path, "w") as f:
            f.write("x")
    report.write_report(wd)
    _assert_one_whole_report(wd, records)
    assert not os.path.exists(stale) and open(theory).read() == "x"


def test_a_failed_writer_leaves_the_previous_report(tmp_path, monkeypatch):
    wd = make_workdir(tmp_path, _small_records())
    report.write_report(wd)
    before = _snapshot(os.path.join(wd, "report"))

    def half_then_fail(outdir, *args):
        with open(os.path.join(outdir, "report.md"), "w") as f:
            f.write("half")
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_write_into", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        report.write_report(wd)
    assert _snapshot(os.path.join(wd, "report")) == before
    assert not glob.glob(os.path.join(wd, publish.TMP_PREFIX + "*"))


def test_the_lock_is_taken_over_from_a_dead_or_skewed_holder(tmp_path):
    wd = str(tmp_path)
    lock = os.path.join(wd, publish.LOCK)
    for held in ({"pid": _dead_pid()}, {"host": "elsewhere", "time": time.time() + 3600}):
        _hold_lock(wd, **held)
        with publish.report_lock(wd, wait_s=5):
            assert json.load(open(lock))["pid"] == os.getpid()
        assert not os.path.exists(lock)
    # a dead writer's own folder on this host is removed by the next swap; a live one's is kept
    dead = os.path.join(wd, f"{publish.TMP_PREFIX}{socket.gethostname()}-{_dead_pid()}-x")
    live = publish.new_tmpdir(wd)
    os.makedirs(dead)
    publish.publish(wd, publish.new_tmpdir(wd))
    assert not os.path.exists(dead) and os.path.isdir(live)


def test_a_live_holder_is_waited_for_then_named(tmp_path):
    wd = str(tmp_path)
    _hold_lock(wd, host="another-host")
    t0 = time.monotonic()
    with pytest.raises(report.ReportError) as e:
        with publish.report_lock(wd, wait_s=0.6):
            pass
    assert 0.6 <= time.monotonic() - t0 < 30
    assert "pid" in str(e.value) and "another-host" in str(e.value)
    assert f"delete {os.path.join(wd, publish.LOCK)}" in str(e.value)
    assert json.load(open(os.path.join(wd, publish.LOCK)))["token"] == "held-by-the-test"


# (flags after --workdir=WD, a piece of the one line)
BAD_FLAGS = [
    (["--eps=nan"], "--eps: 'nan' is out of range: use a finite number >= 0.001 and <= 1000"),
    (["--eps=0"], "--eps: '0' is out of range: use a finite number >= 0.001"),
    # These wrote a report of censored bounds over the study's own.
    (["--eps=1e26"], "--eps: '1e26' is out of range: use a finite number >= 0.001 and <= 1000"),
    (["--eps=1e-320"], "--eps: '1e-320' is out of range"),
    (["--eps=-1"], "--eps: '-1' is out of range"),
    (["--eps=inf"], "--eps: 'inf' is out of range"),
    (["--eps=abc"], "--eps: expected a number, got 'abc'"),
    (["--eps="], "--eps: expected a number, got ''"),
    (["--eps"], "--eps: missing its value; give it as --eps=VALUE"),
    (["stray"], "unexpected argument 'stray'; this command takes flags only"),
    (["--bogus=1"], "unknown flag --bogus; the flags are --workdir, --eps"),
    (["--work=x"], "unknown flag --work; did you mean --workdir?"),
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    wd = make_workdir(tmp_path_factory.mktemp("finished"), _small_records())
    report.write_report(wd)
    return wd


@pytest.mark.parametrize("flags,piece", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_bad_flags_are_one_line_and_leave_the_report(finished, capsys, flags, piece):
    before = _snapshot(finished)
    assert report_main([f"--workdir={finished}"] + flags) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and piece in lines[0], err
    assert "; " in lines[0]
    assert _snapshot(finished) == before


def test_no_workdir_and_bad_eps_api(finished, capsys):
    assert report_main([]) == 2
    assert capsys.readouterr().err.startswith("error: --workdir is required; pass the workdir")
    before = _snapshot(finished)
    for eps in (float("nan"), 0.0, -1.0, 1e26, 1e-320):
        with pytest.raises(report.ReportError, match="out of range"):
            report.write_report(finished, eps=eps)
    assert _snapshot(finished) == before


def test_config_that_is_not_an_object_is_one_line(tmp_path, capsys):
    with open(tmp_path / "config.json", "w") as f:
        f.write("[]")
    assert report_main([f"--workdir={tmp_path}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds list, not a study's settings" in err[0]
    assert os.listdir(tmp_path) == ["config.json"]


def test_bad_eps_stops_before_tensorflow(finished):
    """The command line: the one error line comes before TensorFlow starts (no start-up lines),
    and nothing is written."""
    before = _snapshot(finished)
    code = (
        "import sys\n"
        "from wide_tf.report.__main__ import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert 'tensorflow' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, f"--workdir={finished}", "--eps=nan"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "error: --eps: 'nan' is out of range: use a finite number >= 0.001 and <= 1000, "
        "e.g. 0.25 or 1; see python -m wide_tf.report --help"
    ]
    assert _snapshot(finished) == before


def test_a_missing_workdir_is_answered_before_tensorflow(tmp_path):
    """`report` took 12-23 s (TensorFlow's import) to say a folder does not exist."""
    code = (
        "import sys\n"
        "from wide_tf.report.__main__ import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert 'tensorflow' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, f"--workdir={tmp_path / 'nope'}"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-2000:]
    assert "does not exist or is not a directory; pass the workdir" in lines[0]


def test_a_full_disk_is_not_blamed_on_the_workdir(finished, capsys, monkeypatch):
    """A report that could not be written for lack of space suggested another workdir."""

    def full(workdir, eps=None):
        raise OSError(28, "No space left on device", os.path.join(workdir, "report"))

    monkeypatch.setattr(writer, "write_report", full)
    assert report_main([f"--workdir={finished}"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device" in line and "free space on that disk" in line, line
    assert "pass the workdir" not in line


def test_agreement_command_line_errors(tmp_path, capsys):
    from wide_tf.report import agreement

    for argv, code, piece in (
        ([], 2, "--workdir is required; pass a finished study's workdir"),
        (["--workdir=x", "stray"], 2, "unexpected argument 'stray'"),
        ([f"--workdir={tmp_path / 'nope'}"], 1, "does not exist"),
    ):
        try:
            rc = agreement.main(argv)
        except SystemExit as e:
            rc = e.code
        out, err = capsys.readouterr()
        assert rc == code and out == "", (argv, rc)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and piece in lines[0], err


def test_a_bad_eps_in_config_json_is_one_line_and_writes_nothing(tmp_path, capsys):
    wd = make_workdir(tmp_path, _small_records(), config={"kind": "study", "sweep": {"eps": 0}})
    before = _snapshot(wd)
    assert report_main([f"--workdir={wd}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json: eps=0.0 is out of range" in err[0], err
    assert "or pass --eps" in err[0] and _snapshot(wd) == before
