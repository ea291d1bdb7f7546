"""The noise summary (`wide_tf.analysis.calibration`) recovers a generator's noise from its
records, and the default generator reproduces what the local studies measure on each design they ran
(`generators.MEASURED`), while the earlier assumed noise does not. NumPy only."""

import math

import numpy as np
import pytest

from wide_tf.analysis import calibration, simulate
from wide_tf.analysis.stats import generators as gen

LOCAL7 = "configs/mlp.py:local7"  # the design of two of the measured studies


def test_the_summary_recovers_a_generators_seed_noise_and_its_shared_part():
    """Seed noise 0.2, half of its variance shared by a seed across batch sizes, no cell effect
    and no learning-rate luck (a flat response, the optimum on the grid)."""
    truth = gen.Truth(
        noise=0.2 * math.sqrt(0.5),
        seed_effect=0.2 * math.sqrt(0.5),
        cell_effect=0.0,
        lr_curvature=0.0,
        lr_opt_spread=0.0,
    )
    s = calibration.simulated(LOCAL7, 12, seed=3, truth=truth)
    assert s.sigma == pytest.approx(0.2, abs=0.015)
    assert s.seed_share == pytest.approx(0.5, abs=0.12)
    assert s.cell_sd < 0.03


def test_the_summary_recovers_a_cell_effect():
    """A cell effect of 0.1 beside unshared seed noise 0.14: read back, and F well above 1."""
    truth = gen.Truth(
        noise=0.14, seed_effect=0.0, cell_effect=0.1, lr_curvature=0.0, lr_opt_spread=0.0
    )
    s = calibration.simulated(LOCAL7, 12, seed=4, truth=truth)
    assert s.cell_sd == pytest.approx(0.1, abs=0.025)
    assert s.f > 3 and s.seed_share < 0.15  # a share floored at 0 per member reads a little high


@pytest.mark.parametrize("config", sorted({c for c, _, _ in gen.MEASURED}))
def test_the_default_generator_reproduces_the_measured_noise(config):
    """On each design the local studies ran, simulated studies read as the real ones were fall
    within the measured range (a little wider: the real studies are few), field by field."""
    real = [m for c, _, m in gen.MEASURED if c == config]
    tol = dict(sigma=0.01, cell_sd=0.012, f=0.3, seed_share=0.08, lr_curv=0.1)
    s = calibration.simulated(config, 20, seed=5)
    for field, t in tol.items():
        lo, hi = min(m[field] for m in real), max(m[field] for m in real)
        assert lo - t <= getattr(s, field) <= hi + t, (field, getattr(s, field), lo, hi)


def test_the_earlier_assumed_noise_is_far_from_the_measured():
    old = calibration.simulated(LOCAL7, 10, seed=6, truth=gen.GENERATORS["pessimistic noise"])
    measured = [m for c, _, m in gen.MEASURED if c == LOCAL7]
    assert old.f > 2 * max(m["f"] for m in measured)
    assert old.lr_curv > max(m["lr_curv"] for m in measured) + 0.3


def test_the_summary_of_records_and_its_bad_inputs(tmp_path, capsys):
    rng = np.random.default_rng(0)
    recs = simulate.simulate_study(rng, simulate.design_from_config(LOCAL7), gen.Truth())
    s = calibration.summarize(recs)
    assert 0.08 < s.sigma < 0.25 and s.n_cells > 10
    assert calibration.main([]) == 2
    assert calibration.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no results/*.json" in err and "give a finished study's workdir" in err
    with pytest.raises(ValueError, match="no member"):
        calibration.summarize([])
