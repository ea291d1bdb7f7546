"""End-to-end tests of wide_tf.report on synthetic study workdirs with known answers."""

import csv
import glob
import json
import math
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from helpers import add_second_target

from wide_tf import report
from wide_tf.analysis import verdict
from wide_tf.engine.result import describe_protocol
from wide_tf.schema import defaults

N_TRAIN = 4096
BATCHES = (32, 64, 128, 256, 512)
# Fixed-budget family, narrowest first, with S(B) = 400 (1 + Bc / B): E(B) is proportional to
# B + Bc (B_x(1+eps): `expected_b_model_free`).
# B_crit = 40 (w / 90)^1.5: a slope of 1.5 on log width, every B_crit inside the batches tried.
MEMBERS = [
    (f"mlp-d{d}-w{w}", d, w, 40.0 * (w / 90) ** 1.5)
    for d, w in ((16, 90), (8, 128), (4, 181), (2, 256), (1, 362))
]


def expected_b_model_free(bc: float, eps: float = 0.25, batches=BATCHES) -> float:
    """B_x(1+eps) of E = B + B_crit (in units of S_min / n), worked as the report does it: the
    reference is the geometric mean of the two smallest batches' epochs, the crossing is
    interpolated linearly in (log B, log E) between the two cells around it."""
    e = [b + bc for b in batches]
    thr = (1 + eps) * math.sqrt(e[0] * e[1])
    for k in range(1, len(batches)):
        if e[k] > thr:
            frac = math.log(thr / e[k - 1]) / math.log(e[k] / e[k - 1])
            return batches[k - 1] * (batches[k] / batches[k - 1]) ** frac
    return float(batches[-1])


def make_records(members=MEMBERS, seeds=(0, 1, 2), batches=BATCHES, history=True):
    """The grid (x0.5, x1, x2) on seed 0; x1 wins and is confirmed on the other seeds. Whole
    records (schema/result_fields.py's schema): the report leaves out any other."""
    recs = []
    for name, depth, width, bc in members:
        for b in batches:
            s = 400.0 * (1 + bc / b)
            for mult, factor, status in (
                (0.5, 2.0, "reached"),
                (1.0, 1.0, "reached"),
                (2.0, None, "diverged"),
            ):
                for seed in seeds:
                    if seed and mult != 1.0:
                        continue
                    # confirmation seeds differ by +-10 steps: the median is exactly s
                    st = None if factor is None else round(s * factor) + (0, 10, -10)[seed % 3]
                    tid = f"{name}-b{b}-m{mult}-s{seed}"
                    r = {
                        "trial_id": tid,
                        "member": name,
                        "arch": "mlp",
                        "depth": depth,
                        "width": width,
                        "params": 100_000 + depth,
                        "batch_size": b,
                        "lr_multiplier": mult,
                        "learning_rate": 0.05 * mult * (b / 256) ** 0.5,
                        "optimizer": "momentum",
                        "seed": seed,
                        "role": "confirm" if seed else "tune",
                        "num_train": N_TRAIN,
                        "status": status,
                        "target": {"metric": "train_accuracy", "value": 0.99},
                        "steps_to_target": st,
                        "steps_to_target_interp": st,
                        "epochs_to_target": None if st is None else st * b / N_TRAIN,
                        "examples_to_target": None if st is None else st * b,
                        "targets": [
                            {
                                "metric": "train_accuracy",
                                "value": 0.99,
                                "status": status,
                                "steps_to_target": st,
                                "steps_to_target_interp": st,
                                "epochs_to_target": None if st is None else st * b / N_TRAIN,
                            }
                        ],
                        "evaluations_to_target": None if st is None else 1 + st // 10,
                        "momentum_ramp_steps": None,
                        "diverged_at_step": 50 if status == "diverged" else None,
                        "steps": st or 50,
                        "epochs": (st or 50) * b / N_TRAIN,
                        "final": (
                            {
                                k: None
                                for k in (
                                    "train_accuracy",
                                    "train_loss",
                                    "test_accuracy",
                                    "test_loss",
                                )
                            }
                            if status == "diverged"
                            else {
                                "train_accuracy": 0.99,
                                "train_loss": 0.05,
                                "test_accuracy": 0.9 - b / 1e4,
                                "test_loss": 0.3,
                            }
                        ),
                        "best_test_accuracy": None
                        if status == "diverged"
                        else 0.91 - b / 1e4 - depth / 1e3,
                        "wall_time_s": 3.0,
                        "examples_per_s": 2000.0,
                        "gradient": {"history": [], "noise_scale_ema": None},
                        "runtime": "cpu",
                        "dtype_policy": "float32",
                        "protocol": PROTOCOL,
                    }
                    if history and status != "diverged":
                        r["gradient"] = {
                            "history": [
                                {
                                    "step": k * 10,
                                    "examples": k * 10 * b,
                                    "diversity": 0.01,
                                    "batch_bound": width * (1.0 - 0.1 * k),
                                    "noise_scale": 1.0,
                                }
                                for k in range(4)
                            ],
                            "noise_scale_ema": 50.0,
                        }
                    recs.append(r)
    return recs


CONFIG = {
    "kind": "study",
    "model": {"arch": "mlp", "depth": 2, "width": 256, "norm": "ghost", "ghost_batch_size": 32},
    "data": {
        "name": "mnist_embedded",
        "num_train": N_TRAIN,
        "augment": False,
        "shuffle_buffer": 10000,
    },
    "optim": {
        "name": "momentum",
        "base_lr": 0.05,
        "reference_batch": 256,
        "scaling": "sqrt",
        "momentum": 0.9,
        "weight_decay": 0.0,
        "schedule": "cosine",
        "end_lr_fraction": 0.0,
        "warmup_epochs": 2.0,
        "warmup_steps": 0,
        "warmup_fixed": "epochs",
    },
    "train": {
        "max_epochs": 40.0,
        "max_steps": 0,
        "eval_every_examples": 4000,
        "target_metric": "train_accuracy",
        "target_value": 0.99,
        "diverge_loss": 1000.0,
    },
    "sweep": {
        "family": {"kind": "budget", "budget": 1e5, "depths": [2, 4, 8]},
        "batch_sizes": list(BATCHES),
        "lr_multipliers": [0.5, 1.0, 2.0],
        "seeds": [0],
        "confirm_seeds": [1, 2],
        "eps": 0.25,
    },
}


# What train.py records in every result.json of this study (the report's protocol table reads it).
def _full_config(partial: dict) -> ml_collections.ConfigDict:
    """A whole config (defaults.py, the one source of defaults) with this study's settings."""
    config = defaults.base_config()
    for section, values in partial.items():
        if isinstance(values, dict) and section in config:
            for k, v in values.items():
                if k in config[section]:
                    config[section][k] = v
    return config


PROTOCOL = describe_protocol(_full_config(CONFIG))


def make_workdir(path, records, config=CONFIG):
    os.makedirs(path, exist_ok=True)
    if config is not None:
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    if records is not None:
        os.makedirs(os.path.join(path, "results"), exist_ok=True)
        for i, r in enumerate(records):
            name = f"{r.get('trial_id', f'record{i}')}.json"
            with open(os.path.join(path, "results", name), "w") as f:
                json.dump(r, f)
    return str(path)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    wd = make_workdir(tmp_path_factory.mktemp("study"), make_records())
    return wd, report.write_report(wd)


def test_report_files_and_tables(full_report):
    wd, path = full_report
    out = os.path.join(wd, "report")
    assert path == os.path.join(out, "report.md")
    for name in (
        "report.md",
        "best_per_batch.csv",
        "all_trials.csv",
        "members.csv",
        "steps_vs_batch.png",
        "epochs_vs_batch.png",
        "batch_vs_width.png",
        "test_accuracy_vs_batch.png",
        "learning_rate_vs_batch.png",
        "batch_bound_vs_width.png",
        "batch_bound_over_training.png",
    ):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    for png in glob.glob(os.path.join(out, "*.png")):
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    trials = read_csv(os.path.join(out, "all_trials.csv"))
    assert len(trials) == 5 * 5 * (3 + 2)  # 5 members x 5 batches x (grid of 3 + 2 confirmations)
    assert {t["status"] for t in trials} == {"reached", "diverged"}

    best = read_csv(os.path.join(out, "best_per_batch.csv"))
    assert len(best) == 25
    for row in best:
        bc = {m[0]: m[3] for m in MEMBERS}[row["member"]]
        b = int(row["batch_size"])
        expected_steps = round(400.0 * (1 + bc / b))  # median of -10, 0, +10 around the curve
        assert float(row["steps_to_target"]) == pytest.approx(expected_steps)
        assert float(row["steps_max"]) - float(row["steps_min"]) == pytest.approx(20.0)
        assert row["n_seeds"] == "3"
        assert float(row["epochs_to_target"]) == pytest.approx(expected_steps * b / N_TRAIN)
        assert float(row["best_lr_multiplier"]) == 1.0
        assert float(row["best_learning_rate"]) == pytest.approx(0.05 * (b / 256) ** 0.5, rel=1e-5)
        assert row["lr_at_grid_edge"] == "False"
        assert (row["n_trials"], row["n_reached"], row["n_not_reached"], row["n_diverged"]) == (
            "5",
            "4",
            "0",
            "1",
        )

    members = {r["member"]: r for r in read_csv(os.path.join(out, "members.csv"))}
    for name, _, _, bc in MEMBERS:
        mb = expected_b_model_free(bc)
        assert float(members[name]["b_x"]) == pytest.approx(mb, rel=0.02)
        assert float(members[name]["b_x_low"]) <= 1.001 * float(members[name]["b_x"])
        assert float(members[name]["b_crit"]) == pytest.approx(bc, rel=0.05)
        assert float(members[name]["b_crit_low"]) <= 1.001 * bc
        assert 0.999 * bc <= float(members[name]["b_crit_high"])
        assert float(members[name]["batch_bound_init"]) == pytest.approx(
            {m[0]: m[2] for m in MEMBERS}[name]
        )


def test_report_markdown_has_verdict_protocol_and_numbers(full_report):
    wd, path = full_report
    md = open(path).read()
    v = verdict.analyze(make_records(), 0.25)["verdicts"]["mlp"]
    assert v.outcome == verdict.SUPPORTED
    assert v.decision.b_crit_slope.value == pytest.approx(1.5, rel=0.05)
    assert v.text in md and "\n\nSUPPORTED: B_x1.25 rises with width" in md
    for s in (
        "train_accuracy >= 0.99",
        "40.0 epochs",
        "every 4000 examples",
        "momentum",
        "cosine",
        "2.0 epochs (fixed in epochs)",
        "cosine (end at 0.0 x peak)",
        "loss > 1000.0 or non-finite",
        "mnist_embedded, 4096 training examples",
        "multipliers [0.5, 1.0, 2.0] of the base rate 0.05",
        "ghost",
        "virtual batch 32",
        "mnist_embedded",
        "tuning [0]",
        "[1, 2]",
        "B_x1.25 | the batch where epochs to target first reach x1.25 those of the two smallest "
        "batches (eps = 0.25)",
        "mlp-d8-w128",
        "mlp-d2-w256",
        "100,008",
        "(steps_vs_batch.png)",
        "How to read this report",
        "Grid-edge warnings",
        "None: every chosen learning rate",
        "95% CI",
        "log B_crit (the fitted knee, over the",
        "inside the batches tried) changes at",
    ):
        assert s in md, s
    # the members table row of the widest member, and a cell with its seed range
    row = next(
        line for line in md.splitlines() if line.startswith("| mlp-d2-w256 | 2 | 256 | 100,002 | ")
    )
    assert "(95% CI" in row and "(0 censored)" in row
    # the narrowest member's B = 32 cell: S = 400 (1 + 40 / 32) = 900, seeds 890-910
    assert "| 32 | 0.01768 (x1) | 0.5 1 2 | 3 | 900.0 (890.0-910.0) | 7.03 (6.95-7.11) |" in md


def _events(dirpath):
    import tensorflow as tf

    out = []
    for f in tf.io.gfile.glob(os.path.join(dirpath, "events.out.tfevents.*")):
        out += list(tf.compat.v1.train.summary_iterator(f))
    return out


def _plugin_values(events, plugin="hparams"):
    return [
        v for e in events for v in e.summary.value if v.metadata.plugin_data.plugin_name == plugin
    ]


def test_report_tensorboard_sessions_carry_hparams_and_images(full_report):
    """One session per (member, batch) at its chosen rate (the median seed's trial), the HParams
    on it, the experiment config at tb/'s root: 25 sessions + the plots, under the 500 runs
    TensorBoard ticks on open."""
    pytest.importorskip("tensorboard")
    import tensorflow as tf
    from tensorboard.plugins.hparams import plugin_data_pb2

    wd, _ = full_report
    tb = os.path.join(wd, "report", "tb")
    root = _plugin_values(_events(tb))
    assert root
    exp = plugin_data_pb2.HParamsPluginData.FromString(
        root[0].metadata.plugin_data.content
    ).experiment
    assert {h.name for h in exp.hparam_infos} >= {
        "member",
        "depth",
        "width",
        "params",
        "batch_size",
        "learning_rate",
        "lr_multiplier",
        "optimizer",
        "seed",
        "provenance/wide_tf",
        "provenance/versions",
        "provenance/machine",
    }
    metrics = {(m.name.group, m.name.tag) for m in exp.metric_infos}
    assert metrics >= {
        ("", "outcome/median_steps_to_target"),
        ("", "outcome/median_epochs_to_target"),
        ("train_set", "accuracy"),
        ("test", "accuracy"),
    }
    sessions = sorted(
        os.path.relpath(os.path.dirname(f), tb)
        for f in glob.glob(os.path.join(tb, "*", "*", "events.out.tfevents.*"))
    )
    assert sessions == sorted(
        [f"{m[0]}/b{b}" for m in MEMBERS for b in BATCHES] + [f"{m[0]}/member" for m in MEMBERS]
    )
    runs = {
        os.path.dirname(f) for f in glob.glob(os.path.join(tb, "**", "events.*"), recursive=True)
    }
    assert len(runs) == len(sessions) + 2 < 500  # the sessions, the root's config, the plots
    events = _events(os.path.join(tb, "mlp-d4-w181", "b64"))
    start = plugin_data_pb2.HParamsPluginData.FromString(
        _plugin_values(events)[0].metadata.plugin_data.content
    ).session_start_info
    assert start.hparams["batch_size"].number_value == 64
    assert start.hparams["member"].string_value == "mlp-d4-w181"
    assert start.hparams["lr_multiplier"].number_value == 1.0  # the chosen rate
    assert start.hparams["seed"].number_value == 0  # seeds 0, 1, 2 took s, s + 10, s - 10
    scalars = {
        v.tag: float(tf.make_ndarray(v.tensor))
        for e in events
        for v in e.summary.value
        if v.tag in report.OUTCOME_DOCS
    }
    bc = {m[0]: m[3] for m in MEMBERS}["mlp-d4-w181"]
    assert scalars["outcome/median_steps_to_target"] == round(400 * (1 + bc / 64))
    assert scalars["outcome/seeds_reached"] == 3.0
    images = {v.tag for e in _events(os.path.join(tb, "plots")) for v in e.summary.value}
    assert {"steps_vs_batch", "epochs_vs_batch", "batch_vs_width"} <= images


def test_tensorboard_copies_curves_with_one_tag_set(tmp_path):
    """A trial's curves, in today's layout and an older workdir's (train/batch_*, eval/train_*,
    eval/test_*), land in the session's train/, train_set/ and test/ runs under the same tags,
    so TensorBoard overlays training and evaluation."""
    pytest.importorskip("tensorboard")
    from wide_tf.engine.summaries import MetricsWriter
    from wide_tf.report import tensorboard as tb

    new, old = tmp_path / "new", tmp_path / "old"
    w = MetricsWriter(str(new), True, "t")
    w.scalars("train", 5, {"batch_loss": 0.5, "batch_accuracy": 0.8, "learning_rate": 0.1})
    w.scalars("eval", 5, {"train_loss": 0.4, "train_accuracy": 0.9, "test_accuracy": 0.85})
    w.close()
    assert sorted(os.listdir(new)) == ["test", "train", "train_set"]
    import tensorflow as tf

    for kind, tag, value in (("train", "batch_loss", 0.5), ("eval", "test_accuracy", 0.85)):
        writer = tf.summary.create_file_writer(str(old / kind))  # an older workdir's layout
        with writer.as_default():
            tf.summary.scalar(tag, value, step=5)
        writer.close()
    for trial, want in (
        (new, {"train": {"loss", "accuracy", "learning_rate"}, "train_set": {"loss", "accuracy"}}),
        (old, {"train": {"loss"}, "test": {"accuracy"}}),
    ):
        session = tmp_path / f"session_{trial.name}"
        assert tb.copy_curves(str(trial), str(session)) > 0
        for run, tags in want.items():
            got = {v.tag for e in _events(str(session / run)) for v in e.summary.value}
            assert got == tags, (trial.name, run, got)


def test_report_rerun_replaces_tensorboard_entries(tmp_path):
    pytest.importorskip("tensorboard")
    members = [MEMBERS[0]]
    wd = make_workdir(
        tmp_path, make_records(members, seeds=(0,), batches=(32, 64, 128), history=False)
    )
    report.write_report(wd)
    report.write_report(wd)
    run = os.path.join(wd, "report", "tb", MEMBERS[0][0], "b32")
    assert len(glob.glob(os.path.join(run, "events.out.tfevents.*"))) == 1
    md = open(os.path.join(wd, "report", "report.md")).read()
    assert "needs at least 3" in md and "INCONCLUSIVE" in md
    assert not os.path.exists(os.path.join(wd, "report", "batch_bound_vs_width.png"))


def test_report_gradient_measured_at_init_only(tmp_path):
    # One measurement per trial (at initialisation): the bound against width is drawn, the bound
    # over training (a single point per line: nothing to see) is not made at all.
    recs = make_records(MEMBERS[:2], seeds=(0,), batches=(32, 64, 128))
    for r in recs:
        r["gradient"]["history"] = r["gradient"]["history"][:1]
    wd = make_workdir(tmp_path, recs)
    md = open(report.write_report(wd)).read()
    out = os.path.join(wd, "report")
    assert os.path.exists(os.path.join(out, "batch_bound_vs_width.png"))
    assert not os.path.exists(os.path.join(out, "batch_bound_over_training.png"))
    assert "batch_bound_vs_width.png" in md and "batch_bound_over_training.png" not in md


def test_report_empty_results(tmp_path):
    wd = make_workdir(tmp_path, [])
    md = open(report.write_report(wd)).read()
    assert "No trials finished yet" in md and "train_accuracy >= 0.99" in md
    assert read_csv(os.path.join(wd, "report", "all_trials.csv")) == []
    # no results/ at all: the same
    os.rmdir(os.path.join(wd, "results"))
    assert "No trials finished yet" in open(report.write_report(wd)).read()


def test_report_only_failed_trials_and_grid_edges(tmp_path):
    recs = make_records([MEMBERS[0]], seeds=(0,), batches=(32, 64), history=False)
    for r in recs:
        if r["status"] == "reached":
            r.update(status="not_reached", steps_to_target=None, epochs_to_target=None, steps=700)
    wd = make_workdir(tmp_path / "failed", recs)
    md = open(report.write_report(wd)).read()
    assert "INCONCLUSIVE" in md and "needs at least 3" in md
    best = read_csv(os.path.join(wd, "report", "best_per_batch.csv"))
    assert [r["steps_to_target"] for r in best] == ["", ""]
    assert [float(r["censored_above"]) for r in best] == [
        700,
        700,
    ]  # censored at the budget, never a value
    assert [(r["n_not_reached"], r["n_diverged"]) for r in best] == [("2", "1"), ("2", "1")]
    assert "> 700 (censored)" in md

    # Members whose chosen LR is the smallest tried: grid-edge warnings, and an unresolved edge
    # makes the verdict inconclusive, naming the cells.
    recs = make_records(MEMBERS, history=False)
    recs = [r for r in recs if r["lr_multiplier"] != 0.5]
    wd = make_workdir(tmp_path / "edge", recs)
    md = open(report.write_report(wd)).read()
    assert "- mlp-d8-w128, B=32: chosen multiplier x1 is at the edge" in md
    assert "\n\nINCONCLUSIVE: " in md and "at the edge of the rates tried in" in md
    assert "mlp-d8-w128 (B = 32, 64, 128, 256, 512)" in md


def test_report_without_config_uses_protocol_records(tmp_path):
    wd = make_workdir(
        tmp_path,
        make_records([MEMBERS[0]], seeds=(0,), batches=(32, 64, 128), history=False),
        config=None,
    )
    md = open(report.write_report(wd, eps=0.5)).read()
    assert "config.json | missing" in md and "(eps = 0.5)" in md
    # how the trials ran comes from their records all the same
    assert "| Target | train_accuracy >= 0.99 (first seen" in md and "| Budget | 40.0 epochs" in md
    assert "Batch sizes" not in md  # the study's design is in config.json only


def test_report_protocol_says_where_trials_differ(tmp_path):
    recs = make_records([MEMBERS[0]], seeds=(0,), batches=(32, 64, 128), history=False)
    recs[0] = dict(recs[0], protocol=dict(PROTOCOL, max_epochs=20.0))
    del recs[1]["protocol"]
    md = open(report.write_report(make_workdir(tmp_path, recs))).read()
    assert "| Budget | differs across trials: 40.0 epochs (7 trials); 20.0 epochs (1 trial) |" in md
    assert "| Trials without settings | 1 (older result files) |" in md
    assert "| Optimizer | momentum, momentum 0.9 |" in md  # the same in every trial: one value


def test_bad_workdir_errors(tmp_path):
    with pytest.raises(report.ReportError):
        report.write_report(str(tmp_path / "nope"))
    with pytest.raises(report.ReportError):
        report.write_report(str(tmp_path))  # exists but holds no study
    # An empty TF_CPP_MIN_LOG_LEVEL (TensorFlow read it as 0) is no choice: the command
    # itself keeps TensorFlow's start-up lines out (wide_tf/tf_start.py), so its stderr is the one
    # error line. A folder that exists: the report imports TensorFlow to read it.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="")
    p = subprocess.run(
        [sys.executable, "-m", "wide_tf.report", f"--workdir={tmp_path}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1 and p.stdout == ""
    assert "Traceback" not in p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not a study workdir" in err[0], err
    assert "; pass the workdir of a study" in err[0]
    assert os.listdir(tmp_path) == []


def test_report_shows_the_verdict_at_every_target_and_s_min_against_the_ramp():
    from wide_tf.report import markdown

    recs = make_records(history=False)
    for r in recs:
        r["momentum_ramp_steps"] = 10.0
    add_second_target(recs, "train_loss", 0.1, 0.5)
    result = verdict.analyze(recs, 1.0, n_boot=50)
    lines = markdown.md_targets(result["per_target"])
    assert lines[0] == "## The verdict at every target"
    rows = [ln for ln in lines if ln.startswith("| train_")]
    assert [r.split(" | ")[0] for r in rows] == ["| train_accuracy >= 0.99", "| train_loss <= 0.1"]
    assert all("| supported |" in r for r in rows)
    text = markdown.md_transients(result["summaries"], recs)[2]
    # S_min = 400 steps for every member (fitted to 399-400): 40x the ramp of 10 steps.
    assert text.startswith("S_min ranges from 399 to 400 steps, 39.9x or more the momentum ramp")


def test_the_report_leaves_out_partial_records_and_counts_them(tmp_path):
    """A stub result ({"trial_id": ...}) or one missing its numbers is no finished trial: `python
    -m wide_tf.report` leaves it out of every table and names it in one line of report.md."""
    from wide_tf.report.__main__ import main as report_main

    recs = make_records([MEMBERS[0]], seeds=(0,), batches=(32, 64), history=False)
    wd = make_workdir(tmp_path, recs)
    blank = {k: v for k, v in recs[0].items() if k not in ("steps", "final", "status")}
    blank["trial_id"] = "blank-b32"
    for rec in ({"trial_id": "stub-b64"}, blank):
        with open(os.path.join(wd, "results", f"{rec['trial_id']}.json"), "w") as f:
            json.dump(rec, f)
    assert report_main([f"--workdir={wd}"]) == 0
    md = open(os.path.join(wd, "report", "report.md")).read()
    assert f"Finished trials: {len(recs)} (" in md
    assert " 2 partial record(s) left out: blank-b32 (not a whole result (status: missing; " in md
    assert "; stub-b64 (not a whole result (member: missing; " in md
    ids = [r["trial_id"] for r in read_csv(os.path.join(wd, "report", "all_trials.csv"))]
    assert sorted(ids) == sorted(r["trial_id"] for r in recs)


def test_figures_are_fit_for_a_paper(tmp_path, monkeypatch):
    """A PDF beside every PNG at 200 dpi or more; every batch labelled; width labels
    that never overlap; legends outside the data; test accuracy at the chosen rate with the
    seeds' range as a band."""
    from PIL import Image

    from wide_tf.report import plots

    recs = make_records()
    result = verdict.analyze(recs, 0.25)
    figures = {}
    real_save = plots._save
    monkeypatch.setattr(
        plots, "_save", lambda fig, *a: figures.setdefault(a[1], fig) and real_save(fig, *a)
    )
    made = plots.make_plots(
        result["summaries"], recs, 0.25, "acc", str(tmp_path), result["verdicts"]
    )
    assert len(made) >= 5
    for name, _, _ in made:
        assert (tmp_path / name.replace(".png", ".pdf")).read_bytes().startswith(b"%PDF")
        assert min(Image.open(tmp_path / name).info["dpi"]) >= 199.5
    for name in ("steps_vs_batch.png", "epochs_vs_batch.png", "test_accuracy_vs_batch.png"):
        ax = figures[name].axes[0]
        assert sorted(ax.get_xticks()) == list(BATCHES), name  # every batch labelled
        figures[name].canvas.draw()
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= ax.get_window_extent().x1, name  # beside the axes, not on the data
    acc = figures["test_accuracy_vs_batch.png"].axes[0]
    assert len(acc.collections) >= len(MEMBERS)  # one seed band per member
    for ax in figures["batch_vs_width.png"].axes:
        ticks = np.log(sorted(t for t in ax.get_xticks() if t > 0))
        span = ticks[-1] - ticks[0]
        assert np.all(np.diff(ticks) >= plots.MIN_TICK_GAP * span - 1e-9)


def test_spaced_ticks_keep_the_ends_and_thin_the_crowded_middle():
    from wide_tf.report.plots import spaced_ticks

    widths = [64, 70, 79, 92, 102, 117, 140, 189, 667]  # the local study's members
    kept = spaced_ticks(widths)
    assert kept[0] == 64 and kept[-1] == 667 and 70 not in kept and len(kept) < len(widths)
    assert spaced_ticks([4, 8, 32, 64, 128, 176], 0.04) == [4, 8, 32, 64, 128, 176]


def test_tensorboard_hparams_are_typed_and_members_carry_the_answer(full_report):
    """Depth, width, batch and rate are typed HParams (the tab filters by them); each member's
    session holds B_x(1+eps) and B_crit with their interval ends; the curves have an examples
    axis (step x batch) beside the step axis."""
    pytest.importorskip("tensorboard")
    import tensorflow as tf
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    from wide_tf.report import tensorboard as tbmod

    wd, _ = full_report
    tb = os.path.join(wd, "report", "tb")
    exp = plugin_data_pb2.HParamsPluginData.FromString(
        _plugin_values(_events(tb))[0].metadata.plugin_data.content
    ).experiment
    info = {h.name: h for h in exp.hparam_infos}
    assert [v.number_value for v in info["depth"].domain_discrete.values] == [1, 2, 4, 8, 16]
    assert [v.number_value for v in info["batch_size"].domain_discrete.values] == list(BATCHES)
    assert info["width"].domain_interval.min_value == 90
    assert info["width"].domain_interval.max_value == 362
    assert info["learning_rate"].HasField("domain_interval")
    assert info["depth"].type == api_pb2.DATA_TYPE_FLOAT64  # numeric: a range filter and an axis
    assert {m.name.tag for m in exp.metric_infos} >= set(tbmod.MEMBER_DOCS)

    name, _, _, bc = MEMBERS[2]
    member_dir = os.path.join(tb, name, "member")
    events = _events(member_dir)
    start = plugin_data_pb2.HParamsPluginData.FromString(
        _plugin_values(events)[0].metadata.plugin_data.content
    ).session_start_info
    assert start.hparams["width"].number_value == 181 and start.hparams["depth"].number_value == 4
    scalars = {
        v.tag: float(tf.make_ndarray(v.tensor))
        for e in events
        for v in e.summary.value
        if v.tag.startswith("member/")
    }
    members = {r["member"]: r for r in read_csv(os.path.join(wd, "report", "members.csv"))}
    assert scalars["member/b_x"] == pytest.approx(float(members[name]["b_x"]), rel=1e-6)
    assert scalars["member/b_crit"] == pytest.approx(bc, rel=0.05)
    assert scalars["member/b_x_low"] <= scalars["member/b_x"] <= scalars["member/b_x_high"]
    assert scalars["member/b_x_censored"] == 0.0 and scalars["member/eps"] == 0.25


def test_tensorboard_curves_have_an_examples_axis(tmp_path):
    """Each curve again under examples/ at step = examples seen: batches share one axis."""
    pytest.importorskip("tensorboard")
    from wide_tf.engine.summaries import MetricsWriter
    from wide_tf.report import tensorboard as tb

    w = MetricsWriter(str(tmp_path / "trial"), True, "t")
    for step in (5, 10):
        w.scalars("eval", step, {"train_loss": 0.4, "train_accuracy": 0.9})
    w.close()
    session = tmp_path / "session"
    assert tb.copy_curves(str(tmp_path / "trial"), str(session), batch_size=64) == 4
    steps = {}
    for e in _events(str(session / "train_set")):
        for v in e.summary.value:
            steps.setdefault(v.tag, []).append(e.step)
    assert sorted(steps["accuracy"]) == [5, 10]
    assert sorted(steps["examples/accuracy"]) == [320, 640]
