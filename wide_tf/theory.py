"""Theory check: expected batch bound at random initialisation of linear/ReLU networks vs width and depth.

No training. For fully-connected networks without biases, f(x) = W_L phi(W_{L-1} ... phi(W_1 x)) with
input dimension d, L weight matrices (L = 2: the 2-layer networks of Chen et al. 2018; L > 2 with
phi = identity: their deep linear networks), hidden width w and one output, on Gaussian inputs
x ~ N(0, I_d) with a linear teacher y = beta.x (beta ~ N(0, I_d / d), so Var y = 1) and the squared
loss f_i = (f(x_i) - y_i)^2 / 2, we draw n examples and a random initialisation (LeCun normal,
variance 1/fan_in, for linear layers; He normal, 2/fan_in, before a ReLU) and compute the batch bound
n * sum_i |g_i|^2 / |sum_i g_i|^2 (SCIENCE.md) exactly from analytic per-example gradients:
grad W_l = delta_l a_{l-1}^T, so |grad W_l|^2 = |delta_l|^2 |a_{l-1}|^2 per example. Repeating this
over many independent draws (data, teacher and initialisation) gives the expected batch bound and a
95% confidence interval of that mean (normal approximation, mean +- 1.96 sd / sqrt(draws)).

Three sweeps (all sizes from the config):
  width   fixed depth, width varies (the parameter count grows with the width): 2-layer linear,
          2-layer ReLU and a deep linear network of depth ``deep_depth``;
  depth   fixed width, depth varies, linear and ReLU;
  budget  fixed parameter count P = d w + (L - 2) w^2 + w: for each depth the width is solved for,
          so deeper means narrower (L = 2 is the 2-layer network); linear (the paper's deep linear
          networks) and ReLU (beyond the paper's theory, for comparison).

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


# -- networks and analytic per-example gradients ------------------------------------------------------

def param_count(input_dim: int, depth: int, width: int) -> int:
    """Weights of a bias-free network with ``depth`` weight matrices, hidden ``width``, one output."""
    if depth < 2:
        raise ValueError(f"depth must be >= 2 weight matrices, got {depth}")
    return input_dim * width + (depth - 2) * width * width + width


def width_for_budget(input_dim: int, depth: int, budget: int) -> int:
    """The integer width whose parameter count is closest to ``budget`` at this depth (at least 1)."""
    a, b = depth - 2, input_dim + 1
    w = budget / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
    candidates = {max(1, math.floor(w)), max(1, math.ceil(w))}
    return min(candidates, key=lambda c: (abs(param_count(input_dim, depth, c) - budget), c))


def init_weights(rng: np.random.Generator, kind: str, input_dim: int, depth: int, width: int) -> list:
    """W_1 (w, d), W_2..W_{L-1} (w, w), W_L (1, w); LeCun normal, He normal before a ReLU."""
    dims = [input_dim] + [width] * (depth - 1) + [1]
    gain_hidden = 2.0 if kind == "relu" else 1.0
    weights = []
    for l in range(depth):
        fan_in = dims[l]
        gain = gain_hidden if l < depth - 1 else 1.0  # the output layer is linear
        weights.append(rng.normal(0.0, math.sqrt(gain / fan_in), size=(dims[l + 1], fan_in)))
    return weights


def _forward_backward(weights, kind, x, y):
    """Activations a_0..a_{L-1} (inputs of each layer) and output gradients delta_1..delta_L, per example."""
    if kind not in ("linear", "relu"):
        raise ValueError(f"kind must be 'linear' or 'relu', got {kind!r}")
    acts, pre = [x], []
    a = x
    for l, w in enumerate(weights):
        h = a @ w.T
        pre.append(h)
        a = np.maximum(h, 0.0) if (kind == "relu" and l < len(weights) - 1) else h
        if l < len(weights) - 1:
            acts.append(a)
    residual = a[:, 0] - y                      # d f_i / d output for the squared loss / 2
    deltas = [None] * len(weights)
    delta = residual[:, None]                    # (n, 1)
    for l in range(len(weights) - 1, -1, -1):
        deltas[l] = delta
        if l > 0:
            delta = delta @ weights[l]
            if kind == "relu":
                delta = delta * (pre[l - 1] > 0)
    return acts, deltas, residual


def per_example_gradients(weights, kind, x, y) -> list:
    """Explicit per-example gradients [(n, out, in) per layer] (for tests; the study uses the norms)."""
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


def draw_norms(rng, kind, input_dim, depth, width, n_samples, label_noise=0.0) -> tuple[float, float]:
    """One draw of teacher, data and initialisation: (sum_i |g_i|^2, |sum_i g_i|^2)."""
    beta = rng.normal(0.0, 1.0 / math.sqrt(input_dim), size=input_dim)
    x = rng.normal(size=(n_samples, input_dim))
    y = x @ beta + label_noise * rng.normal(size=n_samples)
    weights = init_weights(rng, kind, input_dim, depth, width)
    sq, total = gradient_norms(weights, kind, x, y)
    return float(np.sum(sq)), total


def batch_bound_draw(rng, kind, input_dim, depth, width, n_samples, label_noise=0.0) -> float:
    """One draw's exact batch bound n sum_i |g_i|^2 / |sum_i g_i|^2."""
    s1, q = draw_norms(rng, kind, input_dim, depth, width, n_samples, label_noise)
    return n_samples * s1 / q


# -- the study -----------------------------------------------------------------------------------------

@dataclass
class Point:
    """One (network, width) point: per draw, sum_i |g_i|^2 (s1) and |sum_i g_i|^2 (q), over n examples.

    Two statistics: ``mean`` is the expected batch bound E[n s1 / q] (the headline; 95% CI of the mean
    by the normal approximation); ``ratio`` is the ratio of expectations n E[s1] / E[q], less sensitive
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
        return self.mean, self.mean - self.half_ci, self.mean + self.half_ci

    def row(self) -> dict:
        lo, hi = self.ratio_ci()
        return {"sweep": self.sweep, "kind": self.kind, "depth": self.depth, "width": self.width,
                "params": self.params, "draws": len(self.s1), "batch_bound_mean": self.mean,
                "ci95_low": self.mean - self.half_ci, "ci95_high": self.mean + self.half_ci,
                "batch_bound_sd": self.sd, "batch_bound_median": float(np.median(self.values)),
                "ratio_of_expectations": self.ratio, "ratio_ci95_low": lo, "ratio_ci95_high": hi}


def _plan(cfg) -> list[tuple[str, str, int, int]]:
    """(sweep, kind, depth, width) of every point, in report order."""
    plan = []
    for kind, depth in [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))]:
        for w in cfg.widths:
            plan.append(("width", kind, depth, int(w)))
    for kind in cfg.kinds:
        for depth in cfg.depths:
            plan.append(("depth", kind, int(depth), int(cfg.fixed_width)))
    for kind in cfg.kinds:
        for depth in cfg.depths:
            plan.append(("budget", kind, int(depth), width_for_budget(cfg.input_dim, int(depth), int(cfg.budget))))
    return plan


def run_points(cfg) -> list[Point]:
    """Every point of the three sweeps; draws are seeded by (seed, point index) so points are independent."""
    points = []
    plan = _plan(cfg)
    start = time.time()
    for i, (sweep, kind, depth, width) in enumerate(plan):
        rng = np.random.default_rng([int(cfg.seed), i])
        draws = np.array([draw_norms(rng, kind, cfg.input_dim, depth, width, cfg.n_samples,
                                     cfg.get("label_noise", 0.0)) for _ in range(cfg.n_inits)])
        p = Point(sweep, kind, depth, width, param_count(cfg.input_dim, depth, width), cfg.n_samples,
                  draws[:, 0], draws[:, 1])
        points.append(p)
        logging.info("theory %d/%d %s %s L=%d w=%d P=%d: batch bound %.2f +- %.2f (%.1fs)", i + 1, len(plan),
                     sweep, kind, depth, width, p.params, p.mean, p.half_ci, time.time() - start)
    return points


def trend(xs, points: list[Point], statistic: str = "mean") -> str:
    """'grows', 'falls' or 'no clear trend' along xs: the endpoints' 95% intervals must not overlap and
    the least-squares slope of log(statistic) on log(x) must agree in sign."""
    if len(points) < 2:
        return "no clear trend"
    first, last = points[0].interval(statistic), points[-1].interval(statistic)
    values = np.array([p.interval(statistic)[0] for p in points])
    if np.any(values <= 0):
        return "no clear trend"
    slope = np.polyfit(np.log(np.asarray(xs, float)), np.log(values), 1)[0]
    if last[1] > first[2] and slope > 0:
        return "grows"
    if last[2] < first[1] and slope < 0:
        return "falls"
    return "no clear trend"


def _group(points, sweep, kind, depth=None):
    sel = [p for p in points if p.sweep == sweep and p.kind == kind and (depth is None or p.depth == depth)]
    return sorted(sel, key=lambda p: (p.width, p.depth) if sweep == "width" else (p.depth, p.width))


def _label(kind, depth):
    return f"{depth}-layer {'ReLU' if kind == 'relu' else 'linear'}"


def summarize(points: list[Point], cfg, statistic: str = "mean") -> dict:
    """The computed trends: {'width': {label: trend}, 'depth': {...}, 'budget': {...}}."""
    out = {"width": {}, "depth": {}, "budget": {}}
    for kind, depth in [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))]:
        g = _group(points, "width", kind, depth)
        out["width"][_label(kind, depth)] = trend([p.width for p in g], g, statistic)
    for kind in cfg.kinds:
        g = _group(points, "depth", kind)
        out["depth"][kind] = trend([p.depth for p in g], g, statistic)
        g = _group(points, "budget", kind)
        out["budget"][kind] = trend([p.depth for p in g], g, statistic)
    return out


def _trend_sentences(summary: dict, cfg) -> str:
    w, d, b = summary["width"], summary["depth"], summary["budget"]
    return (f"at fixed depth it {'; '.join(f'{t} with width for {label} networks' for label, t in w.items())}"
            f"; at fixed width {cfg.fixed_width} it {'; '.join(f'{t} with depth for {k} networks' for k, t in d.items())}"
            f"; at a fixed parameter count (about {int(cfg.budget):,}) it "
            f"{'; '.join(f'{t} with depth for {k} networks' for k, t in b.items())}.")


def verdict(summary: dict, cfg, ratio_summary: dict | None = None) -> str:
    """One paragraph computed from the trends (never hard-coded)."""
    text = "Expected batch bound at initialisation (mean over draws): " + _trend_sentences(summary, cfg)
    w, b = summary["width"], summary["budget"]
    linear_deep = b.get("linear")
    wide_linear = [t for label, t in w.items() if "linear" in label]
    if linear_deep == "falls" and all(t == "grows" for t in wide_linear):
        text += (" For linear networks this agrees with the paper's theory: wider networks admit larger "
                 "batches, and at a fixed parameter budget deeper (hence narrower) ones admit smaller ones.")
    elif linear_deep == "grows" or any(t == "falls" for t in wide_linear):
        text += " For linear networks this contradicts the paper's theory."
    else:
        text += " For linear networks the paper's theory is not clearly confirmed at this sample size."
    relu = [t for label, t in w.items() if "ReLU" in label] + [b.get("relu")]
    relu = [t for t in relu if t is not None]
    if relu:
        text += (f" For ReLU networks (2-layer width sweep: {relu[0]}; fixed budget, with depth: "
                 f"{b.get('relu', 'n/a')}).")
    if ratio_summary is not None:
        text += (" With the ratio of expectations n E[sum|g_i|^2] / E[|sum g_i|^2] instead: "
                 + _trend_sentences(ratio_summary, cfg))
    return text


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def render_markdown(points: list[Point], cfg, summary: dict, ratio_summary: dict, elapsed_s: float) -> str:
    lines = ["# Theory check: batch bound at random initialisation", "",
             "Expected batch bound n * sum_i |g_i|^2 / |sum_i g_i|^2 (Yin et al. 2018) of bias-free "
             "fully-connected networks at random initialisation (LeCun normal for linear layers, He normal "
             "before a ReLU), with Gaussian inputs, a linear teacher y = beta.x and the squared loss; exact "
             "analytic per-example gradients, no training.", "",
             "## Design", "",
             f"- input dimension d = {cfg.input_dim}, one output, n = {cfg.n_samples} examples per draw, "
             f"{cfg.n_inits} independent draws (teacher, data, initialisation) per point, seed {cfg.seed}, "
             f"label noise {cfg.get('label_noise', 0.0)};",
             f"- width sweep: widths {list(cfg.widths)} at depth 2 (linear and ReLU) and depth "
             f"{cfg.deep_depth} (linear); the parameter count grows with the width;",
             f"- depth sweep: depths {list(cfg.depths)} at width {cfg.fixed_width};",
             f"- fixed budget: P = d w + (L - 2) w^2 + w ~ {int(cfg.budget):,} parameters, width solved "
             f"per depth L in {list(cfg.depths)} (L = 2: the 2-layer network); deep ReLU networks are "
             f"beyond the paper's theory and shown for comparison;",
             "- interval: 95% confidence interval of the mean, mean +- 1.96 sd / sqrt(draws). A trend is "
             "called 'grows'/'falls' when the 95% intervals at the two ends do not overlap and the log-log "
             "slope agrees; otherwise 'no clear trend'.", "",
             "## Verdict", "", verdict(summary, cfg, ratio_summary), ""]
    titles = {"width": "Width sweep at fixed depth", "depth": f"Depth sweep at width {cfg.fixed_width}",
              "budget": f"Fixed parameter budget (~{int(cfg.budget):,})"}
    for sweep in ("width", "depth", "budget"):
        lines += [f"## {titles[sweep]}", "",
                  "| network | depth L | width w | params | batch bound (mean) | 95% CI | median "
                  "| ratio of expectations | 95% CI (bootstrap) |",
                  "|---|---:|---:|---:|---:|---|---:|---:|---|"]
        for p in [p for p in points if p.sweep == sweep]:
            r = p.row()
            lines.append(f"| {p.kind} | {p.depth} | {p.width} | {p.params:,} | {_fmt(r['batch_bound_mean'])} | "
                         f"[{_fmt(r['ci95_low'])}, {_fmt(r['ci95_high'])}] | {_fmt(r['batch_bound_median'])} | "
                         f"{_fmt(r['ratio_of_expectations'])} | [{_fmt(r['ratio_ci95_low'])}, "
                         f"{_fmt(r['ratio_ci95_high'])}] |")
        lines += ["", "Trend of the mean: " + "; ".join(f"{k}: {v}" for k, v in summary[sweep].items())
                  + ". Trend of the ratio of expectations: "
                  + "; ".join(f"{k}: {v}" for k, v in ratio_summary[sweep].items()) + ".", ""]
    lines += [f"Computed in {elapsed_s:.1f} s. Data: theory.csv; plot: theory.png.", ""]
    return "\n".join(lines)


def render_plot(points: list[Point], cfg) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    specs = [("width", [("linear", 2), ("relu", 2), ("linear", int(cfg.deep_depth))], "width w",
              "fixed depth: width sweep"),
             ("depth", [(k, None) for k in cfg.kinds], "depth L", f"fixed width {cfg.fixed_width}: depth sweep"),
             ("budget", [(k, None) for k in cfg.kinds], "depth L (width solved for the budget)",
              f"fixed budget ~{int(cfg.budget):,} parameters")]
    for ax, (sweep, groups, xlabel, title) in zip(axes, specs):
        for gi, (kind, depth) in enumerate(groups):
            g = _group(points, sweep, kind, depth)
            xs = [p.width if sweep == "width" else p.depth for p in g]
            label = _label(kind, depth) if depth is not None else kind
            ax.errorbar(xs, [p.mean for p in g], yerr=[p.half_ci for p in g], marker="o", capsize=3,
                        label=label)
            if sweep == "budget" and gi == 0:  # the widths are the same for every kind
                for p, x in zip(g, xs):
                    ax.annotate(f"w={p.width}", (x, p.mean), textcoords="offset points", xytext=(3, 4),
                                fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("batch bound (mean, 95% CI)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Batch bound at random initialisation (d={cfg.input_dim}, n={cfg.n_samples}, "
                 f"{cfg.n_inits} draws per point)")
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

    Returns {'points': [row dicts], 'summary': trends of the mean, 'ratio_summary': trends of the
    ratio of expectations, 'verdict': str, 'paths': {...}}.
    """
    import tensorflow as tf  # only for tf.io.gfile (gs:// workdirs)

    cfg = config.theory
    start = time.time()
    logging.info("theory: %d points x %d draws, n=%d, d=%d", len(_plan(cfg)), cfg.n_inits, cfg.n_samples,
                 cfg.input_dim)
    points = run_points(cfg)
    summary = summarize(points, cfg)
    ratio_summary = summarize(points, cfg, "ratio")
    elapsed = time.time() - start
    report_dir = f"{workdir.rstrip('/')}/report"
    tf.io.gfile.makedirs(report_dir)
    paths = {ext: f"{report_dir}/theory.{ext}" for ext in ("md", "csv", "png")}
    with tf.io.gfile.GFile(paths["csv"], "w") as f:
        f.write(render_csv(points))
    with tf.io.gfile.GFile(paths["png"], "wb") as f:
        f.write(render_plot(points, cfg))
    text = verdict(summary, cfg, ratio_summary)
    with tf.io.gfile.GFile(paths["md"], "w") as f:
        f.write(render_markdown(points, cfg, summary, ratio_summary, elapsed))
    logging.info("theory: %s", text)
    logging.info("theory: wrote %s (%.1fs)", ", ".join(paths.values()), elapsed)
    return {"points": [p.row() for p in points], "summary": summary, "ratio_summary": ratio_summary,
            "verdict": text, "paths": paths}
