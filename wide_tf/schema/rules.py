"""Owns the rules that relate several config fields (a batch and the training set, the budget, the
evaluations' batch-norm subset, ghost batch norm and the batch split, momentum warm-up and the
optimizer, the targets), as one function, `check`, that the config checks run before TensorFlow
starts and the trainer runs again on the config it is given. Each rule's message is one line
naming the problem and the fix. TensorFlow-free, so the batch split itself lives here too
(`micro_batches`), for the config checks and the trainer's BatchPlan alike."""

from __future__ import annotations

from wide_tf.schema import datasets, families, fields, optimizers, targets
from wide_tf.schema.problems import UsageError


class RuleError(UsageError):
    """A config that breaks a rule (or names a malformed target); str(self) is the one line."""


def _raise(message: str | None) -> None:
    if message:
        raise RuleError(message)


def _either(names) -> str:
    """'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


# ------------------------------------------------------------------------------------------------
# Targets


def target_value_error(where: str, metric: str, value, *, listed: bool = False) -> str | None:
    """A target's value: an accuracy in (0, 1], a loss above 0."""
    spec = targets.TARGET_METRICS_SPEC.get(metric)
    if spec is not None and spec.bounded_by_one:
        domain = fields.Num(0, 1, low_open=True, fix="an accuracy above 1 can never be met")
    else:
        domain = fields.Num(0, low_open=True, fix="a cross-entropy loss is never 0 or below")
    return domain.error(where, value, listed=listed)


def parse_target(where: str, spec) -> tuple[str, float]:
    """An entry of train.extra_targets, "metric:value" (e.g. "train_loss:0.1"), as (metric,
    value); a RuleError naming `where` if it is malformed."""
    names = targets.TARGET_METRICS
    fix = (
        'write "metric:value", e.g. "train_loss:0.1", with metric one of '
        f"{', '.join(names)} (a list: change it in the config file)"
    )
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise RuleError(f"{where}={spec!r} is not a target; {fix}")
    metric, text = (part.strip() for part in spec.split(":"))
    if metric not in names:
        raise RuleError(
            f"{where}={spec!r} names no target metric{fields.suggest(metric, names)}; {fix}"
        )
    try:
        value = float(text)
    except ValueError:
        raise RuleError(f"{where}={spec!r} has no number after the colon; {fix}") from None
    _raise(target_value_error(where, metric, value, listed=True))
    return metric, value


def check_targets(config) -> None:
    """The primary target (a known metric, a value in its range) and every extra target."""
    t = config.train
    _raise(fields.field("train.target_metric").domain.error("train.target_metric", t.target_metric))
    _raise(target_value_error("train.target_value", t.target_metric, t.target_value))
    for i, spec in enumerate(t.extra_targets or []):
        parse_target(f"train.extra_targets[{i}]", spec)


# ------------------------------------------------------------------------------------------------
# The batch


def micro_batches(per_replica: int, max_device_batch: int = 0) -> int:
    """How many equal micro-batches one replica's batch is accumulated from: 1 unless it exceeds
    train.max_device_batch (> 0), else the smallest split whose micro-batches fit and are equal."""
    micro = 1
    if max_device_batch and per_replica > max_device_batch:
        micro = -(-per_replica // max_device_batch)
        while per_replica % micro:
            micro += 1
    return micro


def check_batch(
    where: str, batch: int, config, num_train: int, replicas: int | None = 1, source: str = ""
) -> None:
    """A batch (train.global_batch or one of sweep.batch_sizes) against the training set and, if
    `replicas` is given (`source` says where that count comes from), its split over them: even,
    and into micro-batches that ghost batch norm's virtual batch divides."""
    _raise(fields.Num(low=1, integer=True).error(where, batch, listed=where.startswith("sweep.")))
    if batch > num_train:
        raise RuleError(
            f"{where}: batch {batch} is larger than the training set of {config.data.name} "
            f"({num_train} examples); use at most {num_train}"
        )
    if replicas is None:
        return
    if batch % replicas:
        raise RuleError(
            f"{where}: batch {batch} does not divide over {replicas} replicas "
            f"({source}); use a multiple of {replicas}"
        )
    per_replica = batch // replicas
    micro_batch = per_replica // micro_batches(per_replica, config.train.max_device_batch or 0)
    m = config.model
    ghost = m.ghost_batch_size
    # Also a batch smaller than the ghost size: the virtual batch is never shrunk (its statistics
    # would then depend on the number of replicas); the trainer checks again with the hardware.
    if m.norm == "ghost" and micro_batch % ghost:
        on = f" on {replicas} replicas ({source})" if replicas > 1 else ""
        raise RuleError(
            f"{where}: ghost batch norm splits each (micro-)batch of {micro_batch}{on} into "
            f"virtual batches of model.ghost_batch_size={ghost}, which does not divide it; use a "
            f"batch that is a multiple of {ghost} per replica (at least {ghost * replicas} here), "
            f"fewer replicas, or another --config.model.ghost_batch_size"
        )


# ------------------------------------------------------------------------------------------------
# The rules


def _optimizer_rules(o) -> None:
    if o.momentum_warmup_steps and not optimizers.uses_momentum(o.name):
        raise RuleError(
            f"optim.momentum_warmup_steps={o.momentum_warmup_steps} needs an optimizer with "
            f"momentum, but optim.name={o.name!r}; use {_either(optimizers.MOMENTUM_NAMES)}, or "
            f"--config.optim.momentum_warmup_steps=0"
        )
    if o.name in optimizers.OPTIMIZERS and not optimizers.OPTIMIZERS[o.name].weight_decay:
        if o.weight_decay > 0:
            raise RuleError(
                f"optim.name={o.name!r} with optim.weight_decay > 0: use "
                "--config.optim.name=adamw (decoupled decay), or --config.optim.weight_decay=0"
            )


def _budget_rules(t) -> None:
    if t.max_steps <= 0 and t.max_epochs <= 0:
        raise RuleError(
            "no training budget: set --config.train.max_epochs > 0 or --config.train.max_steps > 0"
        )
    if t.max_steps and t.min_steps > t.max_steps:
        raise RuleError(
            f"train.min_steps={t.min_steps} is above the budget train.max_steps={t.max_steps}; "
            f"lower min_steps or raise max_steps"
        )


def _target_bn_rules(config, num_train: int) -> None:
    t = config.train
    subset = min(t.target_bn_examples, num_train)
    if t.target_bn == "recompute" and t.target_bn_batch > subset:
        raise RuleError(
            f"train.target_bn_batch={t.target_bn_batch} is larger than the subset its statistics "
            f"come from ({subset} examples: train.target_bn_examples and the training set); "
            f"use at most {subset} (--config.train.target_bn_batch=...)"
        )
    ghost = config.model.ghost_batch_size
    if t.target_bn == "recompute" and config.model.norm == "ghost" and t.target_bn_batch % ghost:
        raise RuleError(
            f"train.target_bn_batch={t.target_bn_batch} is not a multiple of "
            f"model.ghost_batch_size={ghost}, as ghost batch norm in training mode needs; use a "
            f"multiple of {ghost} (--config.train.target_bn_batch=...)"
        )


def _runtime_rules(rt) -> None:
    cohort = rt.get("cohort", 1)
    if cohort > 1 and rt.get("backend", "tensorflow") != "jax":
        raise RuleError(
            f"runtime.cohort={cohort} trains runs together on the JAX backend only; add "
            "--config.runtime.backend=jax or set --config.runtime.cohort=1"
        )
    if list(rt.devices or []) and rt.strategy != "cpu":
        raise RuleError(
            "runtime.devices lists CPU devices for the cpu strategy only; add "
            "--config.runtime.strategy=cpu or drop runtime.devices"
        )


# The largest model this package lays out: data parallelism only (a whole model per replica), so
# more parameters fit no accelerator; deeper networks exceed Python's recursion in Keras's graph.
MAX_PARAMS = 1e10
MAX_DEPTH = 500


def _size_problem(where: str, depth, params) -> None:
    if isinstance(depth, int | float) and depth > MAX_DEPTH:
        raise RuleError(
            f"{where}: depth {depth:g} is more than the {MAX_DEPTH} layers this package builds "
            "(Keras's graph recursion); use a smaller depth"
        )
    if isinstance(params, int | float) and params > MAX_PARAMS:
        raise RuleError(
            f"{where}: {params:.3g} parameters is more than the {MAX_PARAMS:.0e} that fit one "
            "replica (data parallelism only); use a smaller width, depth or budget"
        )


def _model_rules(config) -> None:
    """One model (no sweep): its depth and width must make a model of its architecture, of a size
    this package can build."""
    m, d = config.model, datasets.of(config.data)
    try:
        n = families.param_count(
            m.arch, m.depth, m.width, d.num_classes, d.input_shape, norm=m.norm
        )
    except (ValueError, TypeError, OverflowError) as e:
        raise RuleError(
            f"model.depth={m.depth!r}, model.width={m.width!r}: {e} "
            f"(--config.model.depth=..., --config.model.width=...)"
        ) from None
    _size_problem(f"model.depth={m.depth!r}, model.width={m.width!r}", m.depth, n)


def _sweep_rules(config) -> None:
    f, m = config.sweep.family, config.model
    d = datasets.of(config.data)
    where = f"sweep.family (kind={f.kind!r}, arch={m.arch!r})"
    budget = f.get("budget") if f.kind == "budget" else None
    _size_problem(f"{where}: budget {budget!r}", None, budget)
    for depth in list(f.get("depths") or []):
        _size_problem(where, depth, None)
    try:
        members = families.from_config(
            m.arch, f, num_classes=d.num_classes, input_shape=d.input_shape, norm=m.norm
        )
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
        raise RuleError(f"{where}: {e}") from None
    for member in members:
        _size_problem(f"{where}: member {member.name}", member.depth, member.params)


def _cadence_rules(t, num_train: int) -> None:
    every = t.eval_every_examples or num_train
    if t.curve_every_examples and t.curve_every_examples % every:
        raise RuleError(
            f"train.curve_every_examples={t.curve_every_examples} is not a multiple of the "
            f"evaluation cadence ({every} examples): use a multiple, e.g. {10 * every}, or 0"
        )


def has_sweep(config) -> bool:
    """A study of many trials: a sweep with batch sizes (`config.sweep = None`: one run)."""
    sweep = config.get("sweep") if config.get("kind", "study") == "study" else None
    return sweep is not None and bool(list(sweep.get("batch_sizes") or []))


def check(config, num_train: int, *, replicas: int | None = 1, source: str = "") -> None:
    """Raises RuleError for the first rule that `config` (whose fields each lie in their domain)
    breaks, with `num_train` training examples and `replicas` replicas (None: not known yet, the
    batch split is checked later with the hardware; `source` names where the count comes from)."""
    check_targets(config)
    _optimizer_rules(config.optim)
    _budget_rules(config.train)
    _cadence_rules(config.train, num_train)
    _target_bn_rules(config, num_train)
    _runtime_rules(config.runtime)
    if has_sweep(config):
        for b in config.sweep.batch_sizes:
            check_batch("sweep.batch_sizes", b, config, num_train, replicas, source)
        _sweep_rules(config)
    else:
        _model_rules(config)
        check_batch(
            "train.global_batch", config.train.global_batch, config, num_train, replicas, source
        )
