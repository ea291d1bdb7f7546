"""One process model (issue 33 item 4): the parent of --workers=N checks (or writes) the workdir's
study once, before it starts any worker, and the workers do not repeat it; one "die with the
parent" (study/worker_boot.py)."""

import json
import pathlib

import pytest

from wide_tf.checks import validate
from wide_tf.checks.loader import load_config
from wide_tf.study import scheduler, workers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_parent_refuses_another_study_before_starting_any_worker(tmp_path):
    config = load_config("configs/mlp.py:smoke")
    (tmp_path / "config.json").write_text(json.dumps({"model": {"arch": "wrn"}}))
    with pytest.raises(validate.UsageError, match="different study"):
        workers.start(str(tmp_path), 2, ["main"], config)
    assert not (tmp_path / "logs").exists()  # no worker was started


def test_the_workers_leave_the_study_check_to_their_parent():
    # workers.start checks (or writes) config.json; run_worker does not repeat it.
    assert "check_workdir" in workers.start.__code__.co_names
    assert "check_workdir" not in scheduler.run_worker.__code__.co_names


def test_one_die_with_the_parent():
    hits = [
        p.relative_to(ROOT)
        for p in (ROOT / "wide_tf").rglob("*.py")
        if "PR_SET_PDEATHSIG" in p.read_text() or "prctl(" in p.read_text()
    ]
    assert hits == [pathlib.Path("wide_tf/study/worker_boot.py")]
