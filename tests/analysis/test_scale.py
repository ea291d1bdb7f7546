"""The design simulation's scale: the narrowest member's B_crit and S_min and the noise, given or
read off a finished study, applied to every generator and named in every table."""

import json
import math

import numpy as np

from wide_tf.analysis import seed_variance, simulate
from wide_tf.analysis.stats import generators as gen
from wide_tf.analysis.stats import scale as scale_lib


def test_a_given_scale_places_the_narrowest_members_curve():
    design = simulate.Design()
    sc = scale_lib.Scale(b_crit_ref=70.0, s_min=120.0, source="test")
    truth = sc.apply(gen.GENERATORS["overhead"], design.num_train)
    mems = simulate.members_of(design, truth, np.random.default_rng(0))
    narrowest = min(mems, key=lambda m: m.width)
    assert narrowest.b_crit == 70.0
    # S_min is shared but for the overhead generator's deepest (the narrowest here), x3.
    assert math.isclose(narrowest.s_min, 360.0)
    assert math.isclose(max(mems, key=lambda m: m.width).s_min, 120.0)
    assert truth.overhead_steps == 10.0  # the generator's own deviation is kept
    line = sc.line(design.num_train)
    assert "B_crit 70 examples, S_min 120 steps (test)" in line
    # The reference: 30 examples and 2 epochs of n / B_crit.
    ref = scale_lib.Scale().line(1438)
    assert "B_crit 30 examples, S_min 95.9 steps (the simulator's reference)" in ref


def test_a_studys_noise_replaces_only_the_default_noise():
    noise = type("N", (), dict(sigma=0.2, seed_share=0.25, cell_sd=0.05, line=lambda s: "n"))()
    sc = scale_lib.Scale(noise=noise)
    fitted = sc.apply(gen.GENERATORS["fitted"], 1438)
    assert math.isclose(math.hypot(fitted.noise, fitted.seed_effect), 0.2)
    assert math.isclose(fitted.seed_effect**2 / 0.2**2, 0.25) and fitted.cell_effect == 0.05
    pessimistic = sc.apply(gen.GENERATORS["pessimistic noise"], 1438)
    assert pessimistic.cell_effect == 0.1  # a generator defined by its noise keeps it


def test_the_scale_is_read_off_a_finished_study(tmp_path):
    design = simulate.Design()
    truth = gen.Truth(b_crit_ref=60.0, epochs_small_batch=60.0 * 100.0 / design.num_train)
    recs = simulate.simulate_study(np.random.default_rng(3), design, truth)
    (tmp_path / "results").mkdir()
    for i, r in enumerate(recs):
        (tmp_path / "results" / f"{i}.json").write_text(json.dumps(r))
    noise = seed_variance.summarize(seed_variance.read_records(str(tmp_path)))
    sc = scale_lib.scale_from(str(tmp_path), simulate._summaries_of(str(tmp_path)), noise)
    assert 35.0 < sc.b_crit_ref < 100.0 and 70.0 < sc.s_min < 140.0
    assert 0.08 < sc.noise.sigma < 0.25
    assert "read off" in sc.source and "sim-d12-w64" in sc.source


def test_the_command_line_names_its_scale_and_leaves_the_registry_alone(capsys):
    before = dict(gen.GENERATORS)
    args = ["--studies=1", "--bootstrap=20", "--generators=fitted", "--power_for=none"]
    assert simulate.main(args + ["--b_crit_ref=50", "--s_min=80"]) == 0
    out = capsys.readouterr().out
    assert out.count("Scale: the narrowest member's B_crit 50 examples, S_min 80 steps") == 2
    assert gen.GENERATORS == before
    assert simulate.main(args + ["--scale_from=/nowhere", "--b_crit_ref=50"]) == 2
    assert "drop --b_crit_ref" in capsys.readouterr().err
    assert simulate.main(args + ["--scale_from=/nowhere"]) == 2
    assert "give a finished study's workdir" in capsys.readouterr().err


def test_the_check_level_flag_applies_to_the_run_only(capsys, monkeypatch):
    """--heaviest_level sets the rule's check level for the simulated studies (what the level
    costs and buys: docs/results/calibration.md) and puts the rule's own back afterwards."""
    from wide_tf.analysis import decision

    seen = []
    monkeypatch.setattr(
        simulate, "table", lambda *a, **k: seen.append(decision.HEAVIEST_LEVEL) or []
    )
    rule = decision.HEAVIEST_LEVEL
    assert simulate.main(["--studies=1", "--generators=fitted", "--heaviest_level=0.85"]) == 0
    assert seen == [0.85] and decision.HEAVIEST_LEVEL == rule != 0.85
    assert "at 85% (not the rule's)" in capsys.readouterr().out
    assert simulate.main(["--studies=1", "--generators=fitted"]) == 0
    assert seen == [0.85, rule]
