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

import numpy as np

from wide_tf import analysis
from wide_tf import workdir as wd

# The report writes files only; an interactive backend would need a display (absent on TPU VMs).
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The CLI's output should be the report path or one error line, not TensorFlow's C++ start-up log;
# setdefault leaves a user's own choice alone, and has no effect once TensorFlow is loaded.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

REPORT_DIR = wd.REPORT  # the workdir layout has one owner: wide_tf/workdir.py
TRIAL_COLUMNS = ["trial_id", "member", "arch", "depth", "width", "params", "batch_size", "lr_multiplier",
                 "learning_rate", "optimizer", "seed", "num_train", "status", "steps_to_target",
                 "epochs_to_target", "examples_to_target", "steps", "epochs", "final_train_accuracy",
                 "final_train_loss", "final_test_accuracy", "final_test_loss", "best_test_accuracy",
                 "wall_time_s", "examples_per_s"]
BEST_COLUMNS = ["member", "arch", "depth", "width", "params", "batch_size", "best_learning_rate",
                "best_lr_multiplier", "steps_to_target", "steps_std", "epochs_to_target", "n_seeds",
                "lr_grid", "lr_at_grid_edge", "n_trials", "n_reached", "n_not_reached", "n_diverged",
                "test_accuracy_at_best_lr", "best_test_accuracy_any_lr"]
MEMBER_COLUMNS = ["member", "arch", "depth", "width", "params", "eps", "max_batch", "max_batch_at_ceiling",
                  "max_batch_reason", "reference_batch", "reference_epochs", "s_min", "b_crit", "fit_r2_log",
                  "fit_rel_rms", "fit_points", "fit_reason", "batch_bound_init", "batch_bound_init_std",
                  "noise_scale_ema", "n_edge_cells"]


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
    has_res = tf.io.gfile.exists(wd.join(workdir, wd.RESULTS)) or tf.io.gfile.isdir(wd.join(workdir, wd.RESULTS_DIR))
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
        rows.append(("config.json", "missing; settings below come from the trials' 'protocol' records"))
        for k, v in sorted(proto.items()):
            rows.append((str(k), json.dumps(v) if isinstance(v, (dict, list)) else str(v)))
        rows.append(("eps (max_batch)", f"{eps:g}"))
        return rows
    metric = _get(config, "train.target_metric")
    value = _get(config, "train.target_value")
    if metric:
        op = "<=" if "loss" in str(metric) else ">="
        add("Target", f"{metric} {op} {value}", "(first time reached at an evaluation)")
    add("Budget", f"{_get(config, 'train.max_epochs')} epochs" if _get(config, "train.max_epochs") else None,
        f"/ {_get(config, 'train.max_steps')} steps" if _get(config, "train.max_steps") else None)
    every = _get(config, "train.eval_every_examples")
    limit = _get(config, "train.eval_train_limit")
    if every is not None:
        add("Evaluation cadence", f"every {every} examples" if every else "once per epoch",
            f"(training metric on the first {limit} training examples)" if limit else None)
    add("Divergence", f"loss > {_get(config, 'train.diverge_loss')} or non-finite"
        if _get(config, "train.diverge_loss") is not None else None)
    o = _get(config, "optim", {}) or {}
    opt = [o.get("name")]
    if o.get("name") in ("momentum", "nesterov", "lars"):
        opt.append(f"momentum {o.get('momentum')}")
    if o.get("weight_decay"):
        opt.append(f"weight decay {o.get('weight_decay')}")
    if o.get("name") == "lars":
        opt.append(f"eta {o.get('lars_eta')}, trust ratio '{o.get('lars_trust_ratio')}', "
                   f"epsilon {o.get('lars_epsilon')}, clip {o.get('lars_clip')}")
    add("Optimizer", ", ".join(str(p) for p in opt if p is not None))
    if o.get("base_lr") is not None:
        add("Learning rate", f"base {o.get('base_lr')} at batch {o.get('reference_batch')}, scaling rule "
            f"'{o.get('scaling')}', grid of multipliers {_get(config, 'sweep.lr_multipliers')}")
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
        amount = (f"{o.get('warmup_epochs')} epochs" if held == "epochs"
                  else f"{o.get('warmup_steps')} steps" if held == "steps"
                  else f"{o.get('warmup_epochs')} epochs / {o.get('warmup_steps')} steps")
        add("Warm-up", f"{amount}, held fixed in {held} across batch sizes")
    norm = _get(config, "model.norm")
    if norm:
        add("Normalisation", norm, f"(virtual batch {_get(config, 'model.ghost_batch_size')})"
            if norm == "ghost" else None)
    d = _get(config, "data", {}) or {}
    n_seen = sorted({int(r["num_train"]) for r in records if r.get("num_train")})
    if d:
        add("Data", d.get("name"), f"num_train={d.get('num_train')} (0 = all)",
            f"(n_train in the trials: {', '.join(map(str, n_seen))})" if n_seen else None,
            f"augment={d.get('augment')}", f"shuffle buffer {d.get('shuffle_buffer')} (fixed)")
    add("Batch sizes", _get(config, "sweep.batch_sizes"))
    add("Seeds", _get(config, "sweep.seeds"))
    if _get(config, "train.max_device_batch"):
        add("Gradient accumulation", f"micro-batches of at most {_get(config, 'train.max_device_batch')}")
    if _get(config, "train.gradient_every_examples"):
        add("Gradient statistics", f"every {_get(config, 'train.gradient_every_examples')} examples on a probe "
            f"set of {_get(config, 'train.probe_size')}")
    add("Precision", _get(config, "runtime.mixed_precision"))
    sweep = _get(config, "sweep", {}) or {}
    fam = {k: v for k, v in sweep.items() if k not in ("batch_sizes", "seeds", "lr_multipliers")}
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
    for r in sorted(records, key=lambda r: (r.get("member", ""), r.get("batch_size", 0),
                                            r.get("learning_rate") or 0, r.get("seed") or 0)):
        final = r.get("final") or {}
        row = {k: r.get(k) for k in TRIAL_COLUMNS}
        for k in ("train_accuracy", "train_loss", "test_accuracy", "test_loss"):
            row[f"final_{k}"] = final.get(k)
        rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def best_rows(summaries) -> list[dict]:
    rows = []
    for s in summaries:
        for c in s.cells:
            b = c.best
            rows.append({k: _cell(v) for k, v in {
                "member": s.info.name, "arch": s.info.arch, "depth": s.info.depth, "width": s.info.width,
                "params": s.info.params, "batch_size": c.batch_size,
                "best_learning_rate": c.learning_rate, "best_lr_multiplier": c.lr_multiplier,
                "steps_to_target": c.steps_to_target, "steps_std": b.steps_std if b else None,
                "epochs_to_target": c.epochs_to_target, "n_seeds": b.n_seeds if b else None,
                "lr_grid": " ".join(f"{lr:g}" for lr in c.grid_lrs if lr is not None),
                "lr_at_grid_edge": c.lr_at_grid_edge, "n_trials": c.n_trials, "n_reached": c.n_reached,
                "n_not_reached": c.n_not_reached, "n_diverged": c.n_diverged,
                "test_accuracy_at_best_lr": b.best_test_accuracy if b else None,
                "best_test_accuracy_any_lr": c.best_test_accuracy_any_lr}.items()})
    return rows


def member_rows(summaries, eps: float) -> list[dict]:
    rows = []
    for s in summaries:
        mb, cf = s.max_batch, s.crit
        rows.append({k: _cell(v) for k, v in {
            "member": s.info.name, "arch": s.info.arch, "depth": s.info.depth, "width": s.info.width,
            "params": s.info.params, "eps": eps, "max_batch": mb.value, "max_batch_at_ceiling": mb.at_ceiling,
            "max_batch_reason": mb.reason, "reference_batch": mb.reference_batch,
            "reference_epochs": mb.reference_epochs, "s_min": cf.s_min, "b_crit": cf.b_crit,
            "fit_r2_log": cf.r2_log, "fit_rel_rms": cf.rel_rms, "fit_points": cf.n_points,
            "fit_reason": cf.reason, "batch_bound_init": s.batch_bound_init,
            "batch_bound_init_std": s.batch_bound_init_std, "noise_scale_ema": s.noise_scale_ema,
            "n_edge_cells": len(s.edge_cells)}.items()})
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
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.4")


def _width_ticks(ax, summaries) -> None:
    # Family widths are rarely powers of two: tick exactly the members' widths.
    ws = sorted({float(s.info.width) for s in summaries if isinstance(s.info.width, (int, float))})
    if 0 < len(ws) <= 12:
        ax.set_xticks(ws)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _mark_unreached(ax, s, color, labelled: list):
    # Batches where no learning rate reached the target have no value: mark them on the x axis.
    xs = [c.batch_size for c in s.cells if c.steps_to_target is None]
    if xs:
        label = None if labelled else "no LR reached the target"
        labelled.append(True)
        ax.plot(xs, [0.03] * len(xs), linestyle="none", marker="x", markersize=8, color=color,
                transform=ax.get_xaxis_transform(), clip_on=False, label=label)


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
        if ax.get_yscale() == "log" and not isinstance(ax.yaxis.get_major_formatter(),
                                                       matplotlib.ticker.FuncFormatter):
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


def make_plots(summaries, records, eps: float, target: str, outdir: str) -> list[tuple[str, str, bytes]]:
    """Writes the PNGs; returns (file name, caption, png bytes) for each."""
    plots = []
    if not summaries:
        return plots
    colors = _colors(len(summaries))
    any_reached = any(c.steps_to_target is not None for s in summaries for c in s.cells)
    nothing = "no learning rate reached the target at any batch size"

    # Steps to target vs batch, log-log, with the perfect-scaling line per member.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    marked: list = []
    for s, col in zip(summaries, colors):
        pts = [(c.batch_size, c.steps_to_target) for c in s.cells if c.steps_to_target is not None]
        if pts:
            b, st = map(np.array, zip(*pts))
            ax.plot(b, st, "o-", color=col, label=_label(s))
            bb = np.array([c.batch_size for c in s.cells], dtype=float)
            ax.plot(bb, st[0] * b[0] / bb, ":", color=col, alpha=0.7)
            if s.crit.b_crit is not None:
                grid = np.geomspace(bb.min(), bb.max(), 100)
                ax.plot(grid, s.crit.s_min * (1 + s.crit.b_crit / grid), "--", color=col, alpha=0.45,
                        linewidth=1)
        _mark_unreached(ax, s, col, marked)
    ax.plot([], [], "k:", label="perfect scaling S ~ 1/B (from smallest batch)")
    ax.plot([], [], "k--", alpha=0.45, label="fit S_min (1 + B_crit / B)")
    plots.append(_finish_batch_plot(
        fig, ax, outdir, "steps_vs_batch.png", "Steps to target vs batch size (log-log)",
        "steps to target (optimizer steps)", f"Steps to reach {target} vs batch size (best LR per batch)",
        nothing=None if any_reached else nothing, log_y=True))

    # Epochs to target vs batch with the (1 + eps) threshold.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    marked = []
    for s, col in zip(summaries, colors):
        pts = [(c.batch_size, c.epochs_to_target) for c in s.cells if c.epochs_to_target is not None]
        if pts:
            b, e = zip(*pts)
            ax.plot(b, e, "o-", color=col, label=_label(s))
        if s.max_batch.threshold is not None:
            ax.axhline(s.max_batch.threshold, color=col, linestyle=":", alpha=0.6, linewidth=1)
        if s.max_batch.value is not None:
            mbe = next(c.epochs_to_target for c in s.cells if c.batch_size == s.max_batch.value)
            ax.plot([s.max_batch.value], [mbe], marker="*", markersize=14, color=col, linestyle="none")
        _mark_unreached(ax, s, col, marked)
    ax.plot([], [], "k:", alpha=0.6, label=f"(1 + eps) x epochs at smallest batch, eps = {eps:g}")
    ax.plot([], [], "k*", linestyle="none", markersize=10, label="max_batch(eps)")
    plots.append(_finish_batch_plot(
        fig, ax, outdir, "epochs_vs_batch.png", "Epochs to target vs batch size",
        "epochs to target (passes over the training set)", "Epochs to target vs batch size (flat = perfect scaling)",
        nothing=None if any_reached else nothing, log_y=True))

    # max_batch(eps) and B_crit vs width.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    drawn = [False, False]
    for arch in sorted({s.info.arch for s in summaries}):
        mine = [s for s in summaries if s.info.arch == arch and isinstance(s.info.width, (int, float))]
        mw = [(s.info.width, s.max_batch.value, s.max_batch.at_ceiling) for s in mine
              if s.max_batch.value is not None]
        if mw:
            w, v, ceil = zip(*mw)
            drawn[0] = True
            axes[0].plot(w, v, "-", color="C0", alpha=0.5)
            for wi, vi, ci in mw:
                axes[0].plot([wi], [vi], "^" if ci else "o", color="C3" if ci else "C0", markersize=8)
        cw = [(s.info.width, s.crit.b_crit) for s in mine if s.crit.b_crit is not None]
        if cw:
            drawn[1] = True
            axes[1].plot(*zip(*cw), "o-", color="C1", label=f"{arch}" if arch else None)
        for s in mine:  # depth next to each point: in a fixed-budget family width and depth move together
            if s.max_batch.value is not None:
                axes[0].annotate(f"depth {s.info.depth}", (s.info.width, s.max_batch.value), fontsize=7,
                                 textcoords="offset points", xytext=(4, 4))
    axes[0].plot([], [], "o", color="C0", label=f"max_batch(eps={eps:g})")
    axes[0].plot([], [], "^", color="C3", label="= largest batch tried (lower bound)")
    for ax, ok, ylabel, title in (
            (axes[0], drawn[0], "max_batch (examples per step)", f"Largest batch without slow-down (eps={eps:g})"),
            (axes[1], drawn[1], "B_crit (examples per step)", "Critical batch size from S = S_min(1 + B_crit/B)")):
        if ok:
            _log2_axis(ax, "x")
            _log2_axis(ax, "y")
            _width_ticks(ax, summaries)
        else:
            _no_data(ax, "undefined for every member (see the tables)")
        ax.set_xlabel("width (units per layer; WRN: widening factor k)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    plots.append(("batch_vs_width.png", "max_batch(eps) and B_crit vs width",
                  _save(fig, os.path.join(outdir, "batch_vs_width.png"))))

    # Best test accuracy vs batch.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for s, col in zip(summaries, colors):
        pts = [(c.batch_size, c.best_test_accuracy_any_lr) for c in s.cells if c.best_test_accuracy_any_lr is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", color=col, label=_label(s))
    has_accuracy = any(c.best_test_accuracy_any_lr is not None for s in summaries for c in s.cells)
    plots.append(_finish_batch_plot(
        fig, ax, outdir, "test_accuracy_vs_batch.png", "Best test accuracy vs batch size",
        "best test accuracy (fraction, best LR of the grid)",
        "Best test accuracy vs batch size (seed mean, max over learning rates)",
        nothing=None if has_accuracy else "no test accuracy recorded", log_y=False))

    # Chosen learning rate vs batch, with grid-edge cells ringed.
    fig, ax = plt.subplots(figsize=(7.5, 5))
    edge_labelled = False
    for s, col in zip(summaries, colors):
        pts = [(c.batch_size, c.learning_rate, c.lr_at_grid_edge) for c in s.cells if c.learning_rate is not None]
        if pts:
            b, lr, edge = zip(*pts)
            ax.plot(b, lr, "o-", color=col, label=_label(s))
            eb = [(bi, li) for bi, li, ei in pts if ei]
            if eb:
                ax.plot(*zip(*eb), "o", markersize=13, markerfacecolor="none", markeredgecolor="red",
                        label=None if edge_labelled else "at the edge of the LR grid")
                edge_labelled = True
    plots.append(_finish_batch_plot(
        fig, ax, outdir, "learning_rate_vs_batch.png", "Chosen learning rate vs batch size",
        "chosen peak learning rate", "Learning rate that reaches the target in the fewest steps",
        nothing=None if any_reached else nothing, log_y=True))

    # Gradient statistics, when the trials measured them.
    with_bb = [s for s in summaries if s.batch_bound_init is not None]
    if with_bb:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for i, arch in enumerate(sorted({s.info.arch for s in with_bb})):
            mine = [s for s in with_bb if s.info.arch == arch and isinstance(s.info.width, (int, float))]
            if mine:
                ax.errorbar([s.info.width for s in mine], [s.batch_bound_init for s in mine],
                            yerr=[s.batch_bound_init_std for s in mine], fmt="o-", capsize=3,
                            color=f"C{i}", label=f"{arch} family" if arch else "family")
        _log2_axis(ax, "x")
        _width_ticks(ax, with_bb)
        ax.set_yscale("log")
        ax.set_xlabel("width (units per layer; WRN: widening factor k)")
        ax.set_ylabel("batch bound n x diversity at init (examples)")
        ax.set_title("Gradient-diversity batch bound at initialisation vs width (mean +- std over trials)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        plots.append(("batch_bound_vs_width.png", "Batch bound at initialisation vs width",
                      _save(fig, os.path.join(outdir, "batch_bound_vs_width.png"))))

        fig, ax = plt.subplots(figsize=(7.5, 5))
        for s, col in zip(summaries, colors):
            rec = _representative_trial(s, records)
            hist = [h for h in ((rec or {}).get("gradient") or {}).get("history") or []
                    if h.get("batch_bound") is not None and h.get("examples") is not None]
            if hist:
                hist.sort(key=lambda h: h["examples"])
                x = np.array([h["examples"] for h in hist], dtype=float)
                ax.plot(np.maximum(x, 1.0), [h["batch_bound"] for h in hist], "-", color=col,
                        label=f"{_label(s)}, B={rec['batch_size']}")
        ax.set_xscale("symlog", linthresh=max(1.0, float(min((c.batch_size for s in summaries for c in s.cells),
                                                               default=1))))
        ax.set_yscale("log")
        ax.set_xlabel("training examples seen")
        ax.set_ylabel("batch bound n x diversity (examples)")
        ax.set_title("Batch bound during training (best-LR trial at the smallest batch, first seed)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        plots.append(("batch_bound_over_training.png", "Batch bound during training",
                      _save(fig, os.path.join(outdir, "batch_bound_over_training.png"))))
    return plots


def _representative_trial(s, records):
    """The member's trial of the best setting at its smallest batch (first seed), else any with history."""
    ids = set()
    for c in s.cells:
        if c.best is not None:
            ids = set(c.best.trial_ids)
            break
    mine = [r for r in records if r["member"] == s.info.name and ((r.get("gradient") or {}).get("history"))]
    chosen = sorted([r for r in mine if str(r.get("trial_id", "")) in ids], key=lambda r: r.get("seed") or 0)
    if chosen:
        return chosen[0]
    return min(mine, key=lambda r: (r["batch_size"], r.get("seed") or 0), default=None)


# ----------------------------------------------------------------------------------------------
# TensorBoard
# ----------------------------------------------------------------------------------------------

def _hparams_of(rec: dict) -> dict:
    hp = {"member": rec.get("member"), "optimizer": rec.get("optimizer")}
    for k, cast in (("depth", int), ("params", int), ("batch_size", int), ("seed", int),
                    ("width", float), ("learning_rate", float), ("lr_multiplier", float)):
        if rec.get(k) is not None:
            hp[k] = cast(rec[k])
    return {k: v for k, v in hp.items() if v is not None}


def _metrics_of(rec: dict) -> dict:
    final = rec.get("final") or {}
    m = {"steps_to_target": rec.get("steps_to_target"), "epochs_to_target": rec.get("epochs_to_target"),
         "final_train_accuracy": final.get("train_accuracy"), "final_test_accuracy": final.get("test_accuracy"),
         "best_test_accuracy": rec.get("best_test_accuracy"),
         "status_code": analysis.STATUS_CODE.get(rec.get("status"))}
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
    hparams = [hp_api.HParam("member", hp_api.Discrete(sorted({str(r["member"]) for r in records}))),
               hp_api.HParam("optimizer", hp_api.Discrete(sorted({str(r.get("optimizer")) for r in records
                                                                   if r.get("optimizer")}) or ["unknown"]))]
    hparams += [hp_api.HParam(k) for k in ("depth", "width", "params", "batch_size", "learning_rate",
                                           "lr_multiplier", "seed")]
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

- Each (member, batch size) tried a grid of learning rates; the table keeps the one that reaches the
  target in the fewest steps. A learning rate counts as reaching the target only if **every seed**
  reached it; its steps are the **mean over seeds**. Runs that diverged or did not reach the target
  within the budget are counted, never given a value. "-" means no learning rate reached the target.
- **Perfect scaling** is steps-to-target proportional to 1/B (flat epochs-to-target): the dotted lines
  in the steps plot. Where the measured curve bends above it, larger batches stop paying off.
- **max_batch(eps)** is the largest batch whose epochs-to-target is at most (1 + eps) times the
  epochs at the member's smallest batch (the paper's headline quantity). A "+" means it equals the
  largest batch tried, so the true value may be larger.
- **B_crit** comes from fitting S(B) = S_min (1 + B_crit / B) to the best steps per batch (relative
  least squares, linear in 1/B); S_min is the fewest steps any batch can need. A low R^2 or a large
  relative RMS means the curve does not have that shape, and B_crit is then a rough summary only.
- **Grid-edge warnings**: when the best learning rate is the smallest or largest one tried, the
  optimum may lie outside the grid, and the steps shown are an upper bound. Extend the grid.
- The verdict compares max_batch across width, narrowest member first; B_crit is secondary evidence.
  It is "inconclusive" whenever the data cannot decide (missing values, grid edges, ceiling effect,
  equal or non-monotone values), and says why.
"""


def render_markdown(config, records, n_bad, result, plots, eps, tb_written) -> str:
    summaries, verdicts = result["summaries"], result["verdicts"]
    name = _get(config, "name") or _get(config, "study") or ""
    lines = [f"# Batch-size study report{': ' + str(name) if name else ''}", ""]
    lines += ["Does a wider network (at a fixed parameter budget) train with larger batches before it needs more "
              "epochs? (Chen et al., NeurIPS 2018.)", ""]
    counts = {s: sum(1 for r in records if r.get("status") == s) for s in analysis.STATUSES}
    lines.append(f"Finished trials: {len(records)} ({counts['reached']} reached the target, "
                 f"{counts['not_reached']} not reached, {counts['diverged']} diverged)."
                 + (f" {n_bad} unreadable line(s) in results.jsonl were skipped." if n_bad else ""))
    lines.append("")
    lines += ["## Verdict", ""]
    if not records:
        lines += ["No trials finished yet: results.jsonl is empty or missing. Re-run the report when trials "
                  "have finished.", ""]
    else:
        for arch, v in verdicts.items():
            if len(verdicts) > 1:
                lines.append(f"**{arch}**: ")
            lines += [v.text, ""]
    lines += ["## Protocol", ""]
    lines += _md_table(["setting", "value"], [[k, str(v).replace("|", "\\|")] for k, v in protocol_rows(
        config, records, eps)])
    lines.append("")
    if not records:
        lines += [HOW_TO_READ]
        return "\n".join(lines)

    lines += ["## Members", ""]
    lines += _md_table(["member", "arch", "depth", "width", "params"],
                       [[s.info.name, s.info.arch, _f(s.info.depth), _f(s.info.width),
                         f"{s.info.params:,}" if s.info.params else "-"] for s in summaries])
    lines.append("")

    lines += [f"## Largest batch without slow-down and critical batch size (eps = {eps:g})", ""]
    rows = []
    for s in summaries:
        mb, cf = s.max_batch, s.crit
        rows.append([s.info.name, _f(s.info.width),
                     (_f(mb.value) + ("+" if mb.at_ceiling else "")) if mb.value is not None else f"- ({mb.reason})",
                     _f(mb.reference_epochs), _f(cf.b_crit) if cf.b_crit is not None else f"- ({cf.reason})",
                     _f(cf.s_min), _f(cf.r2_log, "{:.3f}"), _f(cf.rel_rms, "{:.3f}"), cf.n_points,
                     _f(s.batch_bound_init), _f(s.noise_scale_ema)])
    lines += _md_table(["member", "width", "max_batch", "epochs at smallest B", "B_crit", "S_min", "fit R^2 (log S)",
                        "fit rel. RMS", "fit points", "batch bound at init", "noise scale (EMA)"], rows)
    lines.append("")

    edges = [(s.info.name, c) for s in summaries for c in s.edge_cells]
    lines += ["## Grid-edge warnings", ""]
    if edges:
        for m, c in edges:
            lines.append(f"- {m}, B={c.batch_size}: best learning rate {_f(c.learning_rate)} is at the edge of the "
                         f"grid tried ({', '.join(_f(x) for x in c.grid_lrs)}).")
    else:
        lines.append("None: every best learning rate has a tried learning rate on each side.")
    lines.append("")

    lines += ["## Best learning rate per batch size", ""]
    for s in summaries:
        lines += [f"### {s.info.name}", ""]
        rows = []
        for c in s.cells:
            b = c.best
            steps = "-" if b is None else (f"{b.steps_to_target:.1f}" + (f" +- {b.steps_std:.1f}" if b.n_seeds > 1 else ""))
            lr = "-" if b is None else f"{_f(b.learning_rate)}" + (f" (x{b.lr_multiplier:g})" if b.lr_multiplier is not None else "")
            rows.append([c.batch_size, lr + (" (edge)" if c.lr_at_grid_edge else ""), steps,
                         _f(c.epochs_to_target), b.n_seeds if b else "-",
                         f"{c.n_reached} / {c.n_not_reached} / {c.n_diverged}", len(c.grid),
                         _f(b.best_test_accuracy if b else None, "{:.4f}"),
                         _f(c.best_test_accuracy_any_lr, "{:.4f}")])
        lines += _md_table(["batch", "best LR (multiplier)", "steps to target (mean +- std)", "epochs to target",
                            "seeds", "trials reached / not reached / diverged", "LRs tried",
                            "best test acc. at best LR", "best test acc. any LR"], rows)
        lines.append("")

    lines += ["## Plots", ""]
    for fname, caption, _ in plots:
        lines += [f"- [{caption}]({fname})", "", f"![{caption}]({fname})", ""]
    lines += ["## Tables and TensorBoard", "",
              "- [best_per_batch.csv](best_per_batch.csv): the tuned result per (member, batch)",
              "- [all_trials.csv](all_trials.csv): every finished trial",
              "- [members.csv](members.csv): max_batch, B_crit and gradient statistics per member"]
    if tb_written:
        lines.append("- TensorBoard: `tensorboard --logdir=report/tb` (HParams tab: one row per trial; "
                     "Images tab: these plots)")
    else:
        lines.append("- TensorBoard HParams not written: the `tensorboard` package is not installed.")
    lines += ["", HOW_TO_READ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------

def write_report(workdir: str, eps: float | None = None, *, ignore_grid_edges: bool = False) -> str:
    """Writes WORKDIR/report/ and returns the path of report.md. Raises ReportError on a bad workdir."""
    config, records, n_bad = read_workdir(workdir)
    eps = eps_from_config(config) if eps is None else float(eps)
    outdir = os.path.join(workdir, REPORT_DIR)
    tf.io.gfile.makedirs(outdir)
    result = analysis.analyze(records, eps, ignore_grid_edges=ignore_grid_edges)
    summaries = result["summaries"]
    _write_csv(os.path.join(outdir, "all_trials.csv"), TRIAL_COLUMNS, trial_rows(records))
    _write_csv(os.path.join(outdir, "best_per_batch.csv"), BEST_COLUMNS, best_rows(summaries))
    _write_csv(os.path.join(outdir, "members.csv"), MEMBER_COLUMNS, member_rows(summaries, eps))
    target = (f"{_get(config, 'train.target_metric')} {_get(config, 'train.target_value')}"
              if _get(config, "train.target_metric") else "the target")
    plots = make_plots(summaries, records, eps, target, outdir)
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
    flags.DEFINE_bool("ignore_grid_edges", False, "Let the verdict decide although best LRs sit at grid edges.")
    FLAGS = flags.FLAGS

    def _run(_argv):
        if not FLAGS.workdir:
            sys.stderr.write("report: --workdir is required\n")
            return 2
        try:
            path = write_report(FLAGS.workdir, FLAGS.eps, ignore_grid_edges=FLAGS.ignore_grid_edges)
        except (ReportError, tf.errors.OpError) as e:
            sys.stderr.write(f"report: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")
            return 1
        print(path)
        return 0

    app.run(_run, argv=argv)
    return 0


if __name__ == "__main__":
    main()
