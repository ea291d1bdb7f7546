"""Owns the command line's overrides of a config (--config.a.b=value): that each names a field,
with the nearest one suggested, and that none sets a field a sweep sets for every trial."""

from __future__ import annotations

from wide_tf.schema.fields import suggest
from wide_tf.schema.problems import UsageError
from wide_tf.schema.rules import has_sweep

# Fields a sweep sets per trial: an override of one of them would be silently replaced.
SWEEP_SETS = {
    "model.depth": (
        "the family's depths (sweep.family.depths, or sweep.family.depth for kind='width')"
    ),
    "model.width": "the family (sweep.family.budget, sweep.family.widths or sweep.family.width)",
    "train.global_batch": "sweep.batch_sizes",
    "optim.lr_multiplier": "sweep.lr_multipliers",
    "train.seed": "sweep.seeds",
}

# Names people type for a field that is called something else here.
ALIASES = {
    "learning_rate": "optim.base_lr",
    "lr": "optim.base_lr",
    "batch_size": "train.global_batch",
    "batch": "train.global_batch",
    "epochs": "train.max_epochs",
    "num_epochs": "train.max_epochs",
    "steps": "train.max_steps",
    "num_steps": "train.max_steps",
    "optimizer": "optim.name",
    "dataset": "data.name",
    "wd": "optim.weight_decay",
    "target": "train.target_value",
}


# ------------------------------------------------------------------------------------------------
# Overrides on the command line


def override_paths(argv) -> list[str]:
    """The dotted field of every --config.a.b=value (or --noconfig.a.b) in argv."""
    out = []
    for arg in argv[1:]:
        if arg == "--":
            break
        name = arg.lstrip("-").split("=", 1)[0]
        if not arg.startswith("-"):
            continue
        if name.startswith("config."):
            out.append(name[len("config.") :])
        elif name.startswith("noconfig."):
            out.append(name[len("noconfig.") :])
    return out


# Flags whose second value would silently win over the first (absl keeps the last): refused.
ONCE = ("config", "workdir", "shard", "workers", "trial", "accelerator", "replicas", "suite")


def check_config_once(argv) -> None:
    """--config (and every flag in ONCE) given twice would be checked against the first and run
    with the last, or run with the last silently: refused. An
    empty --config.sweep.batch_sizes would turn a study into one run at train.global_batch:
    refused too."""
    given: dict[str, list[str]] = {}
    args = list(argv[1:])
    for i, arg in enumerate(args):
        if arg == "--":
            break
        name, eq, value = arg.lstrip("-").partition("=")
        if arg.startswith("-") and (name in ONCE or name == "config.sweep.batch_sizes"):
            given.setdefault(name, []).append(
                value if eq else (args[i + 1] if i + 1 < len(args) else "")
            )
    for name, values in given.items():
        if len(values) > 1 and name in ONCE:
            fix = " (override fields with --config.a.b=value)" if name == "config" else ""
            raise UsageError(
                f"--{name} is given {len(values)} times ({', '.join(values)}); give it once{fix}"
            )
    batches = given.get("config.sweep.batch_sizes")
    if batches and batches[-1].strip().strip("()[], ") == "":
        raise UsageError(
            f"--config.sweep.batch_sizes={batches[-1]!r} is empty, which would make the study one "
            f"run at train.global_batch; list at least one batch, e.g. "
            f"--config.sweep.batch_sizes='(32,256)', or use a single-run variant"
        )


def _is_dict(x) -> bool:
    return hasattr(x, "keys") and hasattr(x, "get") and not isinstance(x, (str, bytes))


def _all_paths(config, prefix="") -> list[str]:
    out = []
    for k in config.keys():  # noqa: SIM118  (a ConfigDict)
        v = config[k]
        out.append(prefix + k)
        if _is_dict(v):
            out.extend(_all_paths(v, prefix + k + "."))
    return out


def check_override_path(config, path: str) -> None:
    """An unknown field in --config.<path> names the nearest valid field and the section's
    fields."""
    node, done = config, []
    for part in path.split("."):
        if node is None:
            return  # e.g. an override below `sweep` on a config without a sweep: caught elsewhere
        if not _is_dict(node):
            raise UsageError(
                f"--config.{path}: {'.'.join(done)} is a value, not a section; "
                f"override it as --config.{'.'.join(done)}=..."
            )
        if part not in node.keys():  # noqa: SIM118  (a ConfigDict)
            where = ".".join(done) or "the config"
            keys = sorted(node.keys())
            hint = suggest(part, keys)
            if not hint and part in ALIASES:
                hint = f" (did you mean {ALIASES[part]!r}?)"
            if not hint:  # the same name in another section: --config.train.base_lr
                others = [p for p in _all_paths(config) if p.split(".")[-1] == part]
                if others:
                    hint = f" (did you mean {others[0]!r}?)"
                else:
                    hint = suggest(".".join(done + [part]), _all_paths(config))
            raise UsageError(
                f"--config.{path}: {where} has no field {part!r}{hint}; "
                f"its fields are {', '.join(keys)}"
            )
        done.append(part)
        node = node[part]


def is_sweep(config) -> bool:
    """A study of many trials (else one run in the workdir itself), as main.py dispatches it: a
    sweep with batch sizes. `config.sweep = None` (the :single variants) is one run."""
    return has_sweep(config)


def check_overrides(config, paths) -> None:
    for path in paths:
        check_override_path(config, path)
    if is_sweep(config):
        for path in paths:
            if path in SWEEP_SETS:
                raise UsageError(
                    f"--config.{path} cannot apply: this config is a sweep, which sets {path} for "
                    f"every trial from {SWEEP_SETS[path]}; change that instead, or run one trial "
                    f"with a config that has no sweep (e.g. the :single variant)"
                )
