"""Tests of wide_tf.analysis.stats against independent computations: the random-effects
meta-regression (REML by brute force on its textbook likelihood, DerSimonian-Laird through the
explicit projection matrix, Knapp-Hartung through a plain weighted least-squares solve), the
lack-of-fit test worked by hand, and the coverage of the hierarchical interval on simulated curves.
NumPy and SciPy only."""

import math

import numpy as np
import pytest
from scipy import stats

from wide_tf.analysis import critical_batch as cb
from wide_tf.analysis.stats import lof, meta

X = np.log([64.0, 79, 92, 117, 140, 189, 667])
Y = np.array([4.1, 4.3, 3.9, 4.6, 4.2, 4.9, 5.0])
V = np.array([0.02, 0.05, 0.03, 0.04, 0.02, 0.06, 0.03])


def _reml_textbook(tau2, x, y, v):
    """-log restricted likelihood: 0.5 (log|V| + log|X'V^-1 X| + y'Py), P the REML projection."""
    X_ = np.column_stack([np.ones_like(x), x])
    Vi = np.diag(1.0 / (v + tau2))
    A = X_.T @ Vi @ X_
    P = Vi - Vi @ X_ @ np.linalg.solve(A, X_.T @ Vi)
    return 0.5 * (np.sum(np.log(v + tau2)) + np.log(np.linalg.det(A)) + y @ P @ y)


def test_reml_tau2_is_the_minimiser_of_the_textbook_likelihood():
    grid = np.linspace(0, 0.5, 50001)
    brute = grid[np.argmin([_reml_textbook(t, X, Y, V) for t in grid])]
    assert meta.tau2_reml(X, Y, V) == pytest.approx(brute, abs=2e-5)
    # Members that scatter less than their own variances say: tau^2 = 0.
    y0 = 4.0 + 0.3 * X
    assert meta.tau2_reml(X, y0, V) == 0.0


def test_dersimonian_laird_through_the_projection_matrix():
    X_ = np.column_stack([np.ones_like(X), X])
    W = np.diag(1 / V)
    P = W - W @ X_ @ np.linalg.solve(X_.T @ W @ X_, X_.T @ W)
    q = Y @ P @ Y
    expected = max(0.0, (q - (X.size - 2)) / np.trace(P))
    assert meta.tau2_dl(X, Y, V) == pytest.approx(expected, rel=1e-10)


def test_knapp_hartung_slope_and_interval():
    sl = meta.random_effects_slope(X, Y, V)
    w = 1 / (V + sl.tau2)
    # Weighted least squares as an ordinary one on sqrt(w)-scaled rows.
    A = np.column_stack([np.ones_like(X), X]) * np.sqrt(w)[:, None]
    beta, *_ = np.linalg.lstsq(A, Y * np.sqrt(w), rcond=None)
    resid = Y - beta[0] - beta[1] * X
    q = np.sum(w * resid**2) / (X.size - 2)
    se = math.sqrt(q * np.linalg.inv(A.T @ A)[1, 1])
    t = stats.t.ppf(0.975, X.size - 2)
    assert sl.value == pytest.approx(beta[1], rel=1e-10)
    assert sl.se == pytest.approx(se, rel=1e-8)
    assert (sl.low, sl.high) == pytest.approx((beta[1] - t * se, beta[1] + t * se), rel=1e-8)
    assert sl.df == 5 and sl.n_members == 7 and sum(sl.leverage) == pytest.approx(1.0)
    # Equal variances and no scatter beyond them: the plain OLS slope.
    flat = meta.random_effects_slope(X, 1 + 0.5 * X + 0.01 * np.sin(7 * X), np.full(7, 0.1))
    assert flat.value == pytest.approx(np.polyfit(X, 1 + 0.5 * X + 0.01 * np.sin(7 * X), 1)[0])


def test_leave_one_out_and_leverage():
    y = np.array([4.0, 3.98, 3.96, 3.94, 3.92, 3.9, 5.5])  # six falling, one far-off wide member
    sl = meta.random_effects_slope(X, y, np.full(7, 0.01))
    assert sl.value > 0 and sl.loo[-1] < 0 and not sl.loo_agree
    assert int(np.argmax(sl.leverage)) == 6 and sl.max_leverage > 0.5
    for i, v in enumerate(sl.loo):
        keep = np.arange(7) != i
        assert v == pytest.approx(
            meta.random_effects_slope(X[keep], y[keep], np.full(6, 0.01)).value
        )
    assert meta.random_effects_slope(X[:2], y[:2], V[:2]) is None  # m - 2 = 0


def kh_intervals(x, ys, vs, tau2, df_level=0.95):
    """Knapp-Hartung's interval on the slope for many studies at once (rows of ys and vs), at
    the given tau^2 per study, by plain weighted least squares: {floored: (low, high)}."""
    w = 1.0 / (vs + tau2[:, None])
    sw = w.sum(1)
    xw = (w * x).sum(1) / sw
    sxx = (w * (x - xw[:, None]) ** 2).sum(1)
    slope = (w * (x - xw[:, None]) * ys).sum(1) / sxx
    resid = ys - ((w * ys).sum(1) / sw - slope * xw)[:, None] - slope[:, None] * x
    q = (w * resid**2).sum(1) / (x.size - 2)
    t = stats.t.ppf(0.5 + df_level / 2, x.size - 2)
    out = {}
    for floor in (True, False):
        se = np.sqrt((np.maximum(q, 1.0) if floor else q) / sxx)
        out[floor] = (slope - t * se, slope + t * se)
    return out


def test_random_effects_null_rate_with_member_scatter():
    """No trend, members scattered by tau = 0.3 beyond their own errors: the t interval on m - 2
    df excludes 0 in about 5% of studies (a fixed-effects interval would in far more). tau^2 is
    meta's REML per study; the intervals at it, computed for all studies at once, equal
    meta.random_effects_slope's on the first 100 (without its leave-one-out refits)."""
    rng = np.random.default_rng(0)
    vs = 0.02 * rng.uniform(0.5, 2, (1000, 7))
    ys = rng.normal(0, 0.3, (1000, 7)) + rng.normal(0, np.sqrt(vs))
    tau2 = np.array([meta.tau2_reml(X, y, v) for y, v in zip(ys, vs)])
    low, high = kh_intervals(X, ys, vs, tau2)[True]
    for i in range(100):
        sl = meta.random_effects_slope(X, ys[i], vs[i])
        assert (sl.low, sl.high) == pytest.approx((low[i], high[i]), rel=1e-9, abs=1e-12)
    hits = int(np.sum((low > 0) | (high < 0)))
    assert hits / 1000 <= 0.07


def test_lack_of_fit_worked_by_hand():
    # Three complete cells of two seeds and one cell with a censored seed (left out).
    batch = np.array([8, 8, 16, 16, 32, 32, 64, 64.0])
    y = np.array([1.0, 1.2, 2.0, 2.4, 3.0, 3.0, 5.0, 9.0])
    cens = np.array([0, 0, 0, 0, 0, 0, 0, 1], bool)
    fitted = np.array([1.0, 1.0, 2.3, 2.3, 3.1, 3.1, 4.0, 4.0])
    c = lof.components(batch, y, cens, fitted)
    # pure error: (0.1^2 * 2 + 0.2^2 * 2 + 0) / 3; lack of fit: 2 (0.1^2 + 0.1^2 + 0.1^2) / (3 - 2)
    assert c.sigma2 == pytest.approx(0.1 / 3) and c.df_within == 3
    assert c.ms_lof == pytest.approx(0.06) and c.df_lof == 1 and c.n_complete == 3
    assert c.f == pytest.approx(0.06 / (0.1 / 3))
    assert c.p_value == pytest.approx(1 - stats.f.cdf(1.8, 1, 3))
    assert c.tau2 == pytest.approx((0.06 - 0.1 / 3) / 2)


def test_lack_of_fit_rejects_a_curve_without_a_knee_and_keeps_the_right_one():
    rng = np.random.default_rng(1)
    b = np.repeat([16, 32, 64, 128, 256, 512, 1024.0], 5)
    good = 400 * (1 + 150 / b) * np.exp(0.1 * rng.standard_normal(b.size))
    est = cb.estimate(cb.Observations.make(b, good, np.zeros(b.size, bool), 4000), 1.0, 100)
    assert est.lof_p > 0.05
    # A power law S = c B^-0.6 has no knee: the knee curve misses it far beyond the seed noise.
    bad = 4e4 * b**-0.6 * np.exp(0.05 * rng.standard_normal(b.size))
    est = cb.estimate(cb.Observations.make(b, bad, np.zeros(b.size, bool), 4000), 1.0, 100)
    assert est.lof_p < 0.01


@pytest.mark.parametrize(
    "batches,cell_sd",
    [((16, 32, 64, 128, 256, 512, 1024), 0.0), ((32, 128, 512, 2048), 0.1)],
    ids=["no cell effect", "4 cells, cell effect 0.1"],
)
def test_b_crit_interval_coverage(batches, cell_sd):
    """Seed noise 0.14 and five seeds per cell: the 95% interval of B_crit covers the truth in
    93-97% of 400 simulated members, with and without a cell effect (seed noise counted once,
    variances drawn from their sampling distributions), at the analysis' 1,000 replicates (200
    lose about 1.5 points to the noise of their tail quantiles: 93.5% against 95.0% on the same
    800 members). The binomial SD at 95% is 1.1%; the band is the acceptance range."""
    rng = np.random.default_rng(11)
    b = np.repeat(np.array(batches, float), 5)
    covered = 0
    for k in range(400):
        u = rng.normal(0, cell_sd, len(batches)).repeat(5)
        s = 400 * (1 + 150 / b) * np.exp(u + rng.normal(0, 0.14, b.size))
        est = cb.estimate(cb.Observations.make(b, s, np.zeros(b.size, bool), 1438), 1.0, 1000, k)
        covered += est.b_crit.low <= 150 <= est.b_crit.high
    assert 0.93 <= covered / 400 <= 0.97
