"""Theory check: the batch bound at random initialisation of linear and ReLU networks against width,
depth and input dimension.

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

Pure NumPy (float64); TensorFlow is imported only to write through tf.io.gfile (gs:// works).
"""

from __future__ import annotations

import csv
import io
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

    def interval(self, statistic: str) -> tuple[float, float, float]:
        """(value, low, high) of 'mean' or 'ratio'."""
        if statistic == "ratio":
            return (self.ratio,) + self.ratio_ci()
        if statistic == "median":
            return (self.median,) + self.median_ci()
        return self.mean, self.mean - self.half_ci, self.mean + self.half_ci

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


def _plan(cfg) -> list[tuple[str, str, int, int, int]]:
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
    plan = _plan(cfg)
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


def _group(points, sweep, kind, depth=None):
    sel = [
        p
        for p in points
        if p.sweep == sweep and p.kind == kind and (depth is None or p.depth == depth)
    ]
    key = {"width": lambda p: (p.width, p.depth), "input_dim": lambda p: p.input_dim}.get(
        sweep, lambda p: (p.depth, p.width)
    )
    return sorted(sel, key=key)


def _x(p: Point, sweep: str) -> int:
    return {"width": p.width, "input_dim": p.input_dim}.get(sweep, p.depth)


def _label(kind, depth):
    return f"{depth}-layer {'ReLU' if kind == 'relu' else 'linear'}"


def _groups(cfg) -> list[tuple[str, str, str, int | None]]:
    """(sweep, label, kind, depth) of every scored curve."""
    out = [
        ("width", _label(k, d), k, d)
        for k, d in [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))]
    ]
    out += [("depth", f"{k} (width {cfg.fixed_width})", k, None) for k in cfg.kinds]
    out += [("budget", f"{k} (~{int(cfg.budget):,} params)", k, None) for k in cfg.kinds]
    if cfg.get("input_dims"):
        out += [("input_dim", _label(k, 2), k, 2) for k in ("linear", "relu")]
    return out


def summarize(points: list[Point], cfg) -> dict:
    """{sweep: {label: {statistic: Trend}}} for every scored curve."""
    out: dict = {}
    for sweep, label, kind, depth in _groups(cfg):
        g = _group(points, sweep, kind, depth)
        out.setdefault(sweep, {})[label] = {
            s: trend([_x(p, sweep) for p in g], g, s) for s in STATISTICS
        }
    return out


def verdict(summary: dict, cfg) -> str:
    """One paragraph computed from the slopes (never hard-coded), with magnitudes. The median is
    the headline statistic: deep ReLU networks have heavy-tailed batch bounds whose mean is decided
    by a few draws; the mean and the ratio of expectations are reported beside it."""

    def one(sweep, label):
        t = summary.get(sweep, {}).get(label, {})
        m = t.get("median")
        if m is None:
            return None
        agree = [s for s in ("mean", "ratio") if t.get(s) is not None and t[s].word == m.word]
        return m, agree

    parts = [
        f"Median batch bound at initialisation (d = {cfg.input_dim} inputs, "
        f"n = {cfg.n_samples} examples):"
    ]
    width_words = {}
    for sweep, label, _, _ in _groups(cfg):
        got = one(sweep, label)
        if got is None:
            continue
        m, agree = got
        axis = {
            "width": "width",
            "depth": "depth",
            "budget": "depth at a fixed budget",
            "input_dim": "input dimension",
        }[sweep]
        others = [s for s in ("mean", "ratio") if s not in agree]
        if not others:
            note = "the mean and the ratio of expectations agree"
        elif not agree:
            note = "the mean and the ratio of expectations do not"
        else:
            note = f"the {STAT_NAMES[agree[0]]} agrees, the {STAT_NAMES[others[0]]} does not"
        parts.append(f"{label}: with {axis} it {m.describe()}; {note}.")
        if sweep == "width":
            width_words[label] = m
    lin = [m for label, m in width_words.items() if "linear" in label]
    relu = [m for label, m in width_words.items() if "ReLU" in label]
    budget_lin = (summary.get("budget", {}).get(f"linear (~{int(cfg.budget):,} params)") or {}).get(
        "median"
    )
    dim_lin = (summary.get("input_dim", {}).get(_label("linear", 2)) or {}).get("median")
    if (
        lin
        and all(m.word == "grows" for m in lin)
        and budget_lin is not None
        and budget_lin.word == "falls"
    ):
        parts.append(
            "For linear networks this agrees in direction with the paper's theory (wider: larger "
            "bound; deeper at a fixed budget: smaller)."
        )
    elif lin and (
        any(m.word == "falls" for m in lin)
        or (budget_lin is not None and budget_lin.word == "grows")
    ):
        parts.append("For linear networks this contradicts the paper's theory.")
    else:
        parts.append("For linear networks the paper's theory is not confirmed at this sample size.")
    if relu:
        parts.append(
            f"For the 2-layer ReLU network (the paper's non-linear case) the median bound "
            f"{relu[0].word} with width."
        )
    if lin and dim_lin is not None:
        biggest = max(lin, key=lambda m: abs(math.log(m.fold)))
        parts.append(
            f"Magnitude: width changes the linear networks' bound by at most {biggest.fold:.2f}x "
            f"over a {biggest.x_range:g}x width range, while the input dimension changes the "
            f"2-layer linear bound by {dim_lin.fold:.2f}x over a {dim_lin.x_range:g}x range."
        )
    return " ".join(parts)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def render_markdown(points: list[Point], cfg, summary: dict, elapsed_s: float) -> str:
    lines = [
        "# Theory check: batch bound at random initialisation",
        "",
        "Batch bound n * sum_i |g_i|^2 / |sum_i g_i|^2 (Yin et al. 2018) of bias-free "
        "fully-connected networks at random initialisation (LeCun normal for linear layers, "
        "He normal before a ReLU), with Gaussian inputs, a linear teacher y = beta.x and the "
        "squared loss; exact analytic per-example gradients, no training.",
        "",
        "## Design",
        "",
        f"- input dimension d = {cfg.input_dim} (except in the input-dimension sweep), one output, "
        f"n = {cfg.n_samples} examples per draw, {cfg.n_inits} independent draws (teacher, data, "
        f"initialisation) per point, seed {cfg.seed}, label noise {cfg.get('label_noise', 0.0)};",
        f"- width sweep: widths {list(cfg.widths)} at depth 2 (linear and ReLU) and depth "
        f"{cfg.deep_depth} (linear); the parameter count grows with the width;",
        f"- depth sweep: depths {list(cfg.depths)} at width {cfg.fixed_width};",
        f"- fixed budget: P = d w + (L - 2) w^2 + w ~ {int(cfg.budget):,} parameters, width solved "
        f"per depth L in {list(cfg.depths)} (L = 2: the 2-layer network); deep ReLU networks are "
        f"beyond the paper's theory and shown for comparison;",
        f"- input-dimension sweep: d in {list(cfg.get('input_dims', []))} for 2-layer networks at "
        f"width {cfg.fixed_width} (the bound tracks d: a width effect must be read against it);",
        "- statistics per point: the median (headline: deep ReLU bounds are heavy-tailed), "
        "the mean (95% CI: mean +- 1.96 sd / sqrt(draws)) and the ratio of expectations "
        "n E[sum|g_i|^2] / E[|sum g_i|^2] (95% CI: bootstrap over draws);",
        f"- trends: the log-log slope of each statistic along the sweep, with a 95% bootstrap "
        f"interval ({N_RESAMPLES} resamples of the draws within every point); 'grows'/'falls' when "
        "the interval excludes 0; the fold change over the sweep's range gives the magnitude.",
        "",
        "## Verdict",
        "",
        verdict(summary, cfg),
        "",
    ]
    titles = {
        "width": "Width sweep at fixed depth",
        "depth": f"Depth sweep at width {cfg.fixed_width}",
        "budget": f"Fixed parameter budget (~{int(cfg.budget):,})",
        "input_dim": f"Input-dimension sweep (2-layer, width {cfg.fixed_width})",
    }
    lines += [
        "## Slopes (log-log, 95% bootstrap intervals)",
        "",
        "| sweep | network | median | mean | ratio of expectations |",
        "|---|---|---|---|---|",
    ]
    for sweep, by_label in summary.items():
        for label, stats in by_label.items():
            cells = [
                (
                    "-"
                    if stats[s] is None
                    else f"{stats[s].slope:+.3f} [{stats[s].low:+.3f}, "
                    f"{stats[s].high:+.3f}], {stats[s].fold:.2f}x"
                )
                for s in STATISTICS
            ]
            lines.append(f"| {sweep} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for sweep in ("width", "depth", "budget", "input_dim"):
        sel = [p for p in points if p.sweep == sweep]
        if not sel:
            continue
        lines += [
            f"## {titles[sweep]}",
            "",
            "| network | depth L | width w | input d | params | median (95% CI) | mean (95% CI) "
            "| ratio of expectations (95% CI) |",
            "|---|---:|---:|---:|---:|---|---|---|",
        ]
        for p in sel:
            r = p.row()
            lines.append(
                f"| {p.kind} | {p.depth} | {p.width} | {p.input_dim} | {p.params:,} | "
                f"{_fmt(r['batch_bound_median'])} [{_fmt(r['median_ci95_low'])}, "
                f"{_fmt(r['median_ci95_high'])}] | {_fmt(r['batch_bound_mean'])} "
                f"[{_fmt(r['ci95_low'])}, {_fmt(r['ci95_high'])}] | "
                f"{_fmt(r['ratio_of_expectations'])} [{_fmt(r['ratio_ci95_low'])}, "
                f"{_fmt(r['ratio_ci95_high'])}] |"
            )
        lines.append("")
    lines += [f"Computed in {elapsed_s:.1f} s. Data: theory.csv; plot: theory.png.", ""]
    return "\n".join(lines)


def render_plot(points: list[Point], cfg) -> bytes:
    # Lazy: the theory's numbers need NumPy only (its tests import this module in a second);
    # matplotlib loads only to draw, with a file backend (no display on a TPU VM).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    specs = [
        (
            "width",
            [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))],
            "width w",
            "fixed depth: width sweep",
        ),
        (
            "depth",
            [(k, None) for k in cfg.kinds],
            "depth L",
            f"fixed width {cfg.fixed_width}: depth sweep",
        ),
        (
            "budget",
            [(k, None) for k in cfg.kinds],
            "depth L (width solved for the budget)",
            f"fixed budget ~{int(cfg.budget):,} parameters",
        ),
        (
            "input_dim",
            [("linear", 2), ("relu", 2)],
            "input dimension d",
            f"2-layer, width {cfg.fixed_width}: input-dimension sweep",
        ),
    ]
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax, (sweep, groups, xlabel, title) in zip(axes, specs):
        for gi, (kind, depth) in enumerate(groups):
            g = _group(points, sweep, kind, depth)
            if not g:
                continue
            xs = [_x(p, sweep) for p in g]
            label = _label(kind, depth) if depth is not None else kind
            med = np.array([p.median for p in g])
            lo = np.array([p.median_ci()[0] for p in g])
            hi = np.array([p.median_ci()[1] for p in g])
            line = ax.errorbar(
                xs, med, yerr=[med - lo, hi - med], marker="o", capsize=3, label=f"{label}: median"
            )
            ax.plot(
                xs,
                [p.mean for p in g],
                "x--",
                color=line[0].get_color(),
                alpha=0.6,
                label=f"{label}: mean",
            )
            if sweep == "budget" and gi == 0:  # the widths are the same for every kind
                for p, x in zip(g, xs):
                    ax.annotate(
                        f"w={p.width}",
                        (x, p.median),
                        textcoords="offset points",
                        xytext=(3, 4),
                        fontsize=7,
                    )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(fmt)
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(fmt)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("batch bound (median with 95% CI; mean)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Batch bound at random initialisation (n={cfg.n_samples}, {cfg.n_inits} draws per point)"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_csv(points: list[Point]) -> str:
    buf = io.StringIO()
    rows = [p.row() for p in points]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def run_theory(config, workdir: str) -> dict:
    """Run the theory study of ``config.theory`` and write WORKDIR/report/theory.{md,csv,png}.

    Returns {'points': [row dicts], 'summary': {sweep: {network: {statistic: Trend}}},
    'verdict': str, 'paths': {...}}.
    """
    import tensorflow as tf  # lazy, and only for tf.io.gfile (gs:// workdirs): see render_plot

    cfg = config.theory
    start = time.time()
    logging.info(
        "theory: %d points x %d draws, n=%d, d=%d",
        len(_plan(cfg)),
        cfg.n_inits,
        cfg.n_samples,
        cfg.input_dim,
    )
    points = run_points(cfg)
    summary = summarize(points, cfg)
    elapsed = time.time() - start
    report_dir = f"{workdir.rstrip('/')}/report"
    tf.io.gfile.makedirs(report_dir)
    paths = {ext: f"{report_dir}/theory.{ext}" for ext in ("md", "csv", "png")}
    with tf.io.gfile.GFile(paths["csv"], "w") as f:
        f.write(render_csv(points))
    with tf.io.gfile.GFile(paths["png"], "wb") as f:
        f.write(render_plot(points, cfg))
    text = verdict(summary, cfg)
    with tf.io.gfile.GFile(paths["md"], "w") as f:
        f.write(render_markdown(points, cfg, summary, elapsed))
    logging.info("theory: %s", text)
    logging.info("theory: wrote %s (%.1fs)", ", ".join(paths.values()), elapsed)
    return {
        "points": [p.row() for p in points],
        "summary": summary,
        "verdict": text,
        "paths": paths,
    }
