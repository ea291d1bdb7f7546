"""Owns the result record of a run (result.json), built against the one schema in
wide_tf/schema/result_fields.py from plain data (the config, the plan, the state, the backend's
facts), and the protocol every record carries (describe_protocol)."""

from __future__ import annotations

from wide_tf.engine import timing
from wide_tf.engine.measure.noise_scale import TwoBatchNoiseScale
from wide_tf.engine.state import RunPlan, RunState
from wide_tf.engine.targets import extra_targets
from wide_tf.schema import lr_schedules, optimizers, provenance, result_fields
from wide_tf.schema import targets as targets_lib

_comparison = targets_lib.comparison


def momentum_ramp_steps(optim_cfg) -> float | None:
    """1 / (1 - momentum): the steps over which heavy-ball momentum builds up to its full effect
    (the weight of past gradients sums to it), for the optimizers that use optim.momentum; None
    for the others. A steps-to-target of this order may be a transient of the optimizer."""
    if not optimizers.uses_momentum(optim_cfg.name) or not optim_cfg.momentum:
        return None
    return 1.0 / (1.0 - float(optim_cfg.momentum))


def describe_protocol(config) -> dict:
    """The settings a reader needs to compare runs; copied into every result.json."""
    t, o, m, d = config.train, config.optim, config.model, config.data
    return {
        "target": f"{t.target_metric} {_comparison(t.target_metric)} {t.target_value}",
        "extra_targets": [f"{m} {_comparison(m)} {v}" for m, v in extra_targets(config)],
        "stop_at_target": t.stop_at_target,
        "eval_every_examples": t.eval_every_examples,
        "max_epochs": t.max_epochs,
        "max_steps": t.max_steps,
        "min_steps": t.min_steps,
        "optimizer": o.name,
        "schedule": o.schedule,
        "warmup": (
            f"{o.warmup_epochs} epochs" if o.warmup_fixed == "epochs" else f"{o.warmup_steps} steps"
        )
        + f" (fixed in {o.warmup_fixed})",
        "scaling": o.scaling,
        "reference_batch": o.reference_batch,
        "norm": m.norm,
        # How batch norm is judged at every evaluation (None: the model has no batch norm).
        "target_bn": t.target_bn if m.norm in ("batch", "ghost") else None,
        "target_bn_examples": t.target_bn_examples if t.target_bn == "recompute" else None,
        "target_bn_batch": t.target_bn_batch if t.target_bn == "recompute" else None,
        "ghost_batch_size": m.ghost_batch_size if m.norm == "ghost" else None,
        "data": d.name,
        "augment": d.augment,
        "shuffle_buffer": d.shuffle_buffer,
        "max_device_batch": t.max_device_batch,
        # What "diverged" means, and what the training metric is measured on.
        "diverge_loss": t.diverge_loss,
        "eval_train_limit": t.eval_train_limit,
        # The numbers of the schedule in use (its registry entry's fields).
        "schedule_settings": {k: o[k] for k in lr_schedules.SCHEDULES[o.schedule].hyper},
        # The gradient statistics: how often, and on how many examples (n of the batch bound).
        "gradient_every_examples": t.gradient_every_examples,
        "probe_size": t.probe_size,
        # The optimizer's hyper-parameters as its registry entry declares them (schema/optimizers).
        **optimizers.protocol_block(o),
    }


def _primary_numbers(st, batch: int, n_train: int) -> dict:
    """The primary target's numbers at the top level of the record."""
    s_target = st.steps_to_target if st.status == "reached" else None
    if s_target is None:
        interp = None
    else:
        interp = (
            st.steps_to_target_interp if st.steps_to_target_interp is not None else float(s_target)
        )
    return {
        "steps_to_target": s_target,
        # The crossing interpolated between the two evaluations around it (the analysis uses it).
        "steps_to_target_interp": interp,
        "epochs_to_target": None if s_target is None else s_target * batch / n_train,
        "examples_to_target": None if s_target is None else s_target * batch,
    }


def _evaluations_to_target(st, eval_steps) -> int | None:
    """How finely the evaluation cadence resolved the primary crossing: the evaluation steps after
    the initial one up to and including the one that first met the target (counted on the
    cadence: the economy stops most passes early, engine/evaluation.py)."""
    s_target = st.steps_to_target if st.status == "reached" else None
    if s_target is None:
        return None
    return sum(1 for s in eval_steps if 0 < s <= s_target)


def _noise_scale_ema(st: RunState) -> float | None:
    """The two-batch noise scale's moving average at the end (the estimator's state is the
    run's: RunState.noise)."""
    value = TwoBatchNoiseScale.from_dict(st.noise).value if st.noise else None
    return None if value is None else float(value)


def build(config, trial: dict, plan: RunPlan, st: RunState, targets: list, facts) -> dict:
    """The record of a finished run: its trial's fields, then every field of the schema in its
    order. `targets`: every target's record, the primary first (engine/targets.Targets.records);
    `facts`: the backend's RunFacts (engine/interface.Trainer.describe)."""
    t, batch, n_train = config.train, plan.batch, plan.num_train
    last = st.history[-1]
    values = {
        "trial_id": plan.name,
        "arch": config.model.arch,
        "depth": config.model.depth,
        "width": config.model.width,
        "params": facts.params,
        "batch_size": batch,
        "lr_multiplier": config.optim.lr_multiplier,
        "learning_rate": facts.learning_rate,
        "optimizer": config.optim.name,
        "seed": t.seed,
        "num_train": n_train,
        "status": st.status,
        "target": {"metric": t.target_metric, "value": t.target_value},
        **_primary_numbers(st, batch, n_train),
        "targets": targets,
        "evaluations_to_target": _evaluations_to_target(st, plan.eval_steps),
        # 1 / (1 - momentum), to set steps-to-target against momentum's build-up.
        "momentum_ramp_steps": momentum_ramp_steps(config.optim),
        "diverged_at_step": st.diverged_at,
        "steps": st.step,
        "epochs": st.step * batch / n_train,
        "final": {k: last.get(k) for k in (f.name for f in result_fields.FINAL)},
        "best_test_accuracy": st.best_test_accuracy,
        "wall_time_s": st.wall_time_s,
        "time_s": timing.settle(st.time_s, st.wall_time_s),
        "examples_per_s": st.step * batch / st.train_time_s if st.train_time_s else None,
        "gradient": {"history": st.gradient, "noise_scale_ema": _noise_scale_ema(st)},
        "runtime": facts.runtime,
        # The policy the model was really built with (not only the one asked for).
        "dtype_policy": facts.dtype_policy,
        "protocol": describe_protocol(config),
        # The batch's layout really used: the micro-batch cap in force (protocol's
        # max_device_batch is the config's, 0 on a GPU that got the memory model's default).
        "batch_plan": facts.batch_plan,
        "provenance": provenance.collect(),
    }
    unknown = set(values) - set(result_fields.NAMES)
    assert not unknown, f"fields missing from wide_tf/schema/result_fields.py: {sorted(unknown)}"
    record = dict(trial)
    record.update({name: values[name] for name in result_fields.NAMES if name in values})
    record.setdefault("member", f"{config.model.arch}-d{config.model.depth}-w{config.model.width}")
    if st.diverged_at is not None:
        record["final"] = {k: None for k in record["final"]}  # no meaningful model to evaluate
    return record
