"""A model of your own, from outside the package: --config.model.arch=<module> names a module
with SPEC and build_model (examples/residual_mlp.py, docs/options.md#your-own-model)."""

import json

from helpers import run_main

from wide_tf.schema import architectures

TINY = (
    "--config=configs/mlp.py:smoke",
    "--config.model.arch=examples.residual_mlp",
    "--config.sweep.batch_sizes=(256,)",
    "--config.sweep.family.depths=(2,)",
    "--config.sweep.confirm_seeds=()",
    "--workers=1",
)


def test_an_outside_module_registers_its_architecture(monkeypatch):
    # (on copies of the registries: the package's own stay as they are for the other tests)
    monkeypatch.setattr(architectures, "ARCHITECTURES", dict(architectures.ARCHITECTURES))
    monkeypatch.setattr(architectures, "EXTERNAL", dict(architectures.EXTERNAL))
    spec = architectures.ensure("examples.residual_mlp")
    assert spec.name == "examples.residual_mlp" and "examples.residual_mlp" in architectures.names()
    assert callable(architectures.EXTERNAL["examples.residual_mlp"])
    assert spec.member_name(3, 64) == "resmlp-d3-w64"
    assert architectures.ensure("examples.residual_mlp") is spec  # imported once


def test_a_study_runs_an_outside_model(tmp_path):
    workdir = tmp_path / "study"
    run_main(*TINY, f"--workdir={workdir}")
    records = [json.loads(p.read_text()) for p in (workdir / "results").glob("*.json")]
    assert len(records) == 1
    r = records[0]
    assert r["arch"] == "examples.residual_mlp" and r["member"].startswith("resmlp-d2-w")
    spec = architectures.MLP()  # the residual adds no weight: the plain MLP's exact count
    assert r["params"] == spec.param_count(2, int(r["width"]), 10, (8, 8, 1), "none")


def test_a_module_that_is_not_there_is_one_error_line():
    p = run_main(
        "--config=configs/mlp.py:local", "--config.model.arch=no_such.pkg", "--dry_run", check=False
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "no module 'no_such' is found" in p.stderr and "your-own-model" in p.stderr
    p = run_main(
        "--config=configs/mlp.py:local", "--config.model.arch=configs.mlp", "--dry_run", check=False
    )
    assert p.returncode == 2 and "must define SPEC" in p.stderr
