"""Owns what the report says about how the study was run: the protocol table, from config.json,
and the few settings the report itself takes from config.json (eps, the target)."""

from __future__ import annotations

import json

from wide_tf import analysis


def config_value(config: dict | None, dotted: str, default=None):
    """config["a"]["b"] for "a.b", or `default` where the path is missing."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def eps_from_config(config: dict | None) -> float:
    for key in ("report.eps", "analysis.eps", "sweep.eps", "sweep.max_batch_eps", "eps"):
        v = config_value(config, key)
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
    metric = config_value(config, "train.target_metric")
    value = config_value(config, "train.target_value")
    if metric:
        op = "<=" if "loss" in str(metric) else ">="
        add(
            "Target",
            f"{metric} {op} {value}",
            "(first seen at an evaluation; the crossing interpolated between it and the one "
            "before)",
        )
    add(
        "Budget",
        f"{config_value(config, 'train.max_epochs')} epochs"
        if config_value(config, "train.max_epochs")
        else None,
        f"/ {config_value(config, 'train.max_steps')} steps"
        if config_value(config, "train.max_steps")
        else None,
        f"(at least {config_value(config, 'train.min_steps')} steps at every batch size)"
        if config_value(config, "train.min_steps")
        else None,
    )
    every = config_value(config, "train.eval_every_examples")
    limit = config_value(config, "train.eval_train_limit")
    if every is not None:
        add(
            "Evaluation cadence",
            f"every {every} examples" if every else "once per epoch",
            f"(training metric on the first {limit} training examples)" if limit else None,
        )
    add(
        "Divergence",
        f"loss > {config_value(config, 'train.diverge_loss')} or non-finite"
        if config_value(config, "train.diverge_loss") is not None
        else None,
    )
    o = config_value(config, "optim", {}) or {}
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
            f"'{o.get('scaling')}', grid of multipliers "
            f"{config_value(config, 'sweep.lr_multipliers')}",
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
    norm = config_value(config, "model.norm")
    if norm:
        add(
            "Normalisation",
            norm,
            f"(virtual batch {config_value(config, 'model.ghost_batch_size')})"
            if norm == "ghost"
            else None,
        )
    d = config_value(config, "data", {}) or {}
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
    add("Batch sizes", config_value(config, "sweep.batch_sizes"))
    add(
        "Seeds",
        f"tuning {config_value(config, 'sweep.seeds')}, confirmation of the chosen rate "
        f"{config_value(config, 'sweep.confirm_seeds') or 'none'} "
        "(a cell is the median over its seeds)",
    )
    if config_value(config, "train.max_device_batch"):
        add(
            "Gradient accumulation",
            f"micro-batches of at most {config_value(config, 'train.max_device_batch')}",
        )
    if config_value(config, "train.gradient_every_examples"):
        add(
            "Gradient statistics",
            f"every {config_value(config, 'train.gradient_every_examples')} examples on a probe "
            f"set of {config_value(config, 'train.probe_size')}",
        )
    add("Precision", config_value(config, "runtime.mixed_precision"))
    sweep = config_value(config, "sweep", {}) or {}
    fam = {
        k: v
        for k, v in sweep.items()
        if k not in ("batch_sizes", "seeds", "confirm_seeds", "lr_multipliers")
    }
    if fam:
        add("Family / sweep", json.dumps(fam, sort_keys=True))
    rows.append(("eps (max_batch)", f"{eps:g}"))
    return rows


def target_label(config: dict | None) -> str:
    """The target as the plots' titles name it ("train_accuracy 0.99"), or "the target"."""
    metric = config_value(config, "train.target_metric")
    if not metric:
        return "the target"
    return f"{metric} {config_value(config, 'train.target_value')}"
