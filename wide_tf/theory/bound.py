"""The theory check's numbers: the batch bound at random initialisation of linear and ReLU
networks against width, depth and input dimension.

No training. For fully-connected networks without biases, f(x) = W_L phi(W_{L-1} ... phi(W_1 x))
with input dimension d, L weight matrices (L = 2: the 2-layer networks of Chen et al. 2018; L > 2
with phi = identity: their deep linear networks), hidden width w and one output, on Gaussian inputs
x ~ N(0, I_d) with a linear teacher y = beta.x (beta ~ N(0, I_d / d), so Var y = 1) and the squared
loss f_i = (f(x_i) - y_i)^2 / 2, we draw n examples and a random initialisation (LeCun normal,
variance 1/fan_in, for linear layers; He normal, 2/fan_in, before a ReLU) and compute the batch
bound n * sum_i |g_i|^2 / |sum_i g_i|^2 (docs/science.md, "Quantities"; Yin et al. 2018) exactly
from analytic per-example gradients:
grad W_l = delta_l a_{l-1}^T, so |grad W_l|^2 = |delta_l|^2 |a_{l-1}|^2 per example. Repeating this
over many independent draws (data, teacher and initialisation) gives the expected batch bound and a
95% confidence interval of that mean (normal approximation, mean +- 1.96 sd / sqrt(draws)).

Four sweeps (all sizes from the config):
  width   fixed depth, width varies (the parameter count grows with the width): 2-layer linear,
          2-layer ReLU and a deep linear network of depth ``deep_depth``;
  depth   fixed width, depth varies, linear and ReLU;
  budget  fixed parameter count P = d w + (L - 2) w^2 + w: for each depth the width is solved for,
          so deeper means narrower (L = 2 is the 2-layer network); linear (the paper's deep linear
          networks) and ReLU (beyond the paper's theory, for comparison);
  input_dim  2-layer linear and ReLU networks at a fixed width as the input dimension varies (the
          bound tracks d, so a width effect is only meaningful next to it).

Each curve is scored by the log-log slope of the median (and of the mean and the ratio of
expectations) with a 95% bootstrap interval and the fold change over the sweep: magnitudes, not
only directions.

Owns the numbers: the networks, their analytic per-example gradients, every point of the sweeps
and each curve's trend. Pure NumPy (float64); `wide_tf.theory.report` lays them out and
`wide_tf.theory.runner` runs and writes the check.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from absl import logging

Z95 = 1.959963984540054


# -- networks and analytic per-example gradients -----------------------------------------------


def param_count(input_dim: int, depth: int, width: int) -> int:
    """Weights of a bias-free net with ``depth`` weight matrices, hidden ``width``, one output."""
    if depth < 2:
        raise ValueError(f"depth must be >= 2 weight matrices, got {depth}")
    return input_dim * width + (depth - 2) * width * width + width


def width_for_budget(input_dim: int, depth: int, budget: int) -> int:
    """The integer width whose parameter count is closest to ``budget`` at this depth (>= 1)."""
    a, b = depth - 2, input_dim + 1
    w = budget / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
    candidates = {max(1, math.floor(w)), max(1, math.ceil(w))}
    return min(candidates, key=lambda c: (abs(param_count(input_dim, depth, c) - budget), c))


def init_weights(
    rng: np.random.Generator, kind: str, input_dim: int, depth: int, width: int
) -> list:
    """W_1 (w, d), W_2..W_{L-1} (w, w), W_L (1, w); LeCun normal, He normal before a ReLU."""
    dims = [input_dim] + [width] * (depth - 1) + [1]
    gain_hidden = 2.0 if kind == "relu" else 1.0
    weights = []
    for layer in range(depth):
        fan_in = dims[layer]
        gain = gain_hidden if layer < depth - 1 else 1.0  # the output layer is linear
        weights.append(rng.normal(0.0, math.sqrt(gain / fan_in), size=(dims[layer + 1], fan_in)))
    return weights


def _forward_backward(weights, kind, x, y):
    """Activations a_0..a_{L-1} (each layer's input) and output gradients delta_1..delta_L, per
    example."""
    if kind not in ("linear", "relu"):
        raise ValueError(f"kind must be 'linear' or 'relu', got {kind!r}")
    acts, pre = [x], []
    a = x
    for layer, w in enumerate(weights):
        h = a @ w.T
        pre.append(h)
        hidden = layer < len(weights) - 1
        a = np.maximum(h, 0.0) if (kind == "relu" and hidden) else h
        if hidden:
            acts.append(a)
    residual = a[:, 0] - y  # d f_i / d output for the squared loss / 2
    deltas = [None] * len(weights)
    delta = residual[:, None]  # (n, 1)
    for layer in range(len(weights) - 1, -1, -1):
        deltas[layer] = delta
        if layer > 0:
            delta = delta @ weights[layer]
            if kind == "relu":
                delta = delta * (pre[layer - 1] > 0)
    return acts, deltas, residual


def per_example_gradients(weights, kind, x, y) -> list:
    """Explicit per-example gradients [(n, out, in) per layer] (tests; the study uses the norms)."""
    acts, deltas, _ = _forward_backward(weights, kind, x, y)
    return [np.einsum("no,ni->noi", d, a) for d, a in zip(deltas, acts)]


def gradient_norms(weights, kind, x, y) -> tuple[np.ndarray, float]:
    """Per-example |g_i|^2 (n,) and |sum_i g_i|^2 without forming per-example gradients."""
    acts, deltas, _ = _forward_backward(weights, kind, x, y)
    sq = np.zeros(len(x))
    total = 0.0
    for d, a in zip(deltas, acts):
        sq += np.sum(d * d, axis=1) * np.sum(a * a, axis=1)
        g = d.T @ a
        total += float(np.sum(g * g))
    return sq, total


def loss(weights, kind, x, y) -> float:
    """Total squared loss sum_i (f(x_i) - y_i)^2 / 2 (for finite-difference checks)."""
    return float(0.5 * np.sum(_forward_backward(weights, kind, x, y)[2] ** 2))


def draw_norms(
    rng, kind, input_dim, depth, width, n_samples, label_noise=0.0
) -> tuple[float, float]:
    """One draw of teacher, data and initialisation: (sum_i |g_i|^2, |sum_i g_i|^2)."""
    beta = rng.normal(0.0, 1.0 / math.sqrt(input_dim), size=input_dim)
    x = rng.normal(size=(n_samples, input_dim))
    y = x @ beta + label_noise * rng.normal(size=n_samples)
    weights = init_weights(rng, kind, input_dim, depth, width)
    sq, total = gradient_norms(weights, kind, x, y)
    return float(np.sum(sq)), total


# -- the study ---------------------------------------------------------------------------------


@dataclass
class Point:
    """One (network, width) point: per draw, sum_i |g_i|^2 (s1) and |sum_i g_i|^2 (q), over n
    examples.

    Three statistics: ``median`` of the per-draw bound n s1 / q (the headline: deep ReLU bounds are
    heavy-tailed; bootstrap CI), ``mean``, the expected batch bound E[n s1 / q] (95% CI by the
    normal approximation), and ``ratio``, the ratio of expectations n E[s1] / E[q], less sensitive
    to the rare draws whose mean gradient nearly vanishes (95% CI by a seeded percentile bootstrap).
    """

    sweep: str
    kind: str
    depth: int
    width: int
    params: int
    n: int
    s1: np.ndarray
    q: np.ndarray
    input_dim: int = 0

    @property
    def values(self) -> np.ndarray:
        return self.n * self.s1 / self.q

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def sd(self) -> float:
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else 0.0

    @property
    def half_ci(self) -> float:
        return Z95 * self.sd / math.sqrt(len(self.values))

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    def median_ci(self, resamples: int = 1000) -> tuple[float, float]:
        rng = np.random.default_rng(54321)
        idx = rng.integers(0, len(self.s1), size=(resamples, len(self.s1)))
        lo, hi = np.percentile(np.median(self.values[idx], axis=1), [2.5, 97.5])
        return float(lo), float(hi)

    def statistic(self, name: str) -> float:
        return {"median": self.median, "mean": self.mean, "ratio": self.ratio}[name]

    @property
    def ratio(self) -> float:
        return self.n * float(np.mean(self.s1)) / float(np.mean(self.q))

    def ratio_ci(self, resamples: int = 1000) -> tuple[float, float]:
        rng = np.random.default_rng(12345)
        idx = rng.integers(0, len(self.s1), size=(resamples, len(self.s1)))
        boot = self.n * self.s1[idx].mean(axis=1) / self.q[idx].mean(axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        return float(lo), float(hi)

    def row(self) -> dict:
        lo, hi = self.ratio_ci()
        mlo, mhi = self.median_ci()
        return {
            "sweep": self.sweep,
            "kind": self.kind,
            "depth": self.depth,
            "width": self.width,
            "input_dim": self.input_dim,
            "params": self.params,
            "draws": len(self.s1),
            "median_ci95_low": mlo,
            "median_ci95_high": mhi,
            "batch_bound_mean": self.mean,
            "ci95_low": self.mean - self.half_ci,
            "ci95_high": self.mean + self.half_ci,
            "batch_bound_sd": self.sd,
            "batch_bound_median": float(np.median(self.values)),
            "ratio_of_expectations": self.ratio,
            "ratio_ci95_low": lo,
            "ratio_ci95_high": hi,
        }


STATISTICS = ("median", "mean", "ratio")
STAT_NAMES = {"median": "median", "mean": "mean", "ratio": "ratio of expectations"}
N_RESAMPLES = 1000


def plan_points(cfg) -> list[tuple[str, str, int, int, int]]:
    """(sweep, kind, depth, width, input_dim) of every point, in report order."""
    d0 = int(cfg.input_dim)
    plan = []
    for kind, depth in [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))]:
        for w in cfg.widths:
            plan.append(("width", kind, depth, int(w), d0))
    for kind in cfg.kinds:
        for depth in cfg.depths:
            plan.append(("depth", kind, int(depth), int(cfg.fixed_width), d0))
    for kind in cfg.kinds:
        for depth in cfg.depths:
            plan.append(
                ("budget", kind, int(depth), width_for_budget(d0, int(depth), int(cfg.budget)), d0)
            )
    for kind in ("linear", "relu"):
        for d in cfg.get("input_dims", []):
            plan.append(("input_dim", kind, 2, int(cfg.fixed_width), int(d)))
    return plan


def run_points(cfg) -> list[Point]:
    """Every point of the sweeps; draws seeded by (seed, point index), so points are independent."""
    points = []
    plan = plan_points(cfg)
    start = time.time()
    for i, (sweep, kind, depth, width, d) in enumerate(plan):
        rng = np.random.default_rng([int(cfg.seed), i])
        draws = np.array(
            [
                draw_norms(rng, kind, d, depth, width, cfg.n_samples, cfg.get("label_noise", 0.0))
                for _ in range(cfg.n_inits)
            ]
        )
        p = Point(
            sweep,
            kind,
            depth,
            width,
            param_count(d, depth, width),
            cfg.n_samples,
            draws[:, 0],
            draws[:, 1],
            d,
        )
        points.append(p)
        logging.info(
            "theory %d/%d %s %s L=%d w=%d d=%d P=%d: batch bound mean %.2f, median %.2f (%.1fs)",
            i + 1,
            len(plan),
            sweep,
            kind,
            depth,
            width,
            d,
            p.params,
            p.mean,
            p.median,
            time.time() - start,
        )
    return points


@dataclass(frozen=True)
class Trend:
    """Log-log slope of a statistic along a sweep, with a 95% bootstrap interval (draws resampled
    within every point), and the fold change it implies over the sweep's range."""

    slope: float
    low: float
    high: float
    fold: float  # statistic at the last point / at the first, from the fitted slope
    x_range: float  # last x / first x

    @property
    def word(self) -> str:
        return (
            "grows" if self.low > 0 else "falls" if self.high < 0 else "shows no detectable trend"
        )

    def describe(self) -> str:
        return (
            f"{self.word} (slope {self.slope:+.2f}, 95% CI {self.low:+.2f} to {self.high:+.2f}; "
            f"{self.fold:.2f}x over a {self.x_range:g}x range)"
        )


def _stat(values: np.ndarray, s1: np.ndarray, q: np.ndarray, n: int, statistic: str, axis=-1):
    if statistic == "mean":
        return values.mean(axis=axis)
    if statistic == "median":
        return np.median(values, axis=axis)
    return n * s1.mean(axis=axis) / q.mean(axis=axis)


def trend(xs, points: list[Point], statistic: str = "median") -> Trend | None:
    """Log-log slope of `statistic` against xs, with its bootstrap interval (None: < 2 points)."""
    if len(points) < 2:
        return None
    lx = np.log(np.asarray(xs, dtype=float))
    xc = lx - lx.mean()
    sxx = float(np.sum(xc**2))
    if sxx <= 0:
        return None
    rng = np.random.default_rng(2024)
    point_vals, reps = [], []
    for p in points:
        point_vals.append(p.statistic(statistic))
        idx = rng.integers(0, len(p.s1), size=(N_RESAMPLES, len(p.s1)))
        reps.append(_stat(p.values[idx], p.s1[idx], p.q[idx], p.n, statistic))
    ly = np.log(np.asarray(point_vals))
    slope = float(np.sum(xc * (ly - ly.mean())) / sxx)
    boot = np.log(np.stack(reps, axis=1))  # (R, points)
    sl = (boot - boot.mean(axis=1, keepdims=True)) @ xc / sxx
    lo, hi = np.percentile(sl, [2.5, 97.5])
    x_range = float(np.exp(lx.max() - lx.min()))
    return Trend(slope, float(lo), float(hi), float(x_range**slope), x_range)


def curve_points(points, sweep, kind, depth=None):
    sel = [
        p
        for p in points
        if p.sweep == sweep and p.kind == kind and (depth is None or p.depth == depth)
    ]
    key = {"width": lambda p: (p.width, p.depth), "input_dim": lambda p: p.input_dim}.get(
        sweep, lambda p: (p.depth, p.width)
    )
    return sorted(sel, key=key)


def x_value(p: Point, sweep: str) -> int:
    return {"width": p.width, "input_dim": p.input_dim}.get(sweep, p.depth)


def curve_label(kind, depth):
    return f"{depth}-layer {'ReLU' if kind == 'relu' else 'linear'}"


def scored_curves(cfg) -> list[tuple[str, str, str, int | None]]:
    """(sweep, label, kind, depth) of every scored curve."""
    out = [
        ("width", curve_label(k, d), k, d)
        for k, d in [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))]
    ]
    out += [("depth", f"{k} (width {cfg.fixed_width})", k, None) for k in cfg.kinds]
    out += [("budget", f"{k} (~{int(cfg.budget):,} params)", k, None) for k in cfg.kinds]
    if cfg.get("input_dims"):
        out += [("input_dim", curve_label(k, 2), k, 2) for k in ("linear", "relu")]
    return out


def summarize(points: list[Point], cfg) -> dict:
    """{sweep: {label: {statistic: Trend}}} for every scored curve."""
    out: dict = {}
    for sweep, label, kind, depth in scored_curves(cfg):
        g = curve_points(points, sweep, kind, depth)
        out.setdefault(sweep, {})[label] = {
            s: trend([x_value(p, sweep) for p in g], g, s) for s in STATISTICS
        }
    return out
