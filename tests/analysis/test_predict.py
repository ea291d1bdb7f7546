"""Tests for wide_tf.analysis.prediction and wide_tf.analysis.predict_study (NumPy only: hand-made
histories and records with known answers), the report's prediction section on a synthetic study,
and the docs/local_agreement.md entry of a study (wide_tf.report.agreement)."""

import math
import pathlib
import sys
import types

import numpy as np
import pytest

from wide_tf.analysis import critical_batch as cb
from wide_tf.analysis import predict_study as ps
from wide_tf.analysis import prediction as pr
from wide_tf.analysis.stats import baseline


def _rec(member="m", width=100, seed=0, batch=16, mult=1.0, steps=100.0, hist=(), **kw):
    rec = {
        "trial_id": f"{member}-b{batch}-m{mult}-s{seed}",
        "member": member,
        "width": width,
        "batch_size": batch,
        "lr_multiplier": mult,
        "seed": seed,
        "status": "reached",
        "steps_to_target": math.ceil(steps),
        "steps_to_target_interp": steps,
        "gradient": {
            "history": [{"step": s, "noise_scale": v, "batch_bound": v + 1} for s, v in hist],
            "noise_scale_ema": None,
        },
    }
    rec.update(kw)
    return rec


# -- one run ------------------------------------------------------------------------------------


def test_at_step_interpolates_in_log_space_and_extrapolates_one_interval_at_most():
    steps, vals = np.array([0.0, 50.0, 100.0]), np.array([10.0, 100.0, 1000.0])
    v, how = pr.at_step(steps, vals, 25.0)
    assert how == pr.INTERPOLATED and v == pytest.approx(math.sqrt(1000.0))  # not 55 (linear)
    assert pr.at_step(steps, vals, 50.0) == (100.0, pr.MEASURED)
    v, how = pr.at_step(steps, vals, 120.0)
    assert how == pr.EXTRAPOLATED and v == pytest.approx(1000.0 * 10 ** (20 / 50))
    assert pr.at_step(steps, vals, 151.0)[0] is None  # more than one interval past the last
    assert pr.at_step(steps[1:], vals[1:], 10.0)[0] is None  # before the first measurement
    assert pr.at_step(np.array([]), np.array([]), 10.0)[0] is None


def test_run_average_is_the_step_weighted_mean_up_to_the_target():
    steps, vals = np.array([0.0, 100.0, 200.0]), np.array([10.0, 30.0, 50.0])
    # trapezoid over [0, 150], the end value log-interpolated (sqrt(30 x 50), not 40):
    # (10 + 30) / 2 x 100 + (30 + sqrt(1500)) / 2 x 50, over 150 steps
    want = (2000.0 + (30.0 + math.sqrt(1500.0)) * 25.0) / 150.0
    assert pr.run_average(steps, vals, 150.0) == pytest.approx(want, rel=1e-9)
    # no measurement at initialisation: no run average
    assert pr.run_average(steps[1:], vals[1:], 150.0) is None


def test_run_noise_reads_the_primary_target_and_skips_bad_points():
    hist = [(0, 10.0), (50, float("nan")), (50, 100.0), (100, 1000.0), (150, -1.0)]
    rec = _rec(steps=75.0, hist=hist)
    rn = pr.run_noise(rec)
    assert rn.at_init == 10.0 and rn.n_measurements == 3
    assert rn.at_target == pytest.approx(10**2.5) and rn.how == pr.INTERPOLATED
    # Several targets: the first one is the primary, whatever the top-level fields say.
    rec["targets"] = [
        {"metric": "train_loss", "status": "reached", "steps_to_target_interp": 50.0},
        {"metric": "train_accuracy", "status": "reached", "steps_to_target_interp": 75.0},
    ]
    assert pr.run_noise(rec).at_target == pytest.approx(100.0)
    # Re-aimed at the second target (analysis.cells.records_for_target names it in "target").
    rec["target"] = {"metric": "train_accuracy", "value": 0.99}
    rec["targets"][1]["value"] = 0.99
    assert pr.run_noise(rec).at_target == pytest.approx(10**2.5)
    del rec["target"]
    rec["targets"][0]["status"] = "not_reached"
    assert pr.run_noise(rec) is None
    assert pr.run_noise(_rec(status="diverged")) is None


# -- intervals ----------------------------------------------------------------------------------


def test_geometric_mean_and_t_interval_on_logs():
    e = pr.geometric([1.0, math.exp(2.0)])
    # logs 0 and 2: mean 1, sd sqrt(2), se 1, t(1 df) = 12.706
    assert e.value == pytest.approx(math.e) and e.se_log == pytest.approx(1.0)
    assert math.log(e.high) - 1 == pytest.approx(12.7062, rel=1e-4)
    one = pr.geometric([5.0, None, -1.0])
    assert one.value == pytest.approx(5.0) and one.low is None and one.n == 1
    assert pr.geometric([]) is None


def test_ratio_combines_both_intervals_and_refuses_a_bound():
    pred = pr.geometric([100.0, 100.0 * math.exp(0.2), 100.0 * math.exp(-0.2)])
    measured = cb.Interval(value=50.0, low=50.0 * math.exp(-0.3), high=50.0 * math.exp(0.3))
    r = pr.ratio(pred, measured)
    assert r.value == pytest.approx(2.0)
    se_p = (math.log(pred.high) - math.log(pred.low)) / (2 * pr.Z95)
    se_m = 0.6 / (2 * pr.Z95)
    assert r.se_log == pytest.approx(math.hypot(se_p, se_m))
    assert r.low < 2.0 < r.high
    bound = cb.Interval(value=1024.0, low=600.0, high=None, above_range=True, high_open=True)
    rb = pr.ratio(pred, bound)
    assert rb.value == pytest.approx(100 / 1024) and rb.low is None


def test_agreement_words_follow_the_interval():
    assert "factor of 2" in pr.agreement_words(pr.Estimate(1.2, 0.8, 1.7, 0.1, 3))
    assert "order of magnitude" in pr.agreement_words(pr.Estimate(3.0, 0.9, 9.0, 0.1, 3))
    assert "underestimate" in pr.agreement_words(pr.Estimate(0.01, 0.005, 0.03, 0.1, 3))
    assert "overestimate" in pr.agreement_words(pr.Estimate(40.0, 20.0, 90.0, 0.1, 3))
    assert "not resolved" in pr.agreement_words(pr.Estimate(1.0, 0.05, 20.0, 0.1, 3))


def test_width_slope_is_the_random_effects_slope_of_the_logs():
    widths = [50.0, 100.0, 200.0, 400.0]
    # B_simple exactly proportional to width^0.5, seed spread 0.1 in log: slope 0.5, tight
    ests = [pr.Estimate(10 * w**0.5, None, None, 0.1, 3) for w in widths]
    sl = pr.width_slope(widths, ests)
    assert sl.value == pytest.approx(0.5) and sl.low < 0.5 < sl.high and sl.n_members == 4
    # A member off the line by far more than its seed error widens the interval (tau^2 > 0).
    off = list(ests)
    off[1] = pr.Estimate(ests[1].value * 4, None, None, 0.1, 3)
    wide = pr.width_slope(widths, off)
    assert wide.tau2 > 0 and wide.high - wide.low > 5 * (sl.high - sl.low)
    # Fewer than three members with a seed interval: no slope.
    assert pr.width_slope(widths[:3], ests[:2] + [pr.Estimate(5.0, None, None, None, 1)]) is None


# -- members against the sweep --------------------------------------------------------------------


def _summary(name, width, b_crit, batches=(16, 64), best=1.0, model_free=None):
    cells = tuple(
        types.SimpleNamespace(batch_size=b, best_multiplier=best if b == batches[0] else 1.0)
        for b in batches
    )
    curve = types.SimpleNamespace(b_crit=b_crit)
    info = types.SimpleNamespace(name=name, width=width, depth=1)
    return types.SimpleNamespace(info=info, cells=cells, curve=curve, b_model_free=model_free)


def test_member_prediction_uses_the_chosen_rate_of_the_smallest_batch_on_every_seed():
    recs = []
    for seed, top in enumerate((100.0, 200.0, 400.0)):
        recs.append(_rec(seed=seed, hist=[(0, 10.0), (100, top)], steps=100.0))
    # Another rate of the same cell and another batch must not count.
    recs.append(_rec(seed=0, mult=2.0, hist=[(0, 10.0), (100, 9999.0)]))
    recs.append(_rec(seed=0, batch=64, hist=[(0, 10.0), (100, 9999.0)]))
    b_crit = cb.Interval(value=100.0, low=80.0, high=125.0)
    model_free = cb.Interval(value=50.0, low=40.0, high=62.5)
    m = pr.member_prediction(_summary("m", 100, b_crit, model_free=model_free), recs)
    assert m.batch_size == 16 and len(m.runs) == 3
    assert m.at_target.value == pytest.approx(200.0) and m.at_target.n == 3
    assert m.ratio_b_crit.value == pytest.approx(2.0)
    assert m.at_init.value == pytest.approx(10.0)
    assert m.ratio_model_free.value == pytest.approx(4.0)
    assert pr.member_prediction(_summary("m", 100, b_crit), recs).ratio_model_free is None


def test_compare_says_what_to_set_when_the_cadence_was_off():
    recs = [_rec(hist=[(0, 10.0)])]  # initialisation only: the local study's default
    c = pr.compare(
        recs,
        [_summary("m", 100, None)],
        {"train": {"gradient_every_examples": 0, "eval_every_examples": 360}},
    )
    assert not c.has_history
    text = pr.sentence(c)
    assert "train.gradient_every_examples" in text and "=360" in text


def test_sentence_reports_the_pooled_ratio_of_a_sweep():
    recs, sums = [], []
    for k, (w, bc) in enumerate(((50, 100.0), (100, 200.0), (200, 400.0))):
        name = f"m{k}"
        for seed in range(3):
            top = 20.0 * bc * (1.0 + 0.05 * seed)  # 20x the measured B_crit
            recs.append(_rec(member=name, width=w, seed=seed, hist=[(0, 5.0), (100, top)]))
        sums.append(_summary(name, w, cb.Interval(value=bc, low=0.8 * bc, high=1.25 * bc)))
    c = pr.compare(recs, sums, None)
    assert c.sweep and c.has_history
    assert c.pooled_ratio.value == pytest.approx(20.0 * (1.05 * 1.10) ** (1 / 3))
    assert "overestimate by more than 10x" in pr.sentence(c)


# -- the predict study and its cost --------------------------------------------------------------


def test_against_constant_on_a_hand_made_example():
    """B_crit 10, 100 and 1000; the noise scale 2x each: it misses every member by exactly 2x
    (and by 1x with its mean ratio divided out), while the constant (the geometric mean, 100)
    misses by 10x, 1x and 10x: RMS in log sqrt(2/3) log 10, a factor of 6.55. With three members
    the bootstrap cannot resolve which is closer; with eight (B_crit doubling, the noise scale
    2x each) it can: the noise scale."""
    k = baseline.against_constant([20.0, 200.0, 2000.0], [10.0, 100.0, 1000.0], n_boot=400)
    assert k.n == 3 and k.constant_value == pytest.approx(100.0)
    assert k.noise_scale.value == pytest.approx(2.0)
    assert k.rescaled.value == pytest.approx(1.0)
    assert k.constant.value == pytest.approx(math.exp(math.sqrt(2 / 3) * math.log(10)))
    assert k.difference[0] == pytest.approx(math.log(2) - math.sqrt(2 / 3) * math.log(10))
    # Resamples of three members can repeat one member (constant exact): the difference's upper
    # end is then log 2 - 0 > 0, so the interval is only as decisive as the members allow.
    assert k.difference[1] < 0
    text = pr.constant_sentence(k)
    assert "by a factor of 2 (2 to 2)" in text and "by 6.55 (" in text
    assert k.closer == "not resolved" and "not resolved" in text
    b = [10.0 * 2**i for i in range(8)]
    eight = baseline.against_constant([2 * x for x in b], b, n_boot=400)
    assert eight.closer == "noise scale" and eight.difference[2] < 0
    # A noise scale whose errors (3x, 1/3x, 3x) exceed a constant on nearly flat B_crit.
    far = baseline.against_constant([150.0, 33.3, 330.0], [50.0, 100.0, 110.0], n_boot=400)
    assert far.noise_scale.value > far.constant.value and far.closer != "noise scale"
    assert baseline.against_constant([1.0, 2.0], [1.0, 2.0]) is None


def test_as_predict_config_follows_the_local_config():
    from configs import mlp

    local, pred = mlp.get_config("local"), mlp.get_config("predict")
    assert pred.sweep.batch_sizes == (min(local.sweep.batch_sizes),)
    assert pred.sweep.family.to_dict() == local.sweep.family.to_dict()
    assert (pred.train.target_metric, pred.train.target_value) == (
        local.train.target_metric,
        local.train.target_value,
    )
    assert len(pred.sweep.seeds) + len(pred.sweep.confirm_seeds) == 3
    assert pred.train.gradient_every_examples == local.train.eval_every_examples > 0
    assert pred.train.gradient_at_init and pred.sweep.max_lr_extensions <= 1


def test_as_predict_config_measures_once_an_epoch_and_caps_the_probe():
    from configs import mlp

    cfg = mlp.get_config("paper")  # TFDS MNIST: 60,000 training digits, probe_size 0 (all)
    cfg.train.eval_every_examples = 0
    pred = ps.as_predict_config(cfg, batch=128, seeds=2)
    assert pred.train.gradient_every_examples == 60000
    assert pred.train.probe_size == ps.PROBE_CAP
    assert pred.sweep.batch_sizes == (128,) and len(pred.sweep.confirm_seeds) == 1
    with pytest.raises(ValueError):
        ps.as_predict_config(mlp.get_config("single"))  # no sweep


def test_plan_counts_runs_and_examples_by_hand():
    from configs import mlp

    cfg = mlp.get_config("smoke")  # 2 members, batches 32 and 256, one rate, no extension
    p = ps.plan(cfg, num_train=1000)
    assert (p.runs_min, p.runs_max) == (4, 4)
    # 3 epochs of 1,000 examples; the step floor min_steps is 0 here
    steps = {32: math.ceil(3000 / 32), 256: math.ceil(3000 / 256)}
    assert p.examples_max == 2 * sum(s * b for b, s in steps.items())
    lo, hi = p.chip_hours()
    assert 0 < lo < hi and hi / lo == pytest.approx(5.0)
    cfg.sweep.family.kind, cfg.sweep.family.widths = "width", [8, 16, 32]
    assert ps.plan(cfg, num_train=1000).members == 3


# -- the report section on a synthetic study ----------------------------------------------------


def _synthetic_sweep():
    """tests/report/test_report.py's synthetic sweep (MEMBERS, make_records, make_workdir), also
    when this file runs without tests/report collected (pytest puts a test's own folder on
    sys.path, not its siblings)."""
    folder = str(pathlib.Path(__file__).resolve().parents[1] / "report")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import test_report

    return test_report.MEMBERS, test_report.make_records, test_report.make_workdir


def test_report_has_the_prediction_section_and_plot(tmp_path):
    """A synthetic sweep (test_report's, whose members' B_crit are known) whose runs measured
    B_simple rising to 2 x the member's B_crit at the target: the section says so and the
    log-log plot is written."""
    MEMBERS, make_records, make_workdir = _synthetic_sweep()

    from wide_tf import report

    bc = {name: b for name, _, _, b in MEMBERS}
    recs = make_records()
    for r in recs:
        if r["status"] != "reached":
            continue
        s = float(r["steps_to_target"])
        top = 2.0 * bc[r["member"]] * (1.0 + 0.02 * r["seed"])
        r["gradient"]["history"] = [
            {"step": k * s / 4, "noise_scale": 5.0 * (top / 5.0) ** (k / 4)} for k in range(5)
        ]
    wd = str(tmp_path / "study")
    make_workdir(wd, recs)
    md = open(report.write_report(wd)).read()
    section = md.split("## Does the gradient noise scale predict the critical batch?")[1]
    # The section speaks of this study only: the local sweeps' agreement is docs/local_agreement.md.
    assert "What the prediction has been worth" not in md and "earlier configs" not in md
    section = section.split("\n## ")[0]
    assert "times the measured B_crit" in section
    ratios = [row.split("|")[10].strip() for row in section.splitlines() if row.startswith("| mlp")]
    assert len(ratios) == len(MEMBERS)
    for cell in ratios:  # about 2 (the fitted B_crit is close to the true one here)
        assert 1.5 < float(cell.split()[0]) < 2.7, cell
    assert (tmp_path / "study" / "report" / "noise_scale_vs_b_crit.png").stat().st_size > 1000


def test_report_without_history_says_what_to_set(tmp_path):
    _, make_records, make_workdir = _synthetic_sweep()

    from wide_tf import report

    recs = make_records(history=False)
    wd = str(tmp_path / "study")
    make_workdir(wd, recs)
    md = open(report.write_report(wd)).read()
    section = md.split("## Does the gradient noise scale predict the critical batch?")[1]
    assert "train.gradient_every_examples" in section.split("\n\n")[1]
    assert not (tmp_path / "study" / "report" / "noise_scale_vs_b_crit.png").exists()


def test_predict_configs_pass_validation(tmp_path):
    from wide_tf.checks import loader, validate

    for spec in ("configs/mlp.py:predict", "configs/wrn.py:predict_local"):
        validate.check_config(loader.load_config(spec))
    # TFDS CIFAR-10: a folder that looks prepared to the check (as test_errors does).
    info = tmp_path / "cifar10" / "3.0.0" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text("{}")
    config = loader.load_config("configs/wrn.py:predict")
    config.data.data_dir = str(tmp_path)
    validate.check_config(config)
    paper = loader.load_config("configs/wrn.py")
    assert config.sweep.batch_sizes == (min(paper.sweep.batch_sizes),)
    assert config.train.probe_size == paper.train.probe_size


def test_configs_load_the_predict_study_without_the_prediction_or_tensorflow():
    """configs/*.py import only `predict_study` (the config transform and its cost plan), which
    pulls neither the prediction's numbers, SciPy nor TensorFlow."""
    import subprocess
    import sys

    code = (
        "import sys, configs.mlp, configs.wrn; "
        "print(sorted(m for m in ('tensorflow', 'scipy', 'wide_tf.analysis.prediction', "
        "'wide_tf.report') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_analysis_never_imports_the_report():
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "wide_tf" / "analysis"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.startswith("wide_tf.report") for n in names), (path, names)


def test_agreement_entry_lists_the_pooled_ratios_and_every_member():
    from wide_tf.report import agreement

    recs, sums = [], []
    for name, w, bc in (("a", 64, 50.0), ("b", 128, 60.0), ("c", 256, 70.0)):
        for seed, f in enumerate((1.0, 1.1, 1.2)):
            recs.append(_rec(member=name, width=w, seed=seed, hist=[(0, 5.0), (100, 2 * bc * f)]))
        sums.append(_summary(name, w, cb.Interval(value=bc, low=0.8 * bc, high=1.25 * bc)))
    c = pr.compare(recs, sums, None)
    lines = agreement.entry_lines(c, "the study", "run here")
    assert lines[0].startswith("**the study** (run here): B_simple at the target / B_crit, pooled")
    assert pr.fmt_est(c.pooled_ratio, "member") in lines[0]
    assert lines[2] == agreement.ROW_HEADER and lines[-1] == ""
    rows = [x for x in lines if x.startswith("| ") and x != agreement.ROW_HEADER]
    assert [r.split(" | ")[0] for r in rows] == ["| a", "| b", "| c"]
    assert rows[0].split(" | ")[2] == pr.fmt_est(c.members[0].at_target)


def test_docs_keep_the_local_agreement_with_its_sources():
    import pathlib

    docs = pathlib.Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "local_agreement.md").read_text()
    from wide_tf.report import agreement

    assert text.count(agreement.ROW_HEADER) == 3  # the three local studies measured so far
    assert "docs/local_agreement.md" in (docs / "prediction.md").read_text()
