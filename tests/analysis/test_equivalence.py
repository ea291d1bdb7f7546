"""The four-outcome reading: "no detectable effect" only under a margin stated in advance with
the design's power and size, else "inconclusive"; the noise-free margin; the rule's error rates
measured on simulated studies with a known answer (`analysis/rule_power.py`). NumPy and SciPy
only; seconds."""

import dataclasses
import json

import numpy as np
import pytest
from test_analysis import family

from wide_tf.analysis import decision as D
from wide_tf.analysis import equivalence as E
from wide_tf.analysis import rule_power, simulate
from wide_tf.analysis import verdict as A
from wide_tf.analysis.stats import generators as gen


def test_noise_free_margin_grows_with_the_effect_and_is_zero_without_it():
    widths, batches = (0.25, 0.36, 0.53, 0.79), (32, 128, 512, 1000)
    assert E.noise_free_slope(213, widths, batches, alpha=0.0) == pytest.approx(0.0, abs=1e-9)
    m5 = E.noise_free_slope(213, widths, batches, alpha=0.5)
    m1 = E.noise_free_slope(213, widths, batches, alpha=1.0)
    assert 0.2 < m5 < 0.5 < m1  # B_x2 grows a little more slowly than B_crit here
    # A B_x past the largest batch enters at that batch: the margin cannot exceed what the
    # batches can show.
    assert E.noise_free_slope(5000, widths, batches, alpha=1.0) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        E.noise_free_slope(213, (1.0, 1.0), batches)


def test_reading_needs_a_margin_stated_in_advance_and_a_design_that_can_say_it():
    ok = E.Equivalence(0.3, power_null=0.85, size_margin=0.04)
    assert E.reading(-0.1, 0.2, ok) is None
    assert "no equivalence margin" in E.reading(-0.1, 0.2, None)
    assert "past the equivalence margin +0.30" in E.reading(-0.1, 0.35, ok)
    weak = dataclasses.replace(ok, power_null=0.63)
    assert "63%, below 80%" in E.reading(-0.1, 0.2, weak)
    loose = dataclasses.replace(ok, size_margin=0.09)
    assert "above 5%" in E.reading(-0.1, 0.2, loose)
    assert "not simulated" in E.reading(-0.1, 0.2, E.Equivalence(0.3))
    # A depth axis: the paper predicts a negative slope, so the lower end is checked.
    assert E.reading(-0.2, 0.5, ok, sign=-1) is None
    assert E.reading(-0.4, 0.1, ok, sign=-1) is not None
    with pytest.raises(ValueError):
        E.Equivalence(0.0)
    assert E.Equivalence.from_dict(ok.to_dict()) == ok and E.Equivalence.from_dict(None) is None


def test_the_rule_gives_four_outcomes_and_no_effect_only_by_design():
    rng = np.random.default_rng(3)
    flat = family(0.0, 0.05, rng)
    eq = E.Equivalence(1.0, 0.9, 0.01)
    assert A.analyze(flat, n_boot=40)["verdicts"]["mlp"].outcome == D.INCONCLUSIVE
    assert A.analyze(flat, n_boot=40, equivalence=eq)["verdicts"]["mlp"].outcome == D.NO_EFFECT
    tight = E.Equivalence(0.01, 0.9, 0.01)
    v = A.analyze(flat, n_boot=40, equivalence=tight)["verdicts"]["mlp"]
    assert v.outcome == D.INCONCLUSIVE and "past the equivalence margin" in v.text
    up = A.analyze(family(1.0, 0.05, rng), n_boot=40, equivalence=eq)["verdicts"]["mlp"]
    assert up.outcome == D.SUPPORTED
    assert D.HEAVIEST_LEVEL == 0.95


SMALL = simulate.Design(
    widths=(0.25, 0.3, 0.36, 0.44, 0.53, 0.79),
    depths=(52, 40, 28, 22, 16, 10),
    batch_sizes=(32, 128, 512, 1000),
    tuning_seeds=(0, 1),
    confirm_seeds=(2, 3),
    num_train=8000,
    max_epochs=20.0,
    min_steps=600,
    eval_every_examples=800,
)


def test_rule_power_on_simulated_studies_with_a_known_answer():
    """Studies drawn with a known truth: under the null the rule is rarely decisive and the
    equivalence reading (margin 1) says no effect in most; with B_crit ~ width^2 it
    says 'supported' in most and never "no detectable effect"."""
    truth = gen.Truth(b_crit_ref=213.0, epochs_small_batch=213 * 65 / 8000)
    # A wide margin: the counts, not this small design's width, are under test.
    margin = 1.0
    truths = [("null", truth), ("strong", dataclasses.replace(truth, alpha=2.0))]
    null, strong = rule_power.run(SMALL, truths, 12, margin, n_boot=30, seed=1)
    assert null.n == strong.n == 12
    assert null.decisive[0.95] <= 2 and null.decisive[0.95] <= null.decisive[0.85]
    assert null.no_effect >= 6
    assert strong.decisive[0.85] >= 10 and strong.supported >= 6 and strong.no_effect == 0
    s = rule_power.summary([null, strong])
    assert s["size_margin"] == 0 and s["power_null"] is None  # no truth named "fitted"
    rows = rule_power.table([null, strong])
    assert len(rows) == 4 and rows[2].startswith("| null |")


def test_rule_power_command_line(capsys, tmp_path):
    out = tmp_path / "r.json"
    args = ["--config=configs/mlp.py:smoke", "--s_min=40", "--studies=1", "--bootstrap=20"]
    assert rule_power.main(args + ["--b_crit_ref=20", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert "Equivalence margin" in text and "| widest x1.8 |" in text
    assert out.exists()
    assert json.loads(out.read_text())["margin"] != 0.123
    # A frozen design's margin, checked at another scale, is read as given.
    assert rule_power.main(args + ["--b_crit_ref=20", "--margin=0.123", f"--json={out}"]) == 0
    assert "Read at the given margin (--margin): 0.123" in capsys.readouterr().out
    assert json.loads(out.read_text())["margin"] == 0.123
    assert rule_power.main(args + ["--b_crit_ref=20", "--generators=nope"]) == 2
    assert "error: --generators=nope" in capsys.readouterr().err
    assert rule_power.main(args + ["--b_crit_ref=5000"]) == 2  # past every batch: no margin
    assert "moves no member's B_x2 inside the batches" in capsys.readouterr().err
