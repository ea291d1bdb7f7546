"""runtime.cohort in a study: the smoke study's cell (one member, batch 32, a grid of three rates,
then two confirmation seeds) on JAX, one run at a time and in cohorts of up to 4 (the grid's
three runs as one cohort, the confirmations as another), gives the same records (helpers.COMPARED,
the final numbers to 4 places); a TensorFlow config asking for cohorts is refused with one line
naming the fix."""

import json
import subprocess

import pytest
from helpers import REPO, comparable, env, main_command, run_main

pytest.importorskip("jax")

STUDY = (
    "--config=configs/mlp.py:smoke",
    "--config.runtime.backend=jax",
    "--config.sweep.family.depths=(1,)",
    "--config.sweep.batch_sizes=(32,)",
    "--config.sweep.lr_multipliers=(0.5,1.0,2.0)",
    "--config.sweep.confirm_seeds=(1,2)",
    "--config.train.target_value=0.9",  # the rates reach it at different steps
    "--no_report",
)


def _records(workdir) -> dict:
    return {p.name: json.loads(p.read_text()) for p in sorted((workdir / "results").iterdir())}


def test_a_study_in_cohorts_records_what_it_records_one_run_at_a_time(tmp_path):
    procs = {
        k: subprocess.Popen(
            main_command(*STUDY, f"--config.runtime.cohort={k}", f"--workdir={tmp_path / str(k)}"),
            cwd=REPO,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in (1, 4)
    }
    for proc in procs.values():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
    alone, together = _records(tmp_path / "1"), _records(tmp_path / "4")
    assert len(alone) == 5 and alone.keys() == together.keys()
    assert len({r["steps_to_target"] for r in alone.values()}) > 1  # not one step for every run
    for name, record in alone.items():
        # The compared fields exactly; the final numbers to 4 places (comparable): vmap batches
        # the matrix products, so their last float bits may differ (a test loss by 6e-8 here).
        assert comparable(record) == comparable(together[name]), name


def test_cohorts_on_tensorflow_are_refused_with_the_fix():
    proc = run_main(
        "--config=configs/mlp.py:smoke",
        "--config.runtime.cohort=4",
        "--workdir=/nonexistent/never_written",
        "--dry_run",
        check=False,
    )
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("error: runtime.cohort=4 trains runs together on the JAX backend")
    assert "--config.runtime.backend=jax" in lines[-1]
