"""Tests for wide_tf.theory (bound, report, check): analytic per-example gradients vs finite
differences, budgets, the study."""

import csv
import importlib.util
import io
import os

import numpy as np
import pytest

from wide_tf.theory import bound, runner

CONFIG_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "theory.py")


def _load_config(arg=None):
    spec = importlib.util.spec_from_file_location("theory_config", CONFIG_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


@pytest.mark.parametrize("kind,depth", [("linear", 2), ("relu", 2), ("linear", 4), ("relu", 3)])
def test_analytic_per_example_gradients_match_finite_differences(kind, depth):
    rng = np.random.default_rng(0)
    d, w, n = 5, 4, 3
    weights = bound.init_weights(rng, kind, d, depth, w)
    x = rng.normal(size=(n, d))
    y = rng.normal(size=n)
    grads = bound.per_example_gradients(weights, kind, x, y)
    eps = 1e-6
    for i in range(n):
        for layer, wmat in enumerate(weights):
            fd = np.zeros_like(wmat)
            for idx in np.ndindex(wmat.shape):
                old = wmat[idx]
                wmat[idx] = old + eps
                up = bound.loss(weights, kind, x[i : i + 1], y[i : i + 1])
                wmat[idx] = old - eps
                down = bound.loss(weights, kind, x[i : i + 1], y[i : i + 1])
                wmat[idx] = old
                fd[idx] = (up - down) / (2 * eps)
            np.testing.assert_allclose(grads[layer][i], fd, rtol=1e-5, atol=1e-8)
    # The fast norms agree with the explicit gradients.
    sq, total = bound.gradient_norms(weights, kind, x, y)
    flat = np.concatenate([g.reshape(n, -1) for g in grads], axis=1)
    np.testing.assert_allclose(sq, np.sum(flat**2, axis=1), rtol=1e-12)
    np.testing.assert_allclose(total, np.sum(flat.sum(axis=0) ** 2), rtol=1e-12)


def test_analytic_gradients_match_tensorflow_jacobian():
    import tensorflow as tf

    rng = np.random.default_rng(1)
    weights = bound.init_weights(rng, "relu", 4, 3, 5)
    x, y = rng.normal(size=(6, 4)), rng.normal(size=6)
    ws = [tf.Variable(w) for w in weights]
    with tf.GradientTape() as tape:
        h = tf.constant(x)
        for layer, w in enumerate(ws):
            h = tf.matmul(h, w, transpose_b=True)
            if layer < len(ws) - 1:
                h = tf.nn.relu(h)
        losses = 0.5 * (h[:, 0] - y) ** 2
    jac = tape.jacobian(losses, ws)
    for got, want in zip(bound.per_example_gradients(weights, "relu", x, y), jac):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_param_count_and_budget_width():
    assert bound.param_count(32, 2, 10) == 32 * 10 + 10
    assert bound.param_count(32, 4, 10) == 320 + 2 * 100 + 10
    for depth in (2, 3, 6, 12):
        w = bound.width_for_budget(32, depth, 16384)
        best = min(range(1, 2000), key=lambda c: abs(bound.param_count(32, depth, c) - 16384))
        assert abs(bound.param_count(32, depth, w) - 16384) == abs(
            bound.param_count(32, depth, best) - 16384
        )


def test_batch_bound_draw_identical_examples_gives_one():
    """With one distinct example repeated, every g_i is equal: batch bound exactly 1."""
    rng = np.random.default_rng(0)
    weights = bound.init_weights(rng, "linear", 3, 3, 4)
    x = np.tile(rng.normal(size=(1, 3)), (5, 1))
    sq, total = bound.gradient_norms(weights, "linear", x, np.ones(5))
    assert 5 * sq.sum() / total == pytest.approx(1.0)


def test_trend_slopes_with_intervals():
    # n = 1 and q = 1: the per-draw batch bound is s1 itself.
    mk = lambda vals: bound.Point(
        "width", "linear", 2, 1, 1, 1, np.asarray(vals, float), np.ones(len(vals))
    )
    up = [mk([1.0, 1.1, 0.9]), mk([2.0, 2.1, 1.9]), mk([4.0, 4.1, 3.9])]
    t = bound.trend([1, 2, 4], up)
    assert t.slope == pytest.approx(1.0, abs=0.01) and t.word == "grows" and t.low > 0.8
    assert t.fold == pytest.approx(4.0, rel=0.02) and t.x_range == 4
    assert bound.trend([1, 2, 4], up[::-1]).word == "falls"
    noisy = [mk([1.0, 3.0, 0.5, 2.0]), mk([1.5, 0.2, 3.0, 1.0])]
    assert bound.trend([1, 2], noisy).word == "shows no detectable trend"
    assert bound.trend([1, 2, 4], up, "ratio").word == "grows"
    assert bound.trend([1, 2, 4], up, "mean").slope == pytest.approx(1.0, abs=0.01)
    # A heavy tail moves the mean, not the median.
    tail = [mk([1.0, 1.0, 1.0, 1.0]), mk([1.0, 1.0, 1.0, 400.0])]
    assert (
        bound.trend([1, 2], tail, "mean").slope > 4
        and bound.trend([1, 2], tail, "median").slope == 0
    )
    p = bound.Point("width", "linear", 2, 1, 1, 4, np.array([1.0, 3.0]), np.array([2.0, 6.0]))
    assert p.mean == pytest.approx(2.0) and p.ratio == pytest.approx(4 * 2.0 / 4.0)


def test_smoke_study_writes_report(tmp_path):
    config = _load_config("smoke")
    assert config.kind == "theory"
    out = runner.run_theory(config, str(tmp_path))
    report = tmp_path / "report"
    md = (report / "theory.md").read_text()
    rows = list(csv.DictReader(io.StringIO((report / "theory.csv").read_text())))
    assert (report / "theory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    n_points = (
        3 * len(config.theory.widths)
        + 2 * 2 * len(config.theory.depths)
        + 2 * len(config.theory.input_dims)
    )
    assert len(rows) == n_points == len(out["points"])
    assert (
        out["verdict"] in md
        and "## Fixed parameter budget" in md
        and "## Input-dimension sweep" in md
    )
    # Every scored curve has a slope with an interval, the 2-layer ReLU case included.
    assert set(out["summary"]["width"]) == {"2-layer linear", "2-layer ReLU", "3-layer linear"}
    for by_label in out["summary"].values():
        for stats in by_label.values():
            for t in stats.values():
                assert t.low <= t.slope <= t.high
    assert (
        "slope" in out["verdict"]
        and "x over a" in out["verdict"]
        and "input dimension" in out["verdict"]
    )
    dims = sorted({int(r["input_dim"]) for r in rows if r["sweep"] == "input_dim"})
    assert dims == [3, 6, 12]
    for r in rows:
        assert (
            float(r["median_ci95_low"])
            <= float(r["batch_bound_median"])
            <= float(r["median_ci95_high"])
        )
    for r in rows:
        assert float(r["ci95_low"]) <= float(r["batch_bound_mean"]) <= float(r["ci95_high"])
        assert float(r["batch_bound_mean"]) >= 1.0  # batch bound >= 1 always (Cauchy-Schwarz)
        assert int(r["params"]) == bound.param_count(
            int(r["input_dim"]), int(r["depth"]), int(r["width"])
        )
    budget = [r for r in rows if r["sweep"] == "budget"]
    assert all(
        abs(int(r["params"]) - config.theory.budget) < 0.25 * config.theory.budget for r in budget
    )
    # Deterministic given the seed.
    again = bound.run_points(config.theory)
    assert [p.mean for p in again] == [p["batch_bound_mean"] for p in out["points"]]
    for r in rows:
        assert (
            float(r["ratio_ci95_low"])
            <= float(r["ratio_of_expectations"])
            <= float(r["ratio_ci95_high"])
        )


def test_default_config_is_sane():
    config = _load_config()
    t = config.theory
    assert config.kind == "theory" and t.n_inits >= 100 and 2 in t.depths
    with pytest.raises(ValueError):
        _load_config("nope")
