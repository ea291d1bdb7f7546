"""The answer suite (study/suite_runner.py, report/answer.py): every study runs as a study of its
own and resumes, the suite's table re-reads what each study's analysis says, and bad suites are
one line."""

import dataclasses
import glob
import json
import os
import re
import signal
import time

import numpy as np
import pytest

from tests.helpers import REPO, run_main, start_main
from wide_tf.analysis import decision, pooled, simulate
from wide_tf.analysis import members as M
from wide_tf.analysis import verdict as analysis
from wide_tf.report import answer
from wide_tf.schema.problems import UsageError
from wide_tf.store import workdir as wd
from wide_tf.study import suite_runner

TWO = """from wide_tf.study.suite_runner import Entry


def get_suite(arg=None):
    return [
        Entry("budget_sgd", "configs/mlp.py:smoke_sgd", "plain SGD", "budget"),
        Entry("depth_momentum", "configs/mlp.py:smoke_depth", "momentum 0.9", "depth"),
    ]
"""


def _results(folder):
    return sorted(glob.glob(os.path.join(folder, "results", "*.json")))


def test_a_suite_stopped_by_sigterm_resumes_then_writes_its_table(tmp_path):
    """Each study is a study of its own: SIGTERM mid-study stops the suite (143, the signal passed
    on to the study), a second command finishes every study without repeating a trial, and the
    table has a row per study."""
    spec = tmp_path / "two.py"
    spec.write_text(TWO)
    work = tmp_path / "suite"
    proc = start_main(f"--suite={spec}", f"--workdir={work}", "--workers=1")
    deadline = time.time() + 300
    while not _results(work / "budget_sgd") and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)  # the suite's parent only: it passes the signal on
    assert proc.wait(timeout=120) == 143, proc.stderr.read()[-3000:]
    assert "depth_momentum" not in json.loads((work / "suite.json").read_text())["wall_s"]
    stopped = {f: os.stat(f).st_mtime_ns for f in _results(work / "budget_sgd")}
    run_main(f"--suite={spec}", f"--workdir={work}", "--workers=1", timeout=600)
    record = json.loads((work / "suite.json").read_text())
    assert [e["name"] for e in record["entries"]] == ["budget_sgd", "depth_momentum"]
    assert set(record["wall_s"]) == {"budget_sgd", "depth_momentum"}
    assert {f: os.stat(f).st_mtime_ns for f in stopped} == stopped  # kept, not run again
    for name in ("budget_sgd", "depth_momentum"):
        assert _results(work / name), name  # a whole study: its results and its own report
        assert (work / name / "report" / "report.md").exists()
    text = (work / "answer.md").read_text()
    assert "| budget_sgd | digits_embedded | plain SGD | budget |" in text
    assert "| depth_momentum | digits_embedded | momentum 0.9 | depth |" in text
    assert "on log depth" in text  # a depth family's slope is on log depth


def _processes_naming(text: str) -> list[int]:
    """The pids of this machine's processes whose command line names `text`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if text in cmd and not zombie:
            pids.append(int(pid))
    return pids


def test_a_suite_killed_by_sigkill_leaves_no_study_running(tmp_path):
    """The suite started each study as `python -m wide_tf.main` without the death
    signal, so a suite killed by SIGKILL left its study (and the study's workers) computing,
    unsupervised. Now the study dies with the suite: no process is left 10 s later."""
    spec = tmp_path / "two.py"
    spec.write_text(TWO)
    work = tmp_path / "suite"
    proc = start_main(f"--suite={spec}", f"--workdir={work}", "--workers=1")
    deadline = time.time() + 120
    study = str(work / "budget_sgd")
    while not _processes_naming(study):  # the study's own process has started
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    time.sleep(1.0)  # well into its start (the death signal is set before any import)
    os.kill(proc.pid, signal.SIGKILL)  # the suite's parent only
    proc.wait()
    deadline = time.time() + 10
    while _processes_naming(study) and time.time() < deadline:
        time.sleep(0.1)
    left = _processes_naming(study)
    for pid in left:  # the test's own clean-up: what main left behind must not outlive it
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"{len(left)} processes of the study outlived the suite by 10 s"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--suite=configs/answer.py:nope", "--dry_run"], "unknown variant 'nope'"),
        (["--suite=configs/answer.py", "--config=configs/mlp.py:smoke"], "drop --config"),
        (["--suite=configs/answer.py"], "--workdir is required"),
        (["--suite=configs/mlp.py", "--dry_run"], "has no get_suite(arg) function"),
    ],
)
def test_bad_suite_is_one_line(args, expected):
    proc = run_main(*args, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], lines


def test_suite_checks_names_and_its_workdir(tmp_path):
    dup = tmp_path / "dup.py"
    dup.write_text(TWO.replace('"depth_momentum"', '"budget_sgd"'))
    with pytest.raises(UsageError, match="two studies share a name"):
        suite_runner.load(str(dup))
    bad = tmp_path / "bad.py"
    bad.write_text(TWO.replace('"depth_momentum"', '"Depth/1"'))
    with pytest.raises(UsageError, match="not a folder name"):
        suite_runner.load(str(bad))
    later = tmp_path / "later.py"
    later.write_text(
        TWO.replace('"plain SGD", "budget")', '"plain SGD", "budget", "depth_momentum")')
    )
    with pytest.raises(
        UsageError, match="replicates 'depth_momentum', which is not a study listed"
    ):
        suite_runner.load(str(later))
    # A workdir of another suite is refused, and its record is left as it was.
    work = tmp_path / "w"
    os.makedirs(work)
    (work / "suite.json").write_text(json.dumps({"suite": "other.py", "entries": []}))
    good = tmp_path / "two.py"
    good.write_text(TWO)
    with pytest.raises(UsageError, match="holds the suite 'other.py'"):
        suite_runner.run(str(good), str(work), "1", print)
    assert json.loads((work / "suite.json").read_text()) == {"suite": "other.py", "entries": []}


def test_answer_suite_names_real_configs():
    entries = suite_runner.load(str(REPO / "configs" / "answer.py"))
    assert [e.family for e in entries] == ["budget", "budget", "budget", "width", "depth"]
    assert {e.protocol for e in entries} == {"plain SGD", "momentum 0.9"}
    assert [e.replicate_of for e in entries] == ["", "budget_sgd", "", "", ""]


def test_table_matches_each_study_analysis_and_splits_width_from_depth(tmp_path, monkeypatch):
    """Simulated studies with a known answer (B_crit ~ width, depth irrelevant): the table says
    what each study's own analysis says, and the two-factor fit puts the budget slope on width."""
    # Each analysis the table ran, by its inputs: a study's own analysis is `analyze(records)`
    # at the default eps and replicates; where the table ran exactly that on the very records
    # object (analyze is seeded, so a second run is the same), it is not run a second time below;
    # a call on anything else (other records, eps or replicates) is no study's own analysis.
    ran = {}
    real_analyze = analysis.analyze

    def analyze(records, eps=analysis.DEFAULT_EPS, n_boot=analysis.DEFAULT_BOOTSTRAP):
        ran[(id(records), eps, n_boot)] = out = real_analyze(records, eps, n_boot)
        return out

    monkeypatch.setattr(analysis, "analyze", analyze)
    d0 = simulate.Design()
    designs = {
        "budget_sgd": ("budget", d0),
        "width_sgd": (
            "width",
            dataclasses.replace(
                d0, widths=(32.0, 56.0, 90.0, 160.0, 288.0, 512.0), depths=(2,) * 6
            ),
        ),
        "depth_sgd": (
            "depth",
            dataclasses.replace(d0, widths=(128.0,) * 6, depths=(1, 2, 3, 4, 6, 12)),
        ),
    }
    entries, studies = [], {}
    truth = simulate.Truth(alpha=1.0)
    for k, (name, (family, design)) in enumerate(designs.items()):
        entries.append(suite_runner.Entry(name, "configs/mlp.py:local", "plain SGD", family))
        rng = np.random.default_rng(10 + k)
        mems = simulate.members_of(design, truth, rng)
        studies[name] = simulate.simulate_study(rng, design, truth, mems)
        os.makedirs(tmp_path / name)
        if name == "budget_sgd":  # its replicate: the same members, fresh noise
            rep = "budget_sgd_replicate"
            entries.append(
                suite_runner.Entry(rep, "configs/mlp.py:local", "plain SGD", family, name)
            )
            studies[rep] = simulate.simulate_study(rng, design, truth, mems)
            os.makedirs(tmp_path / rep)
    entries.append(
        suite_runner.Entry("budget_momentum", "configs/mlp.py:local", "momentum", "budget")
    )
    wd.write_json(
        str(tmp_path / suite_runner.SUITE_FILE),
        {"suite": "s", "entries": [dataclasses.asdict(e) for e in entries], "wall_s": {}},
    )

    def read(folder):
        return None, studies[os.path.basename(folder)], 0

    text, rows = answer.render(str(tmp_path), read)
    assert "Not yet run (no finished trial): budget_momentum." in text
    for name, recs in studies.items():
        (row,) = [r for r in rows if r["study"] == name]
        own = (id(recs), analysis.DEFAULT_EPS, analysis.DEFAULT_BOOTSTRAP)
        expect = (ran[own] if own in ran else real_analyze(recs))["verdicts"]
        (v,) = expect.values()
        assert row["verdict"] == v.outcome
        assert row["slope"] == pytest.approx(v.decision.model_free_slope.value, abs=1e-4)
    by = {r["study"]: r for r in rows}
    # The study and its replicate read together: the pooled rule's own reading, in the table.
    both = by["budget_sgd + budget_sgd_replicate (pooled)"]
    p = pooled.decide(
        [M.summarize_members(studies[n]) for n in ("budget_sgd", "budget_sgd_replicate")]
    )
    assert both["verdict"] == p.outcome == "supported"
    assert both["slope"] == pytest.approx(p.slope.value, abs=1e-4)
    assert "## Each study with its replicate, read together" in text
    assert by["depth_sgd"]["axis"] == "depth" and by["width_sgd"]["axis"] == "width"
    assert by["width_sgd"]["slope"] > 0
    assert "## Width and depth separated (two-factor fit)" in text
    line = [ln for ln in text.splitlines() if ln.startswith("- **plain SGD**")][0]
    width_part = float(re.search(r"a width part ([+-][0-9.]+)", line).group(1))
    assert width_part > 0.4  # B_crit ~ width: the budget slope sits on width
    # The pooled pair is the headline (before the table); the check without the
    # heaviest member is the rule's at its level, never a verdict of its own; the members share
    # their random effects (one member, measured twice).
    assert text.index("## Each study with its replicate") < text.index("## Protocol x family")
    for r in rows:
        if r["without_heaviest"]:
            assert f"({decision.HEAVIEST_LEVEL:.0%} CI " in r["without_heaviest"]
            assert r["without_heaviest"].count("% CI") == 1
    n_est, n_members = map(
        int, re.search(r"(\d+) member estimates of (\d+) members", line).groups()
    )
    n_rep = len({r["member"] for r in studies["budget_sgd_replicate"]})
    assert n_members < n_est <= n_members + n_rep
    assert "width part minus depth part" in line and "Additivity:" in line


def test_protocols_compared_by_the_difference_of_their_slopes():
    """Momentum's budget family against plain SGD's: the difference of the slopes with a t
    interval on the smaller df from the two standard errors (hand-computed: -0.50 +- 2.447 x
    hypot(0.1, 0.05) = -0.50 +- 0.27 on 6 df)."""
    from types import SimpleNamespace as NS

    entries = [
        suite_runner.Entry("sgd", "configs/mlp.py:local", "plain SGD", "budget"),
        suite_runner.Entry("rep", "configs/mlp.py:local", "plain SGD", "budget", "sgd"),
        suite_runner.Entry("mom", "configs/mlp.py:local", "momentum 0.9", "budget"),
    ]
    own = "train_accuracy >= 0.97 (the study's)"
    rows = [
        {"study": "sgd", "target": own, "_slope": NS(value=0.3, se=0.05, df=7), "_bc": None},
        {"study": "mom", "target": own, "_slope": NS(value=-0.2, se=0.1, df=6), "_bc": None},
    ]
    (line,) = answer._protocols(entries, rows)
    assert line.startswith("- mom (momentum 0.9) minus sgd (plain SGD): B_x slope -0.50 (")
    assert "(-0.77 to -0.23)" in line and "B_crit slope -." in line
    assert answer._protocols(entries[:2], rows[:1]) == []
