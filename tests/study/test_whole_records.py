"""Whole records only: a result file that is not a whole record against schema/result_fields.py
does not count as done; the scheduler moves it aside (one line naming it) and runs its trial
again, and the progress counts it as not done."""

import json

from absl import logging

from wide_tf.checks.loader import load_config
from wide_tf.store import workdir as wd
from wide_tf.study import scheduler as study


def _smoke():
    config = load_config("configs/mlp.py:smoke")
    config.runtime.strategy = "cpu"
    config.sweep.family.depths = [1]  # two groups: 2 trials
    return config


def test_read_results_whole_skips_and_counts_partial_records(tmp_path):
    root = str(tmp_path)
    wd.record_result(root, {"trial_id": "stub"})
    wd.record_result(root, {"trial_id": "nums", "member": "m", "batch_size": 8})
    assert len(wd.read_results(root)) == 2  # the report's reading: anything with a trial_id
    records, bad = wd.read_results_counted(root, whole=True)
    assert records == [] and bad == 2
    assert "batch_size" not in wd.record_problem({"trial_id": "x", "batch_size": 8})
    assert wd.record_problem([]) == "holds list, not a result record"


def test_a_partial_result_is_moved_aside_named_and_run_again(tmp_path, monkeypatch):
    config, root = _smoke(), str(tmp_path)
    first = {r["trial_id"]: r for r in study.run_study(config, root)}
    assert len(first) == 2 and all(not wd.record_problem(r) for r in first.values())
    stub_id, num_id = sorted(first)
    # A stub with only the id, and one whose numbers are missing (in the trial folder too).
    wd.write_json(wd.result_path(root, stub_id), {"trial_id": stub_id})
    partial = {k: first[num_id][k] for k in ("trial_id", "member", "batch_size")}
    wd.write_json(wd.result_path(root, num_id), partial)
    wd.write_json(wd.join(wd.trial_dir(root, num_id), wd.RESULT), partial)
    assert wd.read_results(root, whole=True) == []  # neither counts as done
    warned = []
    monkeypatch.setattr(logging, "warning", lambda fmt, *a: warned.append(fmt % a))
    again = {r["trial_id"]: r for r in study.run_study(config, root)}
    assert sorted(again) == sorted(first) and all(not wd.record_problem(r) for r in again.values())
    moved = [w for w in warned if "moved to" in w]
    assert len(moved) == 3, warned  # the two results/ files and the trial folder's result.json
    assert all("not a whole result" in w and "its trial runs again" in w for w in moved)
    assert any(f"{num_id}.json" in w and "arch: missing" in w for w in moved), moved
    assert len(list((tmp_path / "results").glob("*.partial-*"))) == 2
    for tid in first:  # the same numbers as the first time (the trials are deterministic)
        assert again[tid]["steps_to_target"] == first[tid]["steps_to_target"]
    assert json.loads((tmp_path / "results" / f"{stub_id}.json").read_text())["final"]
