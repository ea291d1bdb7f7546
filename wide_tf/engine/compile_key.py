"""Owns which config fields change a run's compiled program, for every backend: KEY_EXCLUDED (the
fields a kept build takes by resetting values, not by compiling again) and the config's part of
the key under which a build is kept across the runs of a study (engine/tf/reuse.py on TensorFlow,
engine/jax/run.py on JAX). No TensorFlow."""

from __future__ import annotations

# The config fields that do NOT change the traced program, so runs that differ only in them share
# one: every other field, a new one included, is in the key and gets a new build. Each entry says
# why it may be left out; a field belongs here only if the reset in `build` (weights, optimizer
# variables, schedule, threshold) or the host loop takes care of it.
KEY_EXCLUDED = {
    # Numbers held in the learning-rate schedule's variables (schedules.WarmupDecaySchedule), which
    # `build` reassigns for every run; the count of decay boundaries is a shape: kept (below).
    "optim": (
        "base_lr",
        "lr_multiplier",
        "scaling",
        "reference_batch",
        "warmup_epochs",
        "warmup_steps",
        "warmup_fixed",
        "decay_epochs",
        "decay_factor",
        "poly_power",
        "end_lr_fraction",
    ),
    "train": (
        "seed",  # the initial weights, set from the seed's own copy
        "diverge_loss",  # a variable of the step (Stepper.diverge_loss)
        # Read by the host loop only: the budget, the cadences, the targets and when to stop.
        "max_epochs",
        "max_steps",
        "min_steps",
        "steps_per_loop",  # an argument tensor of the traced loop
        "eval_every_examples",
        "eval_economy",  # which passes the host asks for, and where they stop
        "curve_every_examples",
        "target_metric",
        "target_value",
        "stop_at_target",
        "extra_targets",
        "checkpoint_every_steps",
        "gradient_every_examples",  # the probe's cadence (GradientProbe.every, reset per run)
        "gradient_at_init",
        "noise_scale_ema",
    ),
    # The study's grid: a trial's config has none, and the engine never reads it.
    "sweep": None,
}


def _key_part(section: str, value):
    excluded = KEY_EXCLUDED.get(section, ())
    if excluded is None:
        return None
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k not in excluded}


def config_key(config, member_only: bool = False) -> dict:
    """The config without KEY_EXCLUDED (and the count of decay boundaries, a shape);
    `member_only`: without train.global_batch as well (the same member at any batch)."""
    resolved = config.to_dict()
    key = {k: _key_part(k, v) for k, v in resolved.items() if _key_part(k, v) is not None}
    if "optim" in key:
        key["optim"]["decay_boundaries"] = len(config.optim.decay_epochs)
    if member_only:
        key["train"].pop("global_batch", None)
    return key
