"""Owns the report's CSV tables: one row per trial, per (member, batch size) cell and per member,
and their writing (atomic, so a killed report never leaves half a table)."""

from __future__ import annotations

import csv
import io
import math

from wide_tf.schema.targets import EVAL_METRICS
from wide_tf.store import workdir as wd

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
    *(f"final_{k}" for k in EVAL_METRICS),
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
    "n_diverged_censored",
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
    "b_x",
    "b_x_low",
    "b_x_high",
    "b_x_censored",
    "b_x_status",
    "reference_epochs",
    "threshold_epochs",
    "batch_bound_init",
    "batch_bound_init_std",
    "noise_scale_ema",
    "n_edge_cells",
    "n_diverged_censored",
]


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        # Ten significant digits: a value is never shown with its float round-off
        # (exp(log(256)) is 255.99999999999994), and no measured digit is lost.
        return "" if not math.isfinite(v) else repr(float(f"{v:.10g}"))
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
        for k in EVAL_METRICS:
            row[f"final_{k}"] = final.get(k)
        rows.append({k: _cell(v) for k, v in row.items()})
    return rows


def _member_fields(info) -> dict:
    """The columns that name a member, first in every per-member and per-cell row."""
    return {
        "member": info.name,
        "arch": info.arch,
        "depth": info.depth,
        "width": info.width,
        "params": info.params,
    }


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
                        **_member_fields(s.info),
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
                        "n_diverged_censored": c.n_diverged_censored,
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
    """One row per member: B_crit, S_min and B_x(1+eps) (the b_x columns) with their
    95% intervals."""
    rows = []
    for s in summaries:
        cv = s.curve
        f = cv.fit if cv else None
        bc, sm, mb = (
            (_iv(cv.b_crit), _iv(cv.s_min), _iv(cv.b_model_free)) if cv else ((None,) * 3,) * 3
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
                    **_member_fields(s.info),
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
                    "b_x": mb[0],
                    "b_x_low": mb[1],
                    "b_x_high": mb[2],
                    # A lower bound: no crossing up to the largest batch tried (its value sits AT
                    # that batch, so the range test alone would not say so).
                    "b_x_censored": (cv.b_model_free_status == 1)
                    if cv and cv.b_model_free
                    else None,
                    "b_x_status": cv.b_model_free_reason if cv else None,
                    "reference_epochs": cv.reference_epochs if cv else None,
                    "threshold_epochs": cv.threshold_epochs if cv else None,
                    "batch_bound_init": s.batch_bound_init,
                    "batch_bound_init_std": s.batch_bound_init_std,
                    "noise_scale_ema": s.noise_scale_ema,
                    "n_edge_cells": len(s.edge_cells),
                    "n_diverged_censored": s.n_diverged_censored,
                }.items()
            }
        )
    return rows


def write_csv(path: str, columns: list[str], rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    wd.write_text_atomic(path, buf.getvalue())
