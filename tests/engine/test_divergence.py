"""A learning-rate grid that includes a diverging value: the study completes, the diverged trials
are recorded with their status and counted in the report, and no NaN or infinity reaches a table
as a number."""

import csv
import math
import re

from wide_tf import report as report_lib
from wide_tf.checks import loader
from wide_tf.study import scheduler, trials


def test_a_grid_with_a_diverging_rate_completes_and_reports_it(tmp_path):
    config = loader.load_config("configs/mlp.py:smoke")
    config.sweep.lr_multipliers = [1.0, 3000.0]  # 3000 x the rule's guess diverges in a step or two
    config.train.diverge_loss = 100.0
    config.runtime.strategy = "cpu"
    trials.check_workdir(config, str(tmp_path))  # config.json, as processes.run writes it
    records = scheduler.run_study(config, str(tmp_path))
    report_lib.write_report(str(tmp_path))  # main's, after a study
    assert len(records) == 8 and len({r["trial_id"] for r in records}) == 8
    diverged = [r for r in records if r["lr_multiplier"] == 3000.0]
    assert diverged and all(r["status"] == "diverged" for r in diverged)
    assert all(r["steps_to_target"] is None and r["epochs_to_target"] is None for r in diverged)
    assert all(
        v is None for r in diverged for v in r["final"].values()
    )  # no NaN stands in for a number
    assert all(r["status"] == "reached" for r in records if r["lr_multiplier"] == 1.0)
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"{len(diverged)} diverged" in report
    assert not re.search(r"\b(nan|inf)\b", report, re.IGNORECASE)
    for name in ("all_trials.csv", "best_per_batch.csv"):
        with open(tmp_path / "report" / name) as f:
            for row in csv.DictReader(f):
                for value in row.values():
                    try:
                        assert math.isfinite(float(value)), (name, row)
                    except ValueError:
                        pass  # text, or an empty cell for "none"
