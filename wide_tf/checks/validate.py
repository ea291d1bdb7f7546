"""Owns checking a resolved config before TensorFlow starts (`check_config`), so that a typo or an
impossible setting costs a fraction of a second and one line, and the names the rest of the package
calls these checks by.

Pure Python, deliberately (main.py runs these checks before it imports TensorFlow). The checks
themselves live in: checks/overrides.py (the command line's --config.* overrides),
checks/fields_check.py (every field against its declared domain, schema/fields.py), schema/rules.py
(the rules that relate several fields, which the trainer runs too) and checks/preflight.py (the
machine, the data, --workers and the workdir). Every check raises a `Problem` whose message names
the problem and the fix in one line: `UsageError` (exit status 2) when the command or config is
wrong, `RuntimeProblem` (exit status 1) when the machine or the workdir is.
"""

from __future__ import annotations

import contextlib

from wide_tf.checks import fields_check, preflight
from wide_tf.checks.fields_check import parse_target
from wide_tf.checks.overrides import (
    check_config_once,
    check_override_path,
    check_overrides,
    is_sweep,
    override_paths,
)
from wide_tf.checks.preflight import (
    check_shard,
    check_trial,
    check_workdir,
    check_workdir_scheme,
    check_workers,
    parse_workers,
)
from wide_tf.schema import architectures, datasets, fields, identity, rules
from wide_tf.schema.fields import suggest
from wide_tf.schema.problems import Problem, RuntimeProblem, UsageError

__all__ = [
    "Problem",
    "UsageError",
    "RuntimeProblem",
    "suggest",
    "check_config",
    "check_override_path",
    "check_overrides",
    "override_paths",
    "is_sweep",
    "parse_target",
    "check_shard",
    "check_config_once",
    "check_trial",
    "check_workdir_scheme",
    "check_workdir",
    "check_workers",
    "parse_workers",
    "design_warnings",
    "for_target",
    "study_part",
]

study_part = identity.study_part  # the part of a config that defines the study's results


def dataset_facts(config):
    """(training examples after data.num_train, classes, input shape after the data options,
    the TFDS name when a TFDS copy is read, else None)."""
    fields_check.check_value(config, fields.field("data.name"))
    if "pool" in config.data:
        fields_check.check_value(config, fields.field("data.pool"))
    d = datasets.of(config.data)
    n = int(config.data.num_train or 0)
    tfds_name = d.tfds_name if d.loader == "tfds" else None
    return (min(d.num_train, n) if n else d.num_train), d.num_classes, d.input_shape, tfds_name


# The replica count of the machine a config is checked for, when that is not this machine
# (`main --dry_run --replicas=N`, which launch_tpu.sh runs on the workstation before it creates a
# VM); None: this machine. Set only inside `for_target`.
_TARGET_REPLICAS: int | None = None


def check_command(
    config, argv, *, dry_run, workdir, shard, workers, trial, listing, accelerator, replicas
) -> list[str]:
    """Everything main checks before TensorFlow starts, in order (the flags' values as given);
    returns the warning lines. The --config.* overrides in `argv` were checked once already, by
    command_line.parse_flags before absl applied them (a bad path is one line): not again here."""
    check_dry_run_only(dry_run, accelerator, replicas)
    check_config_once(argv)
    check_shard(shard)
    check_workdir_scheme(workdir)
    check_workers(workers, config, trial)
    if dry_run or listing:  # the checks for the target machine: a listing reads no data either
        with for_target(replicas):
            check_config(config)
        check_trial(trial, config)
        return []
    check_config(config)
    check_trial(trial, config)
    if not listing and not workdir:
        raise UsageError("--workdir is required (a local folder or gs://bucket/path)")
    if listing:
        return []
    return design_warnings(config) + check_workdir(config, workdir)


def check_cluster(cluster, workers, shard, trial) -> None:
    """--cluster hands the study's groups to a Ray cluster's hosts: --workers, --shard and
    --trial choose processes or trials on one machine and mean nothing there."""
    if cluster is None:
        return
    if not cluster.strip():
        raise UsageError("--cluster is empty; give auto (this machine's Ray cluster) or HEAD:6379")
    for name, value in (("workers", workers), ("shard", shard), ("trial", trial)):
        if value is not None:
            raise UsageError(
                f"--{name} runs on one machine and --cluster hands every group to the cluster's "
                f"hosts; drop one of them"
            )


def check_dry_run_only(dry_run: bool, accelerator, replicas) -> None:
    """--accelerator and --replicas check another machine: they mean nothing without --dry_run."""
    if accelerator is not None and not dry_run:
        raise UsageError("--accelerator is for --dry_run (a memory check); add --dry_run")
    if replicas is not None and not dry_run:
        raise UsageError(
            "--replicas is for --dry_run (a check for another machine); add --dry_run, or "
            "drop --replicas: a run counts the replicas it is given"
        )


@contextlib.contextmanager
def for_target(replicas: int | None):
    """Inside: check_config checks the batches for `replicas` replicas (a TPU slice or GPU box that
    does not exist yet) and skips the checks of this machine's hardware and data, which say
    nothing about the target."""
    global _TARGET_REPLICAS
    if replicas is not None and (isinstance(replicas, bool) or int(replicas) < 1):
        raise UsageError(f"--replicas={replicas}: give the target's replica count, 1 or more")
    saved, _TARGET_REPLICAS = _TARGET_REPLICAS, (int(replicas) if replicas else 1)
    try:
        yield
    finally:
        _TARGET_REPLICAS = saved


def _replicas(config) -> tuple[int, str]:
    """Replicas known before TensorFlow starts, and where that count comes from: --replicas, or a
    cpu strategy's device list; 1 otherwise (the trainer checks again once it sees the
    hardware)."""
    if _TARGET_REPLICAS is not None:
        return _TARGET_REPLICAS, "--replicas"
    rt = config.runtime
    if rt.strategy == "cpu" and rt.devices:
        return len(rt.devices), "runtime.devices"
    return 1, "runtime.devices"


def check_config(config, overrides=()) -> None:
    """Raises a Problem for the first thing in `config` (and the overrides that made it) that
    cannot work; returns None when the config is fit to run."""
    if overrides:  # (main's were checked as its flags were parsed: command_line.parse_flags)
        check_overrides(config, overrides)
    kind = config.get("kind", "study")
    kind_error = fields.Choice(fields.KINDS).error("kind", kind)
    if kind_error:
        raise UsageError(kind_error)
    if kind == "theory":
        fields_check.check_theory(config)
        return
    fields_check.check_sections(config)
    try:  # a model from outside the package (model.arch=pkg.module) registers itself first
        architectures.ensure(config.model.arch)
    except ValueError as e:
        raise UsageError(str(e)) from None
    num_train, _, _, tfds_name = dataset_facts(config)
    fields_check.check_values(config)
    preflight.check_processes(config)  # also in a workstation's --dry_run for the VM
    replicas, source = _replicas(config)
    try:
        rules.check(config, num_train, replicas=replicas, source=source)
    except rules.RuleError as e:
        raise UsageError(str(e)) from None
    if _TARGET_REPLICAS is None:  # this machine is the one that runs it
        preflight.check_hardware(config)
        preflight.check_data_present(config, tfds_name)


def design_warnings(config) -> list[str]:
    """What a study can run but a reader should doubt (warnings, not errors)."""
    if config.get("kind", "study") != "study" or not is_sweep(config):
        return []
    num_train = dataset_facts(config)[0]
    big = max(int(b) for b in config.sweep.batch_sizes)
    if big <= num_train / 4:
        return []
    return [
        f"sweep.batch_sizes reach {big}, {big / num_train:.0%} of the {num_train} training "
        f"examples: sampling without replacement scales the gradient-noise variance by "
        f"(n - B) / (n - 1) = {(num_train - big) / (num_train - 1):.2f} there, so large batches "
        f"look better than they would on more data; keep batches at most n / 8 "
        f"({num_train // 8}) or use a larger data set"
    ]
