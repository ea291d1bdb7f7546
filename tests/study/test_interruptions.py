"""A local study SIGKILLed at five different points (inside a trial, inside a checkpoint save,
while a result is recorded, between trials, inside the report) and run again after each: it
completes with every trial recorded exactly once and the same results as an uninterrupted run."""

import json
import subprocess
import sys

from helpers import REPO, env, run_main

# Not results: the seconds, and the record of who ran it (schema/provenance.py: the command line
# differs between the reference, the killed runs and the rerun).
TIMINGS = ("wall_time_s", "examples_per_s", "time_s", "provenance")
# --workers=1: the kill hooks are planted in this process (the worker processes of the default
# --workers are covered by tests/study/test_workers.py).
SMOKE = ["--config=configs/mlp.py:smoke", "--config.train.checkpoint_every_steps=2", "--workers=1"]
POINTS = ["trial:2", "checkpoint:1", "record:1", "between:2", "report:2"]


def _exact(result):
    """Everything of a result but its timings and provenance."""
    if isinstance(result, dict):
        return {k: _exact(v) for k, v in result.items() if k not in TIMINGS}
    if isinstance(result, list):
        return [_exact(v) for v in result]
    return result


def _records(workdir):
    """{trial_id: [every record of it]} from the results as stored (one file per trial); an
    unreadable record is not data and is left out."""
    out = {}
    folder = workdir / "results"
    texts = [p.read_text() for p in folder.glob("*.json")] if folder.is_dir() else []
    for text in texts:
        try:
            rec = json.loads(text)
        except ValueError:
            continue
        out.setdefault(rec["trial_id"], []).append(rec)
    return out


def test_killed_at_five_points_completes_once_with_the_same_results(tmp_path, smoke_study):
    # The uninterrupted run is the session's smoke study (conftest.smoke_study: the same config
    # and --workers=1, its default checkpoint cadence): a checkpoint every 2 steps must not change
    # a result either, so the comparison also holds the cadence to that.
    ref, _ = smoke_study
    expected = {k: _exact(v[0]) for k, v in _records(ref).items()}
    assert len(expected) == 4

    work = tmp_path / "killed"
    for point in POINTS:
        e = env()
        e["WIDE_TF_KILL_AT"] = point
        proc = subprocess.run(
            [sys.executable, str(REPO / "tests" / "kill_hooks.py"), *SMOKE, f"--workdir={work}"],
            cwd=REPO,
            env=e,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == -9, (
            f"not killed at {point} ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    assert not (work / "report" / "report.md").exists()
    assert list(
        work.rglob("*.tmp-killed")
    )  # the torn record is there, and must not be read as data
    run_main(*SMOKE, f"--workdir={work}")

    got = _records(work)
    assert {k: len(v) for k, v in got.items()} == {
        k: 1 for k in expected
    }  # every trial exactly once
    assert {k: _exact(v[0]) for k, v in got.items()} == expected
    assert "Finished trials: 4" in (work / "report" / "report.md").read_text()
