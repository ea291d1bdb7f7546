"""Owns the two variance components of one member's batch-size curve and the test of its fit:
seed noise within a (member, batch) cell, and a cell effect shared by a cell's seeds (the
learning-rate choice, data order, the curve's misfit at that batch).

With k seeds per cell, the cells whose seeds all finished give

* the **pure error** sigma^2: the pooled variance of log steps within cells, df_w = sum(k_b - 1);
* the **lack of fit** MS_lof = sum_b k_b (mean_b - fitted_b)^2 / (m - 2) over the m complete
  cells (two curve parameters fitted), whose expectation is sigma^2 + k tau^2 with tau^2 the cell
  effect's variance.

F = MS_lof / sigma^2 on (m - 2, df_w) degrees of freedom tests whether the curve describes the
cell means up to seed noise (a lack-of-fit test that can fail, unlike R^2 of log steps, which is
near 1 for any falling curve).

**Replicates** (`draw`) are parametric and hierarchical: a replicate cell mean is the centre plus
a normal cell deviation whose variance is MS_lof* / k, and the seeds deviate from that mean by
sigma* (centred within the cell, so the cell mean's variance is exactly MS_lof* / k). MS_lof* and
sigma*^2 are drawn from their scaled inverse chi-square distributions (df m - 2 and df_w), so a
replicate carries the uncertainty of the variances themselves: with few cells the interval has
t-like tails instead of the normal ones that under-cover. Seed noise is counted once (the earlier
two-level residual bootstrap added it to the cell effects and then again within cells). For a
linear curve with normal errors this reproduces the exact t interval on m - 2 df whether or not
there is a cell effect; `tests/analysis/test_stats.py` checks the coverage on the curve itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

N_PARAMS = 2  # log S_min and log B_crit


@dataclasses.dataclass(frozen=True)
class Components:
    """Variance components of one member's cells (log steps)."""

    sigma2: float | None  # pooled within-cell variance (None: no cell with 2 finished seeds)
    df_within: int
    ms_lof: float | None  # lack-of-fit mean square over complete cells (None: m - 2 < 1)
    df_lof: int
    k_mean: float  # mean seeds per complete cell
    n_complete: int  # cells whose every seed finished
    # The (member, seed) effect's variance: the part of sigma^2 a seed carries to every batch
    # size (its initialisation and data order); 0 when the seeds are unknown or it is not found.
    seed_var: float = 0.0

    @property
    def seed_share(self) -> float:
        """rho: the correlation of one seed's deviations across the member's cells."""
        if not self.sigma2 or self.seed_var <= 0:
            return 0.0
        return min(self.seed_var / self.sigma2, 0.95)

    @property
    def f(self) -> float | None:
        if self.ms_lof is None or not self.sigma2 or self.df_within < 1:
            return None
        return self.ms_lof / self.sigma2

    @property
    def p_value(self) -> float | None:
        """P(F >= observed) under a correct curve; small values reject the curve."""
        f = self.f
        return None if f is None else float(stats.f.sf(f, self.df_lof, self.df_within))

    @property
    def tau2(self) -> float | None:
        """The cell effect's variance (moment estimate, floored at 0)."""
        if self.ms_lof is None or self.sigma2 is None:
            return None
        return max(0.0, (self.ms_lof - self.sigma2) / self.k_mean)


def seed_variance(batch: np.ndarray, y: np.ndarray, cens: np.ndarray, seed) -> float:
    """The (member, seed) effect's variance by a two-way analysis of variance (cells x seeds, no
    replication) over the complete cells and the seeds common to all of them: E[MS_seed] =
    sigma_e^2 + m sigma_u^2 and E[MS_residual] = sigma_e^2, so sigma_u^2 = (MS_seed - MS_res) / m,
    floored at 0. The cell effects are the rows and drop out."""
    if seed is None:
        return 0.0
    seed = np.asarray(seed)
    cells = [b for b in np.unique(batch) if not np.any(cens[batch == b])]
    common = None
    for b in cells:
        ids = set(seed[batch == b].tolist())
        common = ids if common is None else common & ids
    if not cells or not common or len(common) < 2 or len(cells) < 2:
        return 0.0
    ids = sorted(common)
    mat = np.array([[y[(batch == b) & (seed == i)][0] for i in ids] for b in cells])
    m, k = mat.shape
    resid = mat - mat.mean(1, keepdims=True) - mat.mean(0, keepdims=True) + mat.mean()
    ms_seed = m * float(np.sum((mat.mean(0) - mat.mean()) ** 2)) / (k - 1)
    ms_res = float(np.sum(resid**2)) / ((m - 1) * (k - 1))
    return max(0.0, (ms_seed - ms_res) / m)


def components(batch: np.ndarray, y: np.ndarray, cens: np.ndarray, fitted: np.ndarray, seed=None):
    """Variance components from seed-level log steps `y` (censored entries are budgets) and the
    fitted log steps at each observation; with each observation's `seed`, also the (member,
    seed) effect's share of the seed noise."""
    bs = np.unique(batch)
    ss_w, df_w, lof, ks = 0.0, 0, 0.0, []
    for b in bs:
        cols = batch == b
        if np.any(cens[cols]):
            continue  # a censored seed truncates the cell: its spread and mean are biased
        yy = y[cols]
        k = yy.size
        ss_w += float(np.sum((yy - yy.mean()) ** 2))
        df_w += k - 1
        lof += k * float(yy.mean() - fitted[cols].mean()) ** 2
        ks.append(k)
    m = len(ks)
    df_lof = m - N_PARAMS
    return Components(
        sigma2=ss_w / df_w if df_w >= 1 else None,
        df_within=df_w,
        ms_lof=lof / df_lof if df_lof >= 1 else None,
        df_lof=max(df_lof, 0),
        k_mean=float(np.mean(ks)) if ks else 1.0,
        n_complete=m,
        seed_var=seed_variance(batch, y, cens, seed),
    )


def draw(
    comp: Components,
    centers: np.ndarray,
    batch: np.ndarray,
    bounds: np.ndarray,
    n_boot: int,
    rng: np.random.Generator,
    seed=None,
    fixed: bool = False,
):
    """Replicate seed-level log steps (n_boot, n) and censoring flags around `centers` (the
    value of each observation's cell: the fitted curve, or the observed cell for a model-free
    measure). `bounds` is each run's log budget when it was censored (inf when it finished): a
    replicate above it is censored there, as the run would have been. With each observation's
    `seed`, a share rho of the seed noise (`Components.seed_share`) is one draw per seed, shared
    by that seed's runs at every batch size, as in the data.

    `fixed=True` keeps MS_lof and sigma^2 at their estimates instead of drawing them: the
    replicates then spread as the estimate itself would over repeated studies with these
    components (its sampling variance, which the slope across members takes as each member's
    known variance), not as an interval that also carries the components' own uncertainty. With
    MS_lof on m - 2 = 4 degrees of freedom the drawn replicates are t-like and their 95% width
    reads as ~1.4-2x the variance: right for one member's interval, but counted again by the
    slope's own Knapp-Hartung interval on m - 2 member degrees of freedom."""
    n = batch.size
    bs, cell_of = np.unique(batch, return_inverse=True)
    k_cell = np.bincount(cell_of, minlength=bs.size).astype(float)
    sigma2 = comp.sigma2
    if sigma2 is None:
        # No replicated cell: seed noise cannot be separated; the lack of fit carries it all.
        sigma2 = comp.ms_lof if comp.ms_lof is not None else 0.0
    s2 = np.full(n_boot, sigma2)
    if comp.sigma2 is not None and comp.df_within >= 1 and not fixed:
        s2 = sigma2 * comp.df_within / rng.chisquare(comp.df_within, size=n_boot)
    if comp.ms_lof is not None:
        ms = np.full(n_boot, comp.ms_lof)
        if not fixed:
            ms = comp.ms_lof * comp.df_lof / rng.chisquare(comp.df_lof, size=n_boot)
        # The cell mean's variance: MS_lof / k for a cell of the usual size; a cell with other k
        # gets its seed part adjusted.
        v_cell = ms[:, None] / comp.k_mean + s2[:, None] * (1.0 / k_cell - 1.0 / comp.k_mean)
    else:  # fewer than 3 complete cells: no cell effect can be estimated (flagged by the caller)
        v_cell = s2[:, None] / k_cell
    v_cell = np.maximum(v_cell, 1e-12)
    z_cell = rng.standard_normal((n_boot, bs.size)) * np.sqrt(v_cell)
    z = _seed_noise(rng, n_boot, n, seed, comp.seed_share)
    # Seed deviations centred within each cell and rescaled to variance sigma*^2.
    sums = np.zeros((n_boot, bs.size))
    np.add.at(sums.T, cell_of, z.T)
    z = z - (sums / k_cell)[:, cell_of]
    scale = np.where(k_cell > 1, np.sqrt(k_cell / np.maximum(k_cell - 1, 1)), 0.0)[cell_of]
    y = centers[None, :] + z_cell[:, cell_of] + z * scale[None, :] * np.sqrt(s2)[:, None]
    cens = y > bounds[None, :]
    return np.where(cens, bounds[None, :], y), cens


def _seed_noise(rng, n_boot: int, n: int, seed, rho: float) -> np.ndarray:
    """(n_boot, n) standard normals, correlated rho between observations of the same seed."""
    z = rng.standard_normal((n_boot, n))
    if seed is None or rho <= 0:
        return z
    _, seed_of = np.unique(np.asarray(seed), return_inverse=True)
    u = rng.standard_normal((n_boot, int(seed_of.max()) + 1))
    return np.sqrt(rho) * u[:, seed_of] + np.sqrt(1.0 - rho) * z
