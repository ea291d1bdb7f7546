"""Frozen designs (`analysis/frozen.py`): the file and its hash, the check that refuses any other
config (one line, exit 2), the stamp every record carries, the report's label, and the committed
frozen designs still matching their configs."""

import glob
import json
import os

import pytest
from helpers import REPO, run_main

from wide_tf.analysis import frozen
from wide_tf.checks import loader
from wide_tf.schema import provenance

SIM = {"margin": 0.3, "power_null": 0.9, "size_margin": 0.02, "studies": 200}


def _doc(spec="configs/mlp.py:smoke"):
    return frozen.design(
        loader.load_config(spec), spec, {"heaviest_level": 0.95}, {}, SIM, "2026-12-07"
    )


def _write(tmp_path, doc, name="d.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_file_is_whole_only_with_its_hash(tmp_path):
    doc = _doc()
    assert doc["hash"] == frozen.content_hash(doc) and len(doc["hash"]) == 64
    assert doc["targets"]["primary"] == "train_accuracy:0.5"
    assert doc["equivalence"] == {"margin": 0.3, "power_null": 0.9, "size_margin": 0.02}
    assert doc["seeds"]["tuning"] and "data_dir" not in doc["config"]["data"]
    assert frozen.load(_write(tmp_path, doc)) == doc
    doc["equivalence"]["margin"] = 0.5  # edited after freezing
    with pytest.raises(frozen.FrozenError, match="does not match its own hash"):
        frozen.load(_write(tmp_path, doc))
    with pytest.raises(frozen.FrozenError, match="not a frozen design"):
        frozen.load(_write(tmp_path, {"a": 1}))
    with pytest.raises(frozen.FrozenError, match="cannot be read"):
        frozen.load(str(tmp_path / "missing.json"))


def test_another_config_is_refused_naming_the_field(tmp_path):
    path = _write(tmp_path, _doc())
    config = loader.load_config("configs/mlp.py:smoke")
    assert frozen.check(config, path)["config_spec"] == "configs/mlp.py:smoke"
    config.data.data_dir = "/elsewhere"  # where the data sit is not the design
    frozen.check(config, path)
    config.train.max_epochs = 9.0
    with pytest.raises(frozen.FrozenError, match="train.max_epochs is 9.0, frozen 3.0"):
        frozen.check(config, path)
    assert frozen.default_file("configs/wrn.py:fashion_confirm") == os.path.join(
        "configs", "frozen", "wrn_fashion_confirm.json"
    )


def test_a_field_added_since_freezing_is_no_change_at_its_default(tmp_path):
    """A design frozen before runtime.cohort existed: the same config today (cohort 1, one run
    at a time, what the code did then) is the frozen study; cohorts are not."""
    doc = _doc()
    del doc["config"]["runtime"]["cohort"]
    doc["config_hash"] = frozen.config_hash(doc["config"])
    doc["hash"] = frozen.content_hash(doc)
    path = _write(tmp_path, doc)
    config = loader.load_config("configs/mlp.py:smoke")
    assert frozen.check(config, path) == doc
    config.runtime.backend, config.runtime.cohort = "jax", 4
    with pytest.raises(frozen.FrozenError, match="runtime.backend is 'jax', frozen 'tensorflow'"):
        frozen.check(config, path)
    config.runtime.backend = "tensorflow"
    with pytest.raises(frozen.FrozenError, match="runtime.cohort is 4, frozen None"):
        frozen.check(config, path)


def test_stamp_reaches_the_provenance_and_the_label(monkeypatch):
    doc = _doc()
    # Set through monkeypatch first, so the stamp below is undone after the test (a session's
    # later studies, run as children of this process, must not inherit it).
    monkeypatch.setenv(frozen.ENV, "")
    assert "frozen" not in provenance.collect([])
    s = frozen.stamp(doc, "d.json")
    assert provenance.collect([])["frozen"] == s and s["hash"] == doc["hash"]
    cfg = {"provenance": {"frozen": s}}
    recs = [{"provenance": {"frozen": s}}] * 3
    assert frozen.label(cfg, recs) == f"confirmatory, frozen at {doc['hash'][:12]} on 2026-12-07"
    assert frozen.label(cfg, recs + [{"provenance": {}}]).startswith("exploratory (its records")
    assert frozen.label({}, [{}]) == "exploratory (no frozen design)"
    monkeypatch.setenv(frozen.ENV, "not json")
    assert "frozen" not in provenance.collect([])


def test_main_refuses_another_config_and_stamps_every_record(tmp_path):
    """End to end: one trial of the smoke study under its frozen design writes config.json and a
    record carrying the hash; the same command with an override is refused in one line (exit 2)
    and writes nothing. About 15 s (TensorFlow's start and one short run)."""
    doc = _doc()
    path = _write(tmp_path, doc)
    bad = run_main(
        "--config=configs/mlp.py:smoke",
        f"--frozen={path}",
        "--config.train.max_epochs=2",
        f"--workdir={tmp_path / 'refused'}",
        check=False,
    )
    assert bad.returncode == 2 and not (tmp_path / "refused").exists()
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not the study frozen in" in lines[0]
    work = tmp_path / "study"
    run_main("--config=configs/mlp.py:smoke", f"--frozen={path}", f"--workdir={work}", "--trial=0")
    cfg = json.loads((work / "config.json").read_text())
    assert cfg["provenance"]["frozen"]["hash"] == doc["hash"]
    recs = [json.loads(open(p).read()) for p in glob.glob(str(work / "results" / "*.json"))]
    assert recs and all(r["provenance"]["frozen"]["hash"] == doc["hash"] for r in recs)
    assert frozen.label(cfg, recs).startswith(f"confirmatory, frozen at {doc['hash'][:12]}")


def test_the_committed_frozen_designs_match_their_configs():
    """A frozen file and its config stay one study: a change to the config (or to a default it
    inherits) fails here, before anyone runs a study that is not the frozen one."""
    files = sorted(glob.glob(os.path.join(REPO, "configs", "frozen", "*.json")))
    assert files
    for path in files:
        doc = frozen.load(path)
        spec = doc["config_spec"]
        assert frozen.default_file(spec) == os.path.relpath(path, REPO)
        frozen.check(loader.load_config(os.path.join(REPO, spec)), path)
        e = doc["equivalence"]
        assert e["margin"] > 0 and 0 <= e["power_null"] <= 1 and 0 <= e["size_margin"] <= 1


def test_the_freeze_command_writes_each_file_once(tmp_path, capsys):
    """`python -m wide_tf.analysis.frozen` simulates the design (two studies here, for time)
    and writes the study's and its replicate's frozen files; it never rewrites one."""
    out, rep = tmp_path / "s.json", tmp_path / "r.json"
    args = ["--config=configs/mlp.py:smoke", "--b_crit_ref=20", "--s_min=40", "--studies=2"]
    args += ["--bootstrap=20", f"--out={out}"]
    assert frozen.main(args + [f"--replicate=configs/mlp.py:smoke_sgd,{rep}"]) == 0
    a, b = frozen.load(str(out)), frozen.load(str(rep))
    assert a["simulation"] == b["simulation"] and a["config_hash"] != b["config_hash"]
    assert a["simulation"]["studies"] == 2 and a["rule"]["heaviest_level"] == 0.95
    assert "frozen at " in capsys.readouterr().out
    assert frozen.main(args) == 2
    assert "never rewritten" in capsys.readouterr().err


def _stamp_of_file(path):
    doc = frozen.load(path)
    return {
        "hash": doc["hash"],
        "frozen_on": doc["frozen_on"],
        "file": path,
        "equivalence": doc.get("equivalence"),
    }


def test_the_margin_is_read_only_where_the_design_planned_the_reading(tmp_path):
    """A pair's design (pooled over two studies) gives its margin to the pair read together, not
    to either study alone nor to the pair read with a third; a single study's design gives it to
    that study alone; a stamp whose file is missing or another design gets none."""
    first = _stamp_of_file("configs/frozen/mlp_fashion14.json")
    second = _stamp_of_file("configs/frozen/mlp_fashion14_replicate.json")
    assert frozen.load(first["file"])["rule"]["pooled_replicates"] == 2
    assert frozen.pooled_equivalence([first, second]) == first["equivalence"]
    assert frozen.pooled_equivalence([first]) is None
    assert frozen.pooled_equivalence([first, second, second]) is None
    assert frozen.pooled_equivalence([first, None]) is None
    assert frozen.pooled_equivalence([first, dict(second, equivalence={"margin": 0.1})]) is None
    assert frozen.pooled_equivalence([dict(first, hash="0" * 64), second]) is None
    assert frozen.pooled_equivalence([dict(first, file="configs/frozen/nope.json"), second]) is None
    single = _stamp_of_file(_write(tmp_path, _doc()))  # frozen without replicates
    cfg = {"provenance": {"frozen": single}}
    assert frozen.study_equivalence(cfg, [cfg] * 2) == single["equivalence"]
    pair = {"provenance": {"frozen": first}}
    assert frozen.study_equivalence(pair, [pair]) is None
    assert frozen.label(pair, [pair]).endswith(
        ", as 2 studies read together (this study alone is not that reading)"
    )
    assert frozen.label(cfg, [cfg]).endswith("on 2026-12-07")
