"""A study's report from its WORKDIR alone: report.md, CSV tables, PNG plots, TensorBoard HParams and images.

Reads WORKDIR/config.json and WORKDIR/results/ (or a legacy results.jsonl) through tf.io.gfile (so gs:// works) and writes
WORKDIR/report/. Never imports train.py: a report can be made on a laptop from a TPU study's bucket.

    python -m wide_tf.report --workdir=runs/mlp_local [--eps=0.25]
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys

# The report writes files only; an interactive backend would need a display (absent on TPU VMs).
import matplotlib  # noqa: E402
import numpy as np

from wide_tf import analysis
from wide_tf import workdir as wd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The CLI's output should be the report path or one error line, not TensorFlow's C++ start-up log;
# setdefault leaves a user's own choice alone, and has no effect once TensorFlow is loaded.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

REPORT_DIR = wd.REPORT  # the workdir layout has one owner: wide_tf/workdir.py
TRIAL_COLUMNS = [
    "trial_id",
    "member",
    "arch",
    "depth",
    "width",
    "params",
    "batch_size",
    "lr_multiplier",
    "learning_rate",
    "optimizer",
    "seed",
    "num_train",
    "status",
    "steps_to_target",
    "epochs_to_target",
    "examples_to_target",
    "steps",
    "epochs",
    "final_train_accuracy",
    "final_train_loss",
    "final_test_accuracy",
    "final_test_loss",
    "best_test_accuracy",
    "wall_time_s",
    "examples_per_s",
]
BEST_COLUMNS = [
    "member",
    "arch",
    "depth",
    "width",
    "params",
    "batch_size",
    "best_learning_rate",
    "best_lr_multiplier",
    "n_seeds",
    "steps_to_target",
    "steps_min",
    "steps_max",
    "censored_above",
    "epochs_to_target",
    "epochs_min",
    "epochs_max",
    "n_censored_seeds",
    "n_diverged_excluded",
    "lr_grid",
    "lr_at_grid_edge",
    "n_trials",
    "n_reached",
    "n_not_reached",
    "n_diverged",
    "best_test_accuracy_any_lr",
]
MEMBER_COLUMNS = [
    "member",
    "arch",
    "depth",
    "width",
    "params",
    "eps",
    "b_crit",
    "b_crit_low",
    "b_crit_high",
    "b_crit_beyond_range",
    "s_min",
    "s_min_low",
    "s_min_high",
    "fit_r2_log_epochs",
    "fit_rms_log_steps",
    "fit_observations",
    "fit_censored",
    "fit_reason",
    "max_batch",
    "max_batch_low",
    "max_batch_high",
    "max_batch_status",
    "reference_epochs",
    "threshold_epochs",
    "batch_bound_init",
    "batch_bound_init_std",
    "noise_scale_ema",
    "n_edge_cells",
    "n_diverged_excluded",
]


class ReportError(RuntimeError):
    """The workdir cannot be reported on (missing, or holds no study)."""


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------


def read_workdir(workdir: str) -> tuple[dict | None, list[dict], int]:
    """(config dict or None, records, number of unparseable result lines)."""
    if not tf.io.gfile.isdir(workdir):
        raise ReportError(f"workdir {workdir!r} does not exist or is not a directory")
    cfg_path = wd.join(workdir, wd.CONFIG)
    has_cfg = tf.io.gfile.exists(cfg_path)
    has_res = tf.io.gfile.exists(wd.join(workdir, wd.RESULTS)) or tf.io.gfile.isdir(
        wd.join(workdir, wd.RESULTS_DIR)
    )
    if not has_cfg and not has_res:
        raise ReportError(f"{workdir!r} holds neither config.json nor results: not a study workdir")
    config = None
    if has_cfg:
        try:
            with tf.io.gfile.GFile(cfg_path, "r") as f:
                config = json.loads(f.read())
        except json.JSONDecodeError as e:
            raise ReportError(f"{cfg_path} is not valid JSON ({e})") from None
    records, bad = [], 0
    if has_res:  # results/<trial_id>.json (and a legacy results.jsonl), through workdir.py
        found, bad = wd.read_results_counted(workdir)
        records = [r for r in found if "member" in r and "batch_size" in r]
        bad += len(found) - len(records)
    return config, records, bad


def _get(cfg: dict | None, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def eps_from_config(config: dict | None) -> float:
    for key in ("report.eps", "analysis.eps", "sweep.eps", "sweep.max_batch_eps", "eps"):
        v = _get(config, key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return analysis.DEFAULT_EPS


def protocol_rows(config: dict | None, records: list[dict], eps: float) -> list[tuple[str, str]]:
    """The protocol settings that produced the study, as (setting, value) rows."""
    rows: list[tuple[str, str]] = []

    def add(label, *parts):
        parts = [p for p in parts if p not in (None, "", [])]
        if parts:
            rows.append((label, " ".join(str(p) for p in parts)))

    if config is None:
        proto = next((r.get("protocol") for r in records if r.get("protocol")), None) or {}
        rows.append(
            ("config.json", "missing; settings below come from the trials' 'protocol' records")
        )
        for k, v in sorted(proto.items()):
            rows.append((str(k), json.dumps(v) if isinstance(v, (dict, list)) else str(v)))
        rows.append(("eps (max_batch)", f"{eps:g}"))
        return rows
    metric = _get(config, "train.target_metric")
    value = _get(config, "train.target_value")
    if metric:
        op = "<=" if "loss" in str(metric) else ">="
        add(
            "Target",
            f"{metric} {op} {value}",
            "(first seen at an evaluation; the crossing interpolated between it and the one before)",
        )
    add(
        "Budget",
        f"{_get(config, 'train.max_epochs')} epochs" if _get(config, "train.max_epochs") else None,
        f"/ {_get(config, 'train.max_steps')} steps" if _get(config, "train.max_steps") else None,
        f"(at least {_get(config, 'train.min_steps')} steps at every batch size)"
        if _get(config, "train.min_steps")
        else None,
    )
    every = _get(config, "train.eval_every_examples")
    limit = _get(config, "train.eval_train_limit")
    if every is not None:
        add(
            "Evaluation cadence",
            f"every {every} examples" if every else "once per epoch",
            f"(training metric on the first {limit} training examples)" if limit else None,
        )
    add(
        "Divergence",
        f"loss > {_get(config, 'train.diverge_loss')} or non-finite"
        if _get(config, "train.diverge_loss") is not None
        else None,
    )
    o = _get(config, "optim", {}) or {}
    opt = [o.get("name")]
    if o.get("name") in ("momentum", "nesterov", "lars"):
        opt.append(f"momentum {o.get('momentum')}")
    if o.get("weight_decay"):
        opt.append(f"weight decay {o.get('weight_decay')}")
    if o.get("name") == "lars":
        opt.append(
            f"eta {o.get('lars_eta')}, trust ratio '{o.get('lars_trust_ratio')}', "
            f"epsilon {o.get('lars_epsilon')}, clip {o.get('lars_clip')}"
        )
    add("Optimizer", ", ".join(str(p) for p in opt if p is not None))
    if o.get("base_lr") is not None:
        add(
            "Learning rate",
            f"base {o.get('base_lr')} at batch {o.get('reference_batch')}, scaling rule "
            f"'{o.get('scaling')}', grid of multipliers {_get(config, 'sweep.lr_multipliers')}",
        )
    sched = o.get("schedule")
    if sched:
        extra = ""
        if sched == "multistep":
            extra = f" (decay x{o.get('decay_factor')} at epochs {o.get('decay_epochs')})"
        elif sched == "polynomial":
            extra = f" (power {o.get('poly_power')}, end at {o.get('end_lr_fraction')} x peak)"
        elif sched == "cosine":
            extra = f" (end at {o.get('end_lr_fraction')} x peak)"
        add("Schedule", f"{sched}{extra}")
    if o.get("warmup_fixed") is not None or o.get("warmup_epochs") or o.get("warmup_steps"):
        held = o.get("warmup_fixed")
        amount = (
            f"{o.get('warmup_epochs')} epochs"
            if held == "epochs"
            else f"{o.get('warmup_steps')} steps"
            if held == "steps"
            else f"{o.get('warmup_epochs')} epochs / {o.get('warmup_steps')} steps"
        )
        add("Warm-up", f"{amount}, held fixed in {held} across batch sizes")
    norm = _get(config, "model.norm")
    if norm:
        add(
            "Normalisation",
            norm,
            f"(virtual batch {_get(config, 'model.ghost_batch_size')})"
            if norm == "ghost"
            else None,
        )
    d = _get(config, "data", {}) or {}
    n_seen = sorted({int(r["num_train"]) for r in records if r.get("num_train")})
    if d:
        add(
            "Data",
            d.get("name"),
            f"num_train={d.get('num_train')} (0 = all)",
            f"(n_train in the trials: {', '.join(map(str, n_seen))})" if n_seen else None,
            f"augment={d.get('augment')}",
            f"shuffle buffer {d.get('shuffle_buffer')} (fixed)",
        )
    add("Batch sizes", _get(config, "sweep.batch_sizes"))
    add(
        "Seeds",
        f"tuning {_get(config, 'sweep.seeds')}, confirmation of the chosen rate "
        f"{_get(config, 'sweep.confirm_seeds') or 'none'} (a cell is the median over its seeds)",
    )
    if _get(config, "train.max_device_batch"):
        add(
            "Gradient accumulation",
            f"micro-batches of at most {_get(config, 'train.max_device_batch')}",
        )
    if _get(config, "train.gradient_every_examples"):
        add(
            "Gradient statistics",
            f"every {_get(config, 'train.gradient_every_examples')} examples on a probe "
            f"set of {_get(config, 'train.probe_size')}",
        )
    add("Precision", _get(config, "runtime.mixed_precision"))
    sweep = _get(config, "sweep", {}) or {}
    fam = {
        k: v
        for k, v in sweep.items()
        if k not in ("batch_sizes", "seeds", "confirm_seeds", "lr_multipliers")
    }
    if fam:
        add("Family / sweep", json.dumps(fam, sort_keys=True))
    rows.append(("eps (max_batch)", f"{eps:g}"))
    return rows


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else repr(v)
    return v


def trial_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in sorted(
        records,
        key=lambda r: (
            r.get("member", ""),
            r.get("batch_size", 0),
            r.get("learning_rate") or 0,
            r.get("seed") or 0,
        ),
    ):
        final = r.get("final") or {}
        row = {k: r.get(k) for k in TRIAL_COLUMNS}
        for k in ("train_accuracy", "train_loss", "test_accuracy", "test_loss"):
            row[f"final_{k}"] = final.get(k)
        rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def best_rows(summaries) -> list[dict]:
    """One row per (member, batch size): the chosen learning rate and its seeds."""
    rows = []
    for s in summaries:
        for c in s.cells:
            rng = c.steps_range
            rows.append(
                {
                    k: _cell(v)
                    for k, v in {
                        "member": s.info.name,
                        "arch": s.info.arch,
                        "depth": s.info.depth,
                        "width": s.info.width,
                        "params": s.info.params,
                        "batch_size": c.batch_size,
                        "best_learning_rate": c.learning_rate,
                        "best_lr_multiplier": c.best_multiplier,
                        "n_seeds": c.n_seeds,
                        "steps_to_target": c.median_steps,
                        "steps_min": rng[0] if rng else None,
                        "steps_max": rng[1] if rng else None,
                        "censored_above": c.censored_bound,
                        "epochs_to_target": c.epochs_to_target,
                        "epochs_min": c.epochs(rng[0]) if rng else None,
                        "epochs_max": c.epochs(rng[1]) if rng else None,
                        "n_censored_seeds": len(c.censored_budgets),
                        "n_diverged_excluded": c.n_diverged_excluded,
                        "lr_grid": " ".join(f"{p.multiplier:g}" for p in c.grid),
                        "lr_at_grid_edge": c.lr_at_grid_edge,
                        "n_trials": c.n_trials,
                        "n_reached": c.n_reached,
                        "n_not_reached": c.n_not_reached,
                        "n_diverged": c.n_diverged,
                        "best_test_accuracy_any_lr": c.best_test_accuracy_any_lr,
                    }.items()
                }
            )
    return rows


def _iv(iv):
    return (None, None, None) if iv is None else (iv.value, iv.low, iv.high)


def member_rows(summaries, eps: float) -> list[dict]:
    """One row per member: B_crit, S_min and max_batch(eps) with their 95% intervals."""
    rows = []
    for s in summaries:
        cv = s.curve
        f = cv.fit if cv else None
        bc, sm, mb = (
            (_iv(cv.b_crit), _iv(cv.s_min), _iv(cv.max_batch)) if cv else ((None,) * 3,) * 3
        )
        beyond = (
            ("above" if cv.b_crit.above_range else "below" if cv.b_crit.below_range else "")
            if cv and cv.b_crit
            else ""
        )
        rows.append(
            {
                k: _cell(v)
                for k, v in {
                    "member": s.info.name,
                    "arch": s.info.arch,
                    "depth": s.info.depth,
                    "width": s.info.width,
                    "params": s.info.params,
                    "eps": eps,
                    "b_crit": bc[0],
                    "b_crit_low": bc[1],
                    "b_crit_high": bc[2],
                    "b_crit_beyond_range": beyond,
                    "s_min": sm[0],
                    "s_min_low": sm[1],
                    "s_min_high": sm[2],
                    "fit_r2_log_epochs": f.r2_log_epochs if f else None,
                    "fit_rms_log_steps": f.rms_log if f else None,
                    "fit_observations": f.n_obs if f else None,
                    "fit_censored": f.n_censored if f else None,
                    "fit_reason": cv.fit_reason if cv else "no run finished",
                    "max_batch": mb[0],
                    "max_batch_low": mb[1],
                    "max_batch_high": mb[2],
                    "max_batch_status": cv.max_batch_reason if cv else None,
                    "reference_epochs": cv.reference_epochs if cv else None,
                    "threshold_epochs": cv.threshold_epochs if cv else None,
                    "batch_bound_init": s.batch_bound_init,
                    "batch_bound_init_std": s.batch_bound_init_std,
                    "noise_scale_ema": s.noise_scale_ema,
                    "n_edge_cells": len(s.edge_cells),
                    "n_diverged_excluded": s.n_diverged_excluded,
                }.items()
            }
        )
    return rows


def _write_csv(path: str, columns: list[str], rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(buf.getvalue())


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def _colors(n: int):
    # Ordered colours (dark = narrow, bright = wide) so width reads off every plot.
    cmap = plt.get_cmap("viridis")
    return [cmap(0.1 + 0.75 * i / max(n - 1, 1)) for i in range(n)]


def _label(s) -> str:
    w = s.info.width
    return f"{s.info.name} (width {w:g})" if isinstance(w, (int, float)) else s.info.name


def _log2_axis(ax, axis="x"):
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(fmt)


def _no_data(ax, what: str) -> None:
    # An empty log axis cannot be drawn; say why the panel is empty instead.
    ax.set_xscale("linear")
    ax.set_yscale("linear")
    ax.text(
        0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.4"
    )


def _width_ticks(ax, summaries) -> None:
    # Family widths are rarely powers of two: tick exactly the members' widths.
    ws = sorted({float(s.info.width) for s in summaries if isinstance(s.info.width, (int, float))})
    if 0 < len(ws) <= 12:
        ax.set_xticks(ws)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _mark_unreached(ax, s, color, labelled: list):
    # Batches whose median seed did not reach the target within its budget are censored: draw an
    # upward triangle at the budget (S is larger than that). Cells where every run diverged have
    # no value at all: mark them on the x axis.
    cens = [(c.batch_size, c.censored_bound) for c in s.cells if c.censored_bound is not None]
    if cens:
        label = None if "cens" in labelled else "censored: did not reach within budget (S > marker)"
        labelled.append("cens")
        ax.plot(
            *zip(*cens),
            linestyle="none",
            marker="^",
            markersize=8,
            markerfacecolor="none",
            color=color,
            label=label,
        )
    xs = [c.batch_size for c in s.cells if c.median_steps is None and c.censored_bound is None]
    if xs:
        label = None if "none" in labelled else "no value (every run diverged)"
        labelled.append("none")
        ax.plot(
            xs,
            [0.03] * len(xs),
            linestyle="none",
            marker="x",
            markersize=8,
            color=color,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label=label,
        )


def _seed_points(s, epochs: bool):
    """(batch, median, low, high) of the cells with a median; low/high span the seeds."""
    out = []
    for c in s.cells:
        if c.median_steps is None:
            continue
        lo, hi = c.steps_range
        conv = c.epochs if epochs else (lambda v: v)
        out.append((c.batch_size, conv(c.median_steps), conv(lo), conv(hi)))
    return out


def _draw_medians(ax, s, col, epochs: bool) -> None:
    pts = _seed_points(s, epochs)
    if not pts:
        return
    b, m, lo, hi = map(np.array, zip(*pts))
    ax.errorbar(b, m, yerr=[m - lo, hi - m], fmt="o", color=col, capsize=3, label=_label(s))


def plot_steps(summaries, colors, outdir, target, nothing):
    """Steps to target vs batch: seed medians and ranges, the fitted curve with its 95% band, and
    the perfect-scaling line from the smallest batch."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    marked: list = []
    for s, col in zip(summaries, colors):
        _draw_medians(ax, s, col, epochs=False)
        cv = s.curve
        if cv is not None and cv.fit is not None:
            g = cv.band_batches
            ax.plot(
                g, cv.fit.s_min * (1 + cv.fit.b_crit / g), "-", color=col, alpha=0.8, linewidth=1
            )
            ax.fill_between(g, cv.band_low, cv.band_high, color=col, alpha=0.15, linewidth=0)
        pts = _seed_points(s, epochs=False)
        if pts:
            bb = np.array([c.batch_size for c in s.cells], dtype=float)
            ax.plot(bb, pts[0][1] * pts[0][0] / bb, ":", color=col, alpha=0.6)
        _mark_unreached(ax, s, col, marked)
    ax.plot([], [], "k-", alpha=0.8, linewidth=1, label="fit S_min (1 + B_crit / B), 95% band")
    ax.plot([], [], "k:", alpha=0.6, label="perfect scaling S ~ 1/B")
    return _finish_batch_plot(
        fig,
        ax,
        outdir,
        "steps_vs_batch.png",
        "Steps to target vs batch size (log-log)",
        "steps to target (median over seeds; bars: seed range)",
        f"Steps to reach {target} vs batch size (best LR per batch)",
        nothing=nothing,
        log_y=True,
    )


def plot_epochs(summaries, colors, outdir, eps, nothing):
    """Epochs to target vs batch: flat while scaling is perfect; max_batch(eps) marked with its
    interval on each member's (1 + eps) threshold."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    marked: list = []
    for s, col in zip(summaries, colors):
        _draw_medians(ax, s, col, epochs=True)
        cv = s.curve
        if cv is not None and cv.fit is not None and s.cells and s.cells[0].num_train:
            g = cv.band_batches
            n = s.cells[0].num_train
            ax.plot(
                g, cv.fit.s_min * (g + cv.fit.b_crit) / n, "-", color=col, alpha=0.8, linewidth=1
            )
            ax.fill_between(
                g, cv.band_low * g / n, cv.band_high * g / n, color=col, alpha=0.15, linewidth=0
            )
        if cv is not None and cv.threshold_epochs is not None:
            ax.axhline(cv.threshold_epochs, color=col, linestyle=":", alpha=0.6, linewidth=1)
            mb = cv.max_batch
            if mb is not None and mb.low is not None:
                ax.errorbar(
                    [mb.value],
                    [cv.threshold_epochs],
                    xerr=[[mb.value - mb.low], [mb.high - mb.value]],
                    fmt="*",
                    markersize=13,
                    color=col,
                    capsize=4,
                )
            elif mb is not None:
                ax.plot([mb.value], [cv.threshold_epochs], "*", markersize=13, color=col)
        _mark_unreached(ax, s, col, marked)
    ax.plot([], [], "k:", alpha=0.6, label=f"(1 + eps) x E_ref, eps = {eps:g}")
    ax.plot([], [], "k*", linestyle="none", markersize=10, label="max_batch(eps), 95% interval")
    return _finish_batch_plot(
        fig,
        ax,
        outdir,
        "epochs_vs_batch.png",
        "Epochs to target vs batch size",
        "epochs to target (median over seeds; bars: seed range)",
        "Epochs to target vs batch size (flat = perfect scaling)",
        nothing=nothing,
        log_y=True,
    )


def _plain_log_axis(ax, axis: str) -> None:
    # Plain-number ticks on a log axis of any range (a narrow range has no decade tick to label).
    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    a.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(fmt)
    a.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plot_batch_vs_width(summaries, outdir, eps, verdicts):
    """B_crit and max_batch(eps) against width with 95% intervals; values beyond the batches
    tried are drawn as arrows at the range edge; the slope across members in the title."""
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6))
    panels = (
        ("b_crit", "B_crit (examples per step)", "Critical batch size B_crit", "b_crit_slope"),
        (
            "max_batch",
            f"max_batch(eps={eps:g}) (examples per step)",
            f"Largest batch without slow-down (eps={eps:g})",
            "max_batch_slope",
        ),
    )
    for ax, (field, ylabel, title, slope_name) in zip(axes, panels):
        drawn = False
        for i, arch in enumerate(sorted({s.info.arch for s in summaries})):
            mine = [
                s
                for s in summaries
                if s.info.arch == arch
                and isinstance(s.info.width, (int, float))
                and s.curve is not None
                and getattr(s.curve, field) is not None
            ]
            for s in mine:
                iv = getattr(s.curve, field)
                w = float(s.info.width)
                col = f"C{i}"
                v = min(max(iv.value, iv.range_lo), iv.range_hi)
                if iv.is_bound:
                    ax.plot([w], [v], "^" if iv.above_range else "v", color=col, markersize=10)
                else:
                    lo = max(iv.low, iv.range_lo / 2) if iv.low is not None else v
                    hi = min(iv.high, iv.range_hi * 2) if iv.high is not None else v
                    ax.errorbar([w], [v], yerr=[[v - lo], [hi - v]], fmt="o", color=col, capsize=4)
                ax.annotate(
                    f"depth {s.info.depth}",
                    (w, v),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(5, 4),
                )
                drawn = True
            sl = getattr(verdicts.get(arch).decision, slope_name) if verdicts.get(arch) else None
            if sl is not None and mine:
                ws = np.array([float(s.info.width) for s in mine])
                pts = np.log(
                    [
                        min(
                            max(getattr(s.curve, field).value, getattr(s.curve, field).range_lo),
                            getattr(s.curve, field).range_hi,
                        )
                        for s in mine
                    ]
                )
                c0 = pts.mean() - sl.value * np.log(ws).mean()
                g = np.geomspace(ws.min(), ws.max(), 20)
                ax.plot(
                    g,
                    np.exp(c0 + sl.value * np.log(g)),
                    "--",
                    color=f"C{i}",
                    alpha=0.6,
                    label=f"{arch}: slope {sl.value:+.2f} [{sl.low:+.2f}, {sl.high:+.2f}]",
                )
        if drawn:
            _plain_log_axis(ax, "x")
            _plain_log_axis(ax, "y")
            _width_ticks(ax, summaries)
        else:
            _no_data(ax, "undefined for every member (see the tables)")
        ax.set_xlabel("width (units per layer; WRN: widening factor k)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.plot([], [], "k^", label="beyond the batches tried (bound)")
        ax.legend(fontsize=7)
    return (
        "batch_vs_width.png",
        "B_crit and max_batch(eps) vs width, with 95% intervals",
        _save(fig, os.path.join(outdir, "batch_vs_width.png")),
    )


def _plain_log_y(ax) -> None:
    # Log axes label "2x10^2" by default; researchers read plain numbers faster. Narrow ranges
    # get labelled 2 and 5 minor ticks, wide ranges only decades.
    if ax.get_yscale() != "log":
        return
    lo, hi = ax.get_ylim()
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    if lo > 0 and hi / lo < 30:
        ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(fmt)
    else:
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _save(fig, path: str) -> bytes:
    for ax in fig.axes:
        if ax.get_yscale() == "log" and not isinstance(
            ax.yaxis.get_major_formatter(), matplotlib.ticker.FuncFormatter
        ):
            _plain_log_y(ax)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
    return data


def _finish_batch_plot(fig, ax, outdir, filename, caption, ylabel, title, *, nothing, log_y):
    """The common end of the plots against batch size: log2 batch axis (or a note saying why the
    panel is empty), labels, grid, legend; saves the figure and returns its (file, caption, path)."""
    if nothing is None:
        _log2_axis(ax)
        if log_y:
            ax.set_yscale("log")
    else:
        _no_data(ax, nothing)
    ax.set_xlabel("batch size B (examples per step)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return filename, caption, _save(fig, os.path.join(outdir, filename))


def make_plots(
    summaries, records, eps: float, target: str, outdir: str, verdicts: dict | None = None
) -> list[tuple[str, str, bytes]]:
    """Writes the PNGs; returns (file name, caption, png bytes) for each."""
    plots = []
    if not summaries:
        return plots
    colors = _colors(len(summaries))
    verdicts = verdicts or {}
    any_reached = any(c.median_steps is not None for s in summaries for c in s.cells)
    nothing = "no learning rate reached the target at any batch size"

    plots.append(plot_steps(summaries, colors, outdir, target, None if any_reached else nothing))
    plots.append(plot_epochs(summaries, colors, outdir, eps, None if any_reached else nothing))
    plots.append(plot_batch_vs_width(summaries, outdir, eps, verdicts))

    # Best test accuracy vs batch.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for s, col in zip(summaries, colors):
        pts = [
            (c.batch_size, c.best_test_accuracy_any_lr)
            for c in s.cells
            if c.best_test_accuracy_any_lr is not None
        ]
        if pts:
            ax.plot(*zip(*pts), "o-", color=col, label=_label(s))
    has_accuracy = any(c.best_test_accuracy_any_lr is not None for s in summaries for c in s.cells)
    plots.append(
        _finish_batch_plot(
            fig,
            ax,
            outdir,
            "test_accuracy_vs_batch.png",
            "Best test accuracy vs batch size",
            "best test accuracy (fraction, best LR of the grid)",
            "Best test accuracy vs batch size (max over learning rates and seeds)",
            nothing=None if has_accuracy else "no test accuracy recorded",
            log_y=False,
        )
    )

    # Chosen learning rate vs batch, with grid-edge cells ringed.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    edge_labelled = False
    for s, col in zip(summaries, colors):
        pts = [
            (c.batch_size, c.learning_rate, c.lr_at_grid_edge)
            for c in s.cells
            if c.learning_rate is not None
        ]
        if pts:
            b, lr, edge = zip(*pts)
            ax.plot(b, lr, "o-", color=col, label=_label(s))
            eb = [(bi, li) for bi, li, ei in pts if ei]
            if eb:
                ax.plot(
                    *zip(*eb),
                    "o",
                    markersize=13,
                    markerfacecolor="none",
                    markeredgecolor="red",
                    label=None if edge_labelled else "at the edge of the LR grid",
                )
                edge_labelled = True
    plots.append(
        _finish_batch_plot(
            fig,
            ax,
            outdir,
            "learning_rate_vs_batch.png",
            "Chosen learning rate vs batch size",
            "chosen peak learning rate",
            "Learning rate that reaches the target in the fewest steps",
            nothing=None if any_reached else nothing,
            log_y=True,
        )
    )

    # Gradient statistics, when the trials measured them.
    with_bb = [s for s in summaries if s.batch_bound_init is not None]
    if with_bb:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for i, arch in enumerate(sorted({s.info.arch for s in with_bb})):
            mine = [
                s for s in with_bb if s.info.arch == arch and isinstance(s.info.width, (int, float))
            ]
            if mine:
                ax.errorbar(
                    [s.info.width for s in mine],
                    [s.batch_bound_init for s in mine],
                    yerr=[s.batch_bound_init_std for s in mine],
                    fmt="o-",
                    capsize=3,
                    color=f"C{i}",
                    label=f"{arch} family" if arch else "family",
                )
        _log2_axis(ax, "x")
        _width_ticks(ax, with_bb)
        ax.set_yscale("log")
        ax.set_xlabel("width (units per layer; WRN: widening factor k)")
        ax.set_ylabel("batch bound n x diversity at init (examples)")
        ax.set_title(
            "Gradient-diversity batch bound at initialisation vs width (mean +- std over trials)"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        plots.append(
            (
                "batch_bound_vs_width.png",
                "Batch bound at initialisation vs width",
                _save(fig, os.path.join(outdir, "batch_bound_vs_width.png")),
            )
        )

        fig, ax = plt.subplots(figsize=(7.5, 5))
        for s, col in zip(summaries, colors):
            rec = _representative_trial(s, records)
            hist = [
                h
                for h in ((rec or {}).get("gradient") or {}).get("history") or []
                if h.get("batch_bound") is not None and h.get("examples") is not None
            ]
            if hist:
                hist.sort(key=lambda h: h["examples"])
                x = np.array([h["examples"] for h in hist], dtype=float)
                ax.plot(
                    np.maximum(x, 1.0),
                    [h["batch_bound"] for h in hist],
                    "-",
                    color=col,
                    label=f"{_label(s)}, B={rec['batch_size']}",
                )
        ax.set_xscale(
            "symlog",
            linthresh=max(
                1.0, float(min((c.batch_size for s in summaries for c in s.cells), default=1))
            ),
        )
        ax.set_yscale("log")
        ax.set_xlabel("training examples seen")
        ax.set_ylabel("batch bound n x diversity (examples)")
        ax.set_title(
            "Batch bound during training (best-LR trial at the smallest batch, first seed)"
        )
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        plots.append(
            (
                "batch_bound_over_training.png",
                "Batch bound during training",
                _save(fig, os.path.join(outdir, "batch_bound_over_training.png")),
            )
        )
    return plots


def _representative_trial(s, records):
    """The member's chosen-rate trial at its smallest batch (first seed), else any with history."""
    mine = [
        r
        for r in records
        if r["member"] == s.info.name and ((r.get("gradient") or {}).get("history"))
    ]
    for c in s.cells:
        if c.best_multiplier is None:
            continue
        chosen = [
            r
            for r in mine
            if r["batch_size"] == c.batch_size
            and float(f"{float(r.get('lr_multiplier', 1.0)):.6g}") == c.best_multiplier
        ]
        if chosen:
            return min(chosen, key=lambda r: r.get("seed") or 0)
    return min(mine, key=lambda r: (r["batch_size"], r.get("seed") or 0), default=None)


# ----------------------------------------------------------------------------------------------
# TensorBoard
# ----------------------------------------------------------------------------------------------


def _hparams_of(rec: dict) -> dict:
    hp = {"member": rec.get("member"), "optimizer": rec.get("optimizer")}
    for k, cast in (
        ("depth", int),
        ("params", int),
        ("batch_size", int),
        ("seed", int),
        ("width", float),
        ("learning_rate", float),
        ("lr_multiplier", float),
    ):
        if rec.get(k) is not None:
            hp[k] = cast(rec[k])
    return {k: v for k, v in hp.items() if v is not None}


def _metrics_of(rec: dict) -> dict:
    final = rec.get("final") or {}
    m = {
        "steps_to_target": rec.get("steps_to_target"),
        "epochs_to_target": rec.get("epochs_to_target"),
        "final_train_accuracy": final.get("train_accuracy"),
        "final_test_accuracy": final.get("test_accuracy"),
        "best_test_accuracy": rec.get("best_test_accuracy"),
        "status_code": analysis.STATUS_CODE.get(rec.get("status")),
    }
    return {k: float(v) for k, v in m.items() if v is not None and math.isfinite(float(v))}


METRIC_DOCS = {
    "steps_to_target": "optimizer steps until the target was first reached (absent: not reached)",
    "epochs_to_target": "steps_to_target x batch / n_train",
    "final_train_accuracy": "training accuracy at the end of the run",
    "final_test_accuracy": "test accuracy at the end of the run",
    "best_test_accuracy": "best test accuracy over the run's evaluations",
    "status_code": "1 reached, 0 not reached, -1 diverged",
}


def write_tensorboard(records: list[dict], plots, tbdir: str) -> bool:
    """HParams (one run per trial) and the plots as images. False when tensorboard is not installed."""
    try:
        from tensorboard.plugins.hparams import api as hp_api
    except ImportError:
        return False
    if tf.io.gfile.exists(tbdir):  # a re-run replaces, rather than duplicates, the entries
        tf.io.gfile.rmtree(tbdir)
    hdir = os.path.join(tbdir, "hparams")
    hparams = [
        hp_api.HParam("member", hp_api.Discrete(sorted({str(r["member"]) for r in records}))),
        hp_api.HParam(
            "optimizer",
            hp_api.Discrete(
                sorted({str(r.get("optimizer")) for r in records if r.get("optimizer")})
                or ["unknown"]
            ),
        ),
    ]
    hparams += [
        hp_api.HParam(k)
        for k in (
            "depth",
            "width",
            "params",
            "batch_size",
            "learning_rate",
            "lr_multiplier",
            "seed",
        )
    ]
    metrics = [hp_api.Metric(k, display_name=k, description=d) for k, d in METRIC_DOCS.items()]
    with tf.summary.create_file_writer(hdir).as_default():
        hp_api.hparams_config(hparams=hparams, metrics=metrics)
    for i, rec in enumerate(records):
        tid = str(rec.get("trial_id") or f"trial{i}")
        writer = tf.summary.create_file_writer(os.path.join(hdir, tid))
        with writer.as_default():
            hp_api.hparams(_hparams_of(rec), trial_id=tid)
            for k, v in _metrics_of(rec).items():
                tf.summary.scalar(k, v, step=0)
        writer.close()
    if plots:
        writer = tf.summary.create_file_writer(os.path.join(tbdir, "plots"))
        with writer.as_default():
            for name, caption, png in plots:
                img = tf.image.decode_png(png, channels=4)[None]
                tf.summary.image(os.path.splitext(name)[0], img, step=0, description=caption)
        writer.close()
    return True


# ----------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------


def _f(v, fmt="{:.4g}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return fmt.format(v) if isinstance(v, float) else str(v)


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


HOW_TO_READ = """\
## How to read this report

- **Cells.** Each (member, batch size) tried a grid of learning rates on the tuning seed; the
  rate that reached the target in the fewest steps was kept (the grid was extended past an edge
  that won, upwards when runs ran out of budget, downwards when they diverged) and re-run on the
  confirmation seeds. A cell's steps-to-target is the **median over its seeds** (the crossing of
  the target interpolated between the two evaluations around it); the range spans the seeds. A run
  that ran out of budget is **censored** (S > its budget: a triangle in the plots), never given the
  budget as a value; a diverged run is excluded and counted.
- **B_crit** comes from fitting S(B) = S_min (1 + B_crit / B) in log space to every seed, censored
  runs included one-sidedly. Its 95% interval is a two-level bootstrap (cell effects and seeds
  within cells). A B_crit outside the batches tried is a bound ("> 1,024"), not a number. The fit
  quality is R^2 of log *epochs*-to-target, which has no trivial trend and fails (low or negative)
  when the curve does not have the knee shape.
- **max_batch(eps)** is where the median epochs-to-target curve, interpolated in log-log, first
  rises above (1 + eps) x E_ref (E_ref: the smallest batch's epochs), with its bootstrap interval;
  "> B" means no crossing up to the largest batch tried.
- **The verdict** is the slope of log B_crit against log width across the members, with a 95%
  bootstrap interval: *supported* when it lies above 0, *contradicted* below, *no detectable effect*
  when it holds 0. The minimum detectable slope (2.8 standard errors) says how large an effect this
  study could have seen. Values beyond the batches tried count at the range edge, which can only
  shrink a slope. On simulated studies with a known answer the rule is decisive in at most 10% of
  studies without an effect (`python -m wide_tf.simulate`; the README has the table).
"""


def _cell_steps(c) -> str:
    if c.median_steps is not None:
        rng = c.steps_range
        spread = f" ({rng[0]:.0f}-{rng[1]:.0f})" if rng and c.n_seeds > 1 else ""
        return f"{c.median_steps:.1f}{spread}"
    if c.censored_bound is not None:
        return f"> {c.censored_bound:.0f} (censored)"
    return "-"


def _cell_epochs(c) -> str:
    if c.median_steps is not None:
        rng = c.steps_range
        spread = (
            f" ({c.epochs(rng[0]):.3g}-{c.epochs(rng[1]):.3g})" if rng and c.n_seeds > 1 else ""
        )
        return f"{c.epochs_to_target:.3g}{spread}"
    if c.censored_bound is not None and c.num_train:
        return f"> {c.epochs(c.censored_bound):.3g}"
    return "-"


def md_members(summaries, eps: float) -> list[str]:
    lines = [
        f"## Members: critical batch size and largest batch without slow-down (eps = {eps:g})",
        "",
    ]
    rows = []
    for s in summaries:
        cv = s.curve
        f = cv.fit if cv else None
        rows.append(
            [
                s.info.name,
                _f(s.info.depth),
                _f(s.info.width),
                f"{s.info.params:,}" if s.info.params else "-",
                analysis.fmt_interval(cv.b_crit)
                if cv and cv.b_crit
                else f"- ({cv.fit_reason if cv else 'no data'})",
                analysis.fmt_interval(cv.s_min) if cv and cv.s_min else "-",
                _f(f.r2_log_epochs, "{:.2f}") if f else "-",
                analysis.fmt_interval(cv.max_batch)
                if cv and cv.max_batch
                else f"- ({cv.max_batch_reason if cv else 'no data'})",
                _f(cv.reference_epochs, "{:.3g}") if cv else "-",
                (f"{f.n_obs} ({f.n_censored} censored)" if f else "-"),
                _f(s.batch_bound_init),
                _f(s.noise_scale_ema),
            ]
        )
    lines += _md_table(
        [
            "member",
            "depth",
            "width",
            "params",
            "B_crit (95% CI)",
            "S_min steps (95% CI)",
            "fit R^2 (log E)",
            f"max_batch({eps:g}) (95% CI)",
            "E_ref epochs",
            "runs fitted",
            "batch bound at init",
            "noise scale (EMA)",
        ],
        rows,
    )
    return lines + [""]


def md_cells(summaries) -> list[str]:
    lines = ["## Best learning rate and seeds per batch size", ""]
    for s in summaries:
        lines += [f"### {s.info.name}", ""]
        rows = []
        for c in s.cells:
            lr = (
                "-"
                if c.learning_rate is None
                else f"{_f(c.learning_rate)} (x{c.best_multiplier:g})"
            )
            rows.append(
                [
                    c.batch_size,
                    lr + (" (edge)" if c.lr_at_grid_edge else ""),
                    " ".join(f"{p.multiplier:g}" for p in c.grid),
                    c.n_seeds,
                    _cell_steps(c),
                    _cell_epochs(c),
                    f"{c.n_reached} / {c.n_not_reached} / {c.n_diverged}",
                    _f(c.best_test_accuracy_any_lr, "{:.4f}"),
                ]
            )
        lines += _md_table(
            [
                "batch",
                "chosen LR (multiplier)",
                "multipliers tried",
                "seeds",
                "steps to target: median (seed range)",
                "epochs to target",
                "trials reached / not reached / diverged",
                "best test acc.",
            ],
            rows,
        )
        lines.append("")
    return lines


def md_edges(summaries) -> list[str]:
    edges = [(s.info.name, c) for s in summaries for c in s.edge_cells]
    lines = ["## Grid-edge warnings", ""]
    if edges:
        for m, c in edges:
            lines.append(
                f"- {m}, B={c.batch_size}: chosen multiplier x{c.best_multiplier:g} is at the "
                f"edge of the grid tried ({', '.join(f'x{p.multiplier:g}' for p in c.grid)}), "
                "after extension: its steps are an upper bound."
            )
    else:
        lines.append("None: every chosen learning rate has a tried learning rate on each side.")
    return lines + [""]


def render_markdown(config, records, n_bad, result, plots, eps, tb_written) -> str:
    summaries, verdicts = result["summaries"], result["verdicts"]
    name = _get(config, "name") or _get(config, "study") or ""
    lines = [f"# Batch-size study report{': ' + str(name) if name else ''}", ""]
    lines += [
        "Does a wider network (at a fixed parameter budget) train with larger batches before it needs more "
        "epochs? (Chen et al., NeurIPS 2018.)",
        "",
    ]
    counts = {s: sum(1 for r in records if r.get("status") == s) for s in analysis.STATUSES}
    lines.append(
        f"Finished trials: {len(records)} ({counts['reached']} reached the target, "
        f"{counts['not_reached']} not reached, {counts['diverged']} diverged)."
        + (f" {n_bad} unreadable result record(s) were skipped." if n_bad else "")
    )
    lines.append("")
    lines += ["## Verdict", ""]
    if not records:
        lines += ["No trials finished yet. Re-run the report when trials have finished.", ""]
    else:
        for arch, v in verdicts.items():
            if len(verdicts) > 1:
                lines.append(f"**{arch}**: ")
            lines += [v.text, ""]
    lines += ["## Protocol", ""]
    lines += _md_table(
        ["setting", "value"],
        [[k, str(v).replace("|", "\\|")] for k, v in protocol_rows(config, records, eps)],
    )
    lines.append("")
    if not records:
        lines += [HOW_TO_READ]
        return "\n".join(lines)
    lines += md_members(summaries, eps)
    lines += md_edges(summaries)
    lines += md_cells(summaries)
    lines += ["## Plots", ""]
    for fname, caption, _ in plots:
        lines += [f"- [{caption}]({fname})", "", f"![{caption}]({fname})", ""]
    lines += [
        "## Tables and TensorBoard",
        "",
        "- [best_per_batch.csv](best_per_batch.csv): the chosen learning rate and seeds per (member, batch)",
        "- [all_trials.csv](all_trials.csv): every finished trial",
        "- [members.csv](members.csv): B_crit, S_min, max_batch with 95% intervals, gradient statistics",
    ]
    if tb_written:
        lines.append(
            "- TensorBoard: `tensorboard --logdir=report/tb` (HParams tab: one row per trial; "
            "Images tab: these plots)"
        )
    else:
        lines.append(
            "- TensorBoard HParams not written: the `tensorboard` package is not installed."
        )
    lines += ["", HOW_TO_READ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------


def write_report(workdir: str, eps: float | None = None) -> str:
    """Writes WORKDIR/report/ and returns the path of report.md. Raises ReportError on a bad workdir."""
    config, records, n_bad = read_workdir(workdir)
    eps = eps_from_config(config) if eps is None else float(eps)
    outdir = os.path.join(workdir, REPORT_DIR)
    tf.io.gfile.makedirs(outdir)
    result = analysis.analyze(records, eps)
    summaries = result["summaries"]
    _write_csv(os.path.join(outdir, "all_trials.csv"), TRIAL_COLUMNS, trial_rows(records))
    _write_csv(os.path.join(outdir, "best_per_batch.csv"), BEST_COLUMNS, best_rows(summaries))
    _write_csv(os.path.join(outdir, "members.csv"), MEMBER_COLUMNS, member_rows(summaries, eps))
    target = (
        f"{_get(config, 'train.target_metric')} {_get(config, 'train.target_value')}"
        if _get(config, "train.target_metric")
        else "the target"
    )
    plots = make_plots(summaries, records, eps, target, outdir, result["verdicts"])
    tb_written = write_tensorboard(records, plots, os.path.join(outdir, "tb")) if records else False
    md = render_markdown(config, records, n_bad, result, plots, eps, tb_written)
    path = os.path.join(outdir, "report.md")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(md)
    return path


def main(argv=None) -> int:
    from absl import app, flags  # flags live in main() only, so importing this module defines none

    flags.DEFINE_string("workdir", None, "Study workdir (local path or gs://...).")
    flags.DEFINE_float("eps", None, "Tolerance of max_batch(eps); default: config's, else 0.25.")
    FLAGS = flags.FLAGS

    def _run(_argv):
        if not FLAGS.workdir:
            sys.stderr.write("report: --workdir is required\n")
            return 2
        try:
            path = write_report(FLAGS.workdir, FLAGS.eps)
        except (ReportError, tf.errors.OpError) as e:
            sys.stderr.write(f"report: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")
            return 1
        print(path)
        return 0

    app.run(_run, argv=argv)
    return 0


if __name__ == "__main__":
    main()
