"""Sweep lists are tuples, which ml_collections overrides on the command line:
--config.sweep.batch_sizes='(8,16)' (docs/options.md)."""

import json

from helpers import run_main

from wide_tf.checks import loader
from wide_tf.schema import fields


def test_every_list_field_defaults_to_a_tuple():
    listy = [f.path for f in fields.FIELDS.values() if isinstance(f.default, list)]
    assert listy == [], f"list defaults cannot be overridden on the command line: {listy}"
    config = loader.load_config("configs/mlp.py:local")
    assert isinstance(config.sweep.batch_sizes, tuple)
    assert isinstance(config.sweep.family.depths, tuple)


def test_dry_run_takes_a_tuple_of_batches():
    p = run_main("--config=configs/mlp.py:local", "--dry_run", "--config.sweep.batch_sizes=(8,16)")
    assert "batches [8, 16]" in p.stdout


def test_a_bad_entry_in_a_tuple_is_one_error_line():
    p = run_main(
        "--config=configs/mlp.py:local",
        "--dry_run",
        "--config.sweep.batch_sizes=(8,0)",
        check=False,
    )
    assert p.returncode == 2
    assert "sweep.batch_sizes=0 is out of range" in p.stderr
    assert "--config.sweep.batch_sizes='(a,b,...)'" in p.stderr


def test_a_tiny_study_runs_with_tuple_overrides(tmp_path):
    workdir = tmp_path / "study"
    p = run_main(
        "--config=configs/mlp.py:smoke",
        f"--workdir={workdir}",
        "--workers=1",
        "--config.sweep.batch_sizes=(256,)",
        "--config.sweep.family.depths=(2,)",
        "--config.sweep.confirm_seeds=()",
    )
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["sweep"]["batch_sizes"] == [256]
    results = [json.loads(p.read_text()) for p in (workdir / "results").glob("*.json")]
    assert [r["batch_size"] for r in results] == [256]
    # The study ends with the verdict in one sentence on the console.
    verdict = (workdir / "report" / "verdict.txt").read_text().strip()
    assert p.stdout.strip().splitlines()[-1] == verdict
    assert verdict.startswith("INCONCLUSIVE: ")  # one member: no slope to read
