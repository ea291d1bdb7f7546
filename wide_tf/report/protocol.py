"""Owns what the report says about how the study was run: the protocol table (how the trials ran,
from the `protocol` each result.json carries; the study's design, from config.json) and the few
settings the report itself takes from config.json (eps, the target in the plots' titles)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from wide_tf.analysis import members
from wide_tf.schema import fields, lr_schedules, optimizers, provenance
from wide_tf.schema.problems import RuntimeProblem
from wide_tf.schema.targets import comparison

# The sweep fields that have a row of their own; the family and the others have rows in words.
_SWEEP_ROWS = (
    "batch_sizes",
    "lr_multipliers",
    "extend_lr_grid",
    "max_lr_extensions",
    "seeds",
    "confirm_seeds",
    "eps",
)


def config_value(config: dict | None, dotted: str, default=None):
    """config["a"]["b"] for "a.b", or `default` where the path is missing."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


class ReportError(RuntimeProblem):
    """The workdir cannot be reported on (missing, holds no study, another writer holds the
    report lock), or a setting of the report is out of range."""


def eps_problem(eps) -> str | None:
    """What is wrong with `eps` for B_x(1+eps), or None. Like sweep.eps (schema/fields.py): a
    finite number in [MIN_EPS, MAX_EPS]; 0 puts the threshold on perfect scaling itself, nan made
    every table B_xnan, a negative one raised in the analysis, and 1e26 or 1e-320 wrote a report
    of nothing but censored bounds over the study's own."""
    rng = f"use a finite number >= {fields.MIN_EPS:g} and <= {fields.MAX_EPS:g}, e.g. 0.25 or 1"
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return f"eps={eps!r} is not a number; {rng}"
    if not (math.isfinite(eps) and fields.MIN_EPS <= eps <= fields.MAX_EPS):
        return f"eps={eps!r} is out of range: {rng}"
    return None


def eps_from_config(config: dict | None) -> float:
    for key in ("report.eps", "analysis.eps", "sweep.eps", "sweep.max_batch_eps", "eps"):
        v = config_value(config, key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return members.DEFAULT_EPS


def target_label(config: dict | None) -> str:
    """The target as the plots' titles name it ("train_accuracy 0.99"), or "the target"."""
    metric = config_value(config, "train.target_metric")
    if not metric:
        return "the target"
    return f"{metric} {config_value(config, 'train.target_value')}"


# ----------------------------------------------------------------------------------------------
# How the trials ran: one row per setting, each a function of (protocol, record) -> text or None
# ----------------------------------------------------------------------------------------------


def _join(*parts) -> str | None:
    parts = [str(p) for p in parts if p not in (None, "", [])]
    return " ".join(parts) if parts else None


def _target(p: dict, r: dict) -> str | None:
    if not p.get("target"):
        return None
    extra = p.get("extra_targets") or []
    text = (
        f"{p['target']} (first seen at an evaluation; the crossing interpolated between it and "
        "the one before)"
    )
    if extra:  # train.extra_targets: judged on the same evaluations, each in result.json "targets"
        text += f"; also {', '.join(extra)}, each the same way"
        if p.get("stop_at_target"):
            text += "; a run stops once every target is met"
    return text


def _target_bn(p: dict, r: dict) -> str | None:
    """train.target_bn: which batch-norm statistics the evaluations (and so the targets) use."""
    mode = p.get("target_bn")
    if mode == "moving":
        return "the training run's moving averages (momentum 0.9: they lag the weights)"
    if mode == "recompute":
        return (
            f"recomputed before each evaluation: the average of the batch statistics of the first "
            f"{p.get('target_bn_examples')} training examples in batches of "
            f"{p.get('target_bn_batch')} (the training run's moving averages are left unchanged)"
        )
    return None  # no batch norm, or not recorded


def _budget(p: dict, r: dict) -> str | None:
    return _join(
        f"{p['max_epochs']} epochs" if p.get("max_epochs") else None,
        f"/ {p['max_steps']} steps" if p.get("max_steps") else None,
        f"(at least {p['min_steps']} steps at every batch size)" if p.get("min_steps") else None,
    )


def _evaluation(p: dict, r: dict) -> str | None:
    if "eval_every_examples" not in p:
        return None
    every, limit = p["eval_every_examples"], p.get("eval_train_limit")
    return _join(
        f"every {every} examples" if every else "once per epoch",
        f"(training metric on the first {limit} training examples)" if limit else None,
    )


def _divergence(p: dict, r: dict) -> str | None:
    if p.get("diverge_loss") is None:
        return None
    return f"loss > {p['diverge_loss']} or non-finite"


def _optimizer(p: dict, r: dict) -> str | None:
    return optimizers.describe(p)  # from the optimizer's registry entry


def _scaling(p: dict, r: dict) -> str | None:
    if not p.get("scaling"):
        return None
    return f"rule '{p['scaling']}' from the reference batch {p.get('reference_batch')}"


def _schedule(p: dict, r: dict) -> str | None:
    sched = p.get("schedule")
    return lr_schedules.describe(sched, p.get("schedule_settings") or {}) if sched else None


def _norm(p: dict, r: dict) -> str | None:
    norm = p.get("norm")
    if not norm:
        return None
    ghost = f"(virtual batch {p.get('ghost_batch_size')})" if norm == "ghost" else None
    return _join(norm, ghost)


def _data(p: dict, r: dict) -> str | None:
    if not p.get("data"):
        return None
    parts = [p["data"]]
    if r.get("num_train"):
        parts.append(f"{r['num_train']} training examples")
    parts += [f"augment={p.get('augment')}", f"shuffle buffer {p.get('shuffle_buffer')} (fixed)"]
    return ", ".join(str(x) for x in parts)


def _accumulation(p: dict, r: dict) -> str | None:
    if not p.get("max_device_batch"):
        return None
    return f"micro-batches of at most {p['max_device_batch']}"


def _gradient_stats(p: dict, r: dict) -> str | None:
    if not p.get("gradient_every_examples"):
        return None
    size = p.get("probe_size")
    where = f"a probe set of {size:,} examples" if size else "the whole training set"
    return f"every {p['gradient_every_examples']:,} examples, on {where}"


def _precision(p: dict, r: dict) -> str | None:
    policy = r.get("dtype_policy")  # the policy the model was built with
    if policy == "float32" and "TF32" in str(r.get("runtime", "")):
        return "float32 with TF32 matmuls and convolutions (TensorFlow's default on this GPU)"
    return policy


# (label, the protocol keys it shows, its text); a protocol key no row shows gets a row of its own.
TRIAL_SETTINGS: tuple[tuple[str, tuple[str, ...], Callable[[dict, dict], str | None]], ...] = (
    ("Target", ("target", "extra_targets", "stop_at_target"), _target),
    (
        "Batch-norm statistics at evaluation",
        ("target_bn", "target_bn_examples", "target_bn_batch"),
        _target_bn,
    ),
    ("Budget", ("max_epochs", "max_steps", "min_steps"), _budget),
    ("Evaluation cadence", ("eval_every_examples", "eval_train_limit"), _evaluation),
    ("Divergence", ("diverge_loss",), _divergence),
    (
        "Optimizer",
        ("optimizer", *optimizers.SHARED_HYPER, *optimizers.OPTIMIZERS),
        _optimizer,
    ),
    ("Learning-rate scaling", ("scaling", "reference_batch"), _scaling),
    ("Schedule", ("schedule", "schedule_settings"), _schedule),
    ("Warm-up", ("warmup",), lambda p, r: p.get("warmup")),
    ("Normalisation", ("norm", "ghost_batch_size"), _norm),
    ("Data", ("data", "augment", "shuffle_buffer"), _data),
    ("Gradient accumulation", ("max_device_batch",), _accumulation),
    ("Gradient statistics", ("gradient_every_examples", "probe_size"), _gradient_stats),
    ("Precision", (), _precision),
)


def _agreed(texts: list[str | None]) -> str | None:
    """The one text every trial gives, or what each group of trials gives when they differ."""
    counts = Counter(texts)
    if set(counts) == {None}:
        return None
    if len(counts) == 1:
        return texts[0]
    groups = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    return "differs across trials: " + "; ".join(
        f"{'none or not recorded' if t is None else t} ({n} trial{'s' if n > 1 else ''})"
        for t, n in groups
    )


def _value_text(v) -> str:
    return _words(v)


def trial_settings_rows(records: list[dict]) -> list[tuple[str, str]]:
    """How the trials ran, from the `protocol` each trial's result.json carries; a setting where
    the trials differ says how. Empty when no record carries a protocol."""
    recorded = [r for r in records if isinstance(r.get("protocol"), dict) and r["protocol"]]
    if not recorded:
        return []
    rows = []
    for label, _, text in TRIAL_SETTINGS:
        value = _agreed([text(r["protocol"], r) for r in recorded])
        if value is not None:
            rows.append((label, value))
    shown = {k for _, keys, _ in TRIAL_SETTINGS for k in keys}
    for key in sorted({k for r in recorded for k in r["protocol"]} - shown):
        value = _agreed(
            [_value_text(r["protocol"][key]) if key in r["protocol"] else None for r in recorded]
        )
        if value is not None:
            rows.append((key, value))
    if len(recorded) < len(records):
        rows.append(
            ("Trials without settings", f"{len(records) - len(recorded)} (older result files)")
        )
    return rows


# ----------------------------------------------------------------------------------------------
# The study's design: only config.json has it
# ----------------------------------------------------------------------------------------------


def study_design_rows(config: dict) -> list[tuple[str, str]]:
    """Batch sizes, the learning-rate grid, the seeds and the family, from config.json."""
    sweep = config.get("sweep") or {}
    rows = []
    if sweep.get("batch_sizes"):
        rows.append(("Batch sizes", str(sweep["batch_sizes"])))
    if sweep.get("lr_multipliers"):
        grid = (
            f"multipliers {sweep['lr_multipliers']} of the base rate "
            f"{config_value(config, 'optim.base_lr')} scaled to the batch size"
        )
        if "extend_lr_grid" in sweep:
            grid += (
                f"; extended by up to {sweep.get('max_lr_extensions')} points past an edge that "
                "wins"
                if sweep["extend_lr_grid"]
                else "; not extended"
            )
        rows.append(("Learning-rate grid", grid))
    rows.append(
        (
            "Seeds",
            f"tuning {sweep.get('seeds')}, confirmation of the chosen rate "
            f"{sweep.get('confirm_seeds') or 'none'} (a cell's value is the geometric mean over "
            "its seeds, the median where a seed is censored)",
        )
    )
    if isinstance(sweep.get("family"), dict):
        rows.append(("Family", family_text(sweep["family"])))
    if sweep.get("probe_batches") and config_value(config, "train.gradient_every_examples"):
        rows.append(
            (
                "Gradient probe along training",
                PROBE_BATCHES_TEXT.get(sweep["probe_batches"], str(sweep["probe_batches"])),
            )
        )
    for key in sorted(set(sweep) - set(_SWEEP_ROWS) - {"family", "probe_batches"}):
        rows.append((key.replace("_", " ").capitalize(), _words(sweep[key])))
    return rows


PROBE_BATCHES_TEXT = {
    "smallest": "at each member's smallest batch only (the noise-scale prediction's runs)",
    "all": "in every run",
}


def _listing(values) -> str:
    vs = [f"{v:g}" if isinstance(v, float) else str(v) for v in values or ()]
    return vs[0] if len(vs) == 1 else ", ".join(vs[:-1]) + " and " + vs[-1] if vs else "-"


def family_text(f: dict) -> str:
    """The family in words: 'a fixed budget of 3,000 parameters (within 5%), depths 1 and 2'."""
    kind, tol = f.get("kind"), f.get("tolerance")
    within = f" (within {tol:.0%})" if isinstance(tol, (int, float)) and tol else ""
    if kind == "budget":
        return (
            f"a fixed budget of {float(f.get('budget') or 0):,.0f} parameters{within}: depths "
            f"{_listing(f.get('depths'))}, each at the width that spends it"
        )
    if kind == "width":
        return f"widths {_listing(f.get('widths'))} at depth {f.get('depth')}"
    if kind == "depth":
        return f"depths {_listing(f.get('depths'))} at width {float(f.get('width') or 0):g}"
    return _words(f)


def _words(v) -> str:
    """Any other setting as 'name value; ...' text, never raw JSON."""
    if isinstance(v, dict):
        return "; ".join(f"{k.replace('_', ' ')} {_words(x)}" for k, x in sorted(v.items()))
    if isinstance(v, (list, tuple)):
        return _listing(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


PROVENANCE_LABELS = (
    ("wide_tf", "Code (wide_tf)"),
    ("command", "Command"),
    ("versions", "Versions"),
    ("machine", "Machine"),
    ("env", "Environment"),
)


def provenance_rows(config: dict | None, records: list[dict]) -> list[tuple[str, str]]:
    """Where the numbers came from (schema/provenance.py): from the trials' records (where they
    differ, how), else from config.json (the process that started the study)."""
    recorded = [r["provenance"] for r in records if isinstance(r.get("provenance"), dict)]
    source = ""
    if not recorded and isinstance((config or {}).get("provenance"), dict):
        recorded, source = [config["provenance"]], " (config.json)"
    if not recorded:
        return [("Provenance", "not recorded (the records predate it)")]
    texts = [provenance.summary(p) for p in recorded]
    rows = [
        (label, f"{_agreed([t[key] for t in texts])}{source}") for key, label in PROVENANCE_LABELS
    ]
    missing = len(records) - len(recorded) if not source else 0
    if missing > 0:
        rows.append(("Trials without provenance", f"{missing} (older result files)"))
    return rows


def protocol_rows(config: dict | None, records: list[dict], eps: float) -> list[tuple[str, str]]:
    """The protocol table as (setting, value) rows: how the trials ran (from their records), the
    study's design (from config.json), and the eps of B_x(1+eps)."""
    rows = trial_settings_rows(records)
    if not rows:
        rows.append(
            (
                "Trial settings",
                "not recorded in the trials' results"
                if records
                else "no trial has finished yet (each records its settings in its result.json)",
            )
        )
        metric = config_value(config, "train.target_metric")
        if metric:  # until a trial says, the study's target is what config.json asks for
            op = comparison(metric)
            value = config_value(config, "train.target_value")
            rows.append(("Target", f"{metric} {op} {value} (config.json)"))
    if config is None:
        rows.insert(
            0,
            (
                "config.json",
                "missing: the study's design (batch sizes, learning-rate grid, seeds, family) is "
                "unknown; the trials' settings come from their results",
            ),
        )
    else:
        rows += study_design_rows(config)
    rows.append(
        (
            f"B_x{1 + eps:g}",
            f"the batch where epochs to target first reach x{1 + eps:g} those of the two smallest "
            f"batches (eps = {eps:g})",
        )
    )
    rows += provenance_rows(config, records)
    return rows
