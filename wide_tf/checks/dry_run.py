"""Owns --dry_run's output: what was checked for the target's replica count and, with
--accelerator, whether the config's memory fits that accelerator (checks/hardware_fit.py's
model) and a study's cohort plan there (checks/cohort_plan.py), all before TensorFlow starts."""

from __future__ import annotations

from wide_tf.checks import cohort_plan, hardware_fit, validate
from wide_tf.schema import memory, problems


def checked_line(config, replicas: int | None) -> str:
    """One line saying what was checked."""
    sweep = config.get("sweep")
    batches = list(sweep.batch_sizes) if validate.is_sweep(config) else None
    if config.get("kind", "study") == "theory":
        what = "the theory check"
    else:
        what = f"batches {batches}" if batches else f"batch {config.train.global_batch}"
        if config.model.norm == "ghost":
            what += f", ghost batch {config.model.ghost_batch_size}"
    n = replicas or 1
    return f"dry run: the config fits {n} replica(s): {what}; nothing was run"


def accelerator_key(name: str) -> str:
    """A wide_tf.schema.memory.DEVICES key for `name`: a key, a slice family ('v5litepod'), a slice
    ('v4-8'), or a GPU as CUDA names it ('NVIDIA A100-SXM4-80GB')."""
    for candidate in (name, name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else None):
        if candidate is not None:
            key = memory.SLICE_FAMILIES.get(candidate, candidate)
            if key in memory.DEVICES:
                return key
    gpu = memory.gpu_from_name(name)
    if gpu is None:
        raise problems.UsageError(
            f"--accelerator={name}: unknown; choose one of {', '.join(memory.DEVICES)}, a slice "
            f"(v4-8) or a GPU's name (NVIDIA A100-SXM4-40GB)"
        )
    return next(k for k, d in memory.DEVICES.items() if d is gpu)


def memory_fit(config, replicas: int | None, accelerator: str) -> hardware_fit.Fit | None:
    """The memory check of `config` on `replicas` x `accelerator` (None for the theory check)."""
    if config.get("kind", "study") == "theory":
        return None
    return hardware_fit.check(config, replicas or 1, accelerator_key(accelerator))


def run(config, replicas: int | None, accelerator: str | None, out=print) -> int:
    """--dry_run after the checks passed: prints what was checked and, with an accelerator, the
    memory line; returns the exit status (hardware_fit.EXIT_DOES_NOT_FIT when it does not fit)."""
    fit = memory_fit(config, replicas, accelerator) if accelerator else None
    out(checked_line(config, replicas))
    if fit is None:
        return 0
    out(fit.line())
    cohorts = cohort_plan.plan_for(config, replicas or 1, accelerator_key(accelerator))
    for line in cohorts.lines() if cohorts is not None else ():
        out(line)
    return 0 if fit.fits else hardware_fit.EXIT_DOES_NOT_FIT
