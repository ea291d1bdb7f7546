"""Owns checking a resolved config, the command line's overrides and the workdir before TensorFlow
starts, so that a typo or an impossible setting costs a fraction of a second and one line.

Pure Python, deliberately: ml_collections, json, difflib, and architectures.py and families.py,
which need no TensorFlow (main.py runs these checks before it imports TensorFlow). Every
check raises a `Problem` whose message names the problem and the fix in one line:
`UsageError` (exit status 2) when the command or config is wrong, `RuntimeProblem` (exit status 1)
when the machine or the workdir is. Names that are close to a valid one get a suggestion.

The choices below repeat names that live in modules which import TensorFlow (data.py, optim.py,
train.py, strategy.py); tests/test_errors.py checks that they agree.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import json
import math
import os
import tempfile

from wide_tf.spec import architectures, defaults, families, hardware, targets


class Problem(Exception):
    """A run that cannot go ahead; str(self) is the one line to show."""

    exit_code = 1


class UsageError(Problem, ValueError):
    """The command line or the config asks for something invalid (exit status 2)."""

    exit_code = 2


class RuntimeProblem(Problem):
    """The machine, the data or the workdir cannot serve a valid request (exit status 1)."""

    exit_code = 1


# (num_train, num_test, num_classes, input_shape, TFDS name or None for the embedded sets)
DATASETS = {
    "mnist_embedded": (4000, 1000, 10, (28, 28, 1), None),
    "digits_embedded": (1438, 359, 10, (8, 8, 1), None),
    "mnist": (60000, 10000, 10, (28, 28, 1), "mnist"),
    "fashion_mnist": (60000, 10000, 10, (28, 28, 1), "fashion_mnist"),
    "cifar10": (50000, 10000, 10, (32, 32, 3), "cifar10"),
    "cifar100": (50000, 10000, 100, (32, 32, 3), "cifar100"),
    "svhn_cropped": (73257, 26032, 10, (32, 32, 3), "svhn_cropped"),
}
# The optimizer and schedule names have one home, defaults.py (TensorFlow-free; optim.py checks
# its registry against them).
OPTIMIZERS = defaults.OPTIMIZER_NAMES
SCHEDULES = defaults.SCHEDULE_NAMES
SCALING_RULES = defaults.SCALING_RULES
TRUST_RATIO_FORMS = defaults.TRUST_RATIO_FORMS
WARMUP_FIXED = ("epochs", "steps")
TARGET_METRICS = targets.TARGET_METRICS
STRATEGIES = ("auto", "tpu", "gpu", "cpu", "multi_worker")
PRECISIONS = ("auto", "float32", "mixed_bfloat16")
KINDS = ("study", "theory")

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

# Settings that change how, not what, a run computes (as in study.py; a test checks they agree).
OPERATIONAL = {"runtime": None, "train": ("steps_per_loop", "checkpoint_every_steps", "eval_batch")}


# ------------------------------------------------------------------------------------------------
# Suggestions


def suggest(word, choices) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice(where: str, value, choices) -> None:
    if value not in choices:
        raise UsageError(
            f"{where}={value!r} is not valid{suggest(value, choices)}; choose one of "
            f"{', '.join(map(str, choices))} (--config.{where}=...)"
        )


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
    sweep = config.get("sweep") if config.get("kind", "study") == "study" else None
    return sweep is not None and bool(list(sweep.get("batch_sizes") or []))


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


# ------------------------------------------------------------------------------------------------
# Values


def _num(
    where: str,
    value,
    *,
    low=None,
    high=None,
    low_open=False,
    high_open=False,
    integer=False,
    fix: str = "",
    listed: bool = False,
) -> float:
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if not bad and integer and int(value) != value:
        bad = True
    if not bad and not math.isfinite(value):
        bad = True
    if not bad and low is not None and (value < low or (low_open and value == low)):
        bad = True
    if not bad and high is not None and (value > high or (high_open and value == high)):
        bad = True
    if bad:
        lo = "" if low is None else ("> " if low_open else ">= ") + f"{low:g}"
        hi = "" if high is None else ("< " if high_open else "<= ") + f"{high:g}"
        rng = " and ".join(x for x in (lo, hi) if x)
        kind = "an integer" if integer else "a finite number"
        raise UsageError(
            f"{where}={value!r} is out of range: use {kind}{' ' + rng if rng else ''}"
            f"{'; ' + fix if fix else ''} "
            + ("(a list: change it in the config file)" if listed else f"(--config.{where}=...)")
        )
    return value


def _ints(where: str, values, *, low=1, nonempty=True, fix="") -> list:
    values = list(values or [])
    if nonempty and not values:
        raise UsageError(f"{where} is empty; list at least one value in the config file{fix}")
    for v in values:
        _num(where, v, low=low, integer=True, listed=True)
    return values


def _dataset(config):
    name = config.data.name
    _choice("data.name", name, tuple(DATASETS))
    num_train, _, classes, shape, tfds_name = DATASETS[name]
    n = int(config.data.num_train or 0)
    return (min(num_train, n) if n else num_train), classes, shape, tfds_name


# The replica count of the machine a config is checked for, when that is not this machine
# (`main --dry_run --replicas=N`, which launch_tpu.sh runs on the workstation before it creates a
# VM); None: this machine. Set only inside `for_target`.
_TARGET_REPLICAS: int | None = None


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


def _replicas(config) -> int:
    """Replicas known before TensorFlow starts: only a cpu strategy's device list says; 1 otherwise
    (the trainer checks again once it sees the hardware)."""
    if _TARGET_REPLICAS is not None:
        return _TARGET_REPLICAS
    rt = config.runtime
    if rt.strategy == "cpu" and rt.devices:
        return len(rt.devices)
    return 1


def _check_batch(where: str, batch: int, config, num_train: int) -> None:
    _num(where, batch, low=1, integer=True, listed=where.startswith("sweep."))
    if batch > num_train:
        raise UsageError(
            f"{where}: batch {batch} is larger than the training set of {config.data.name} "
            f"({num_train} examples); use at most {num_train}"
        )
    replicas = _replicas(config)
    source = "--replicas" if _TARGET_REPLICAS is not None else "runtime.devices"
    if batch % replicas:
        raise UsageError(
            f"{where}: batch {batch} does not divide over {replicas} replicas "
            f"({source}); use a multiple of {replicas}"
        )
    per_replica = batch // replicas
    cap = config.train.max_device_batch or 0
    micro = 1
    if cap and per_replica > cap:
        micro = -(-per_replica // cap)
        while per_replica % micro:
            micro += 1
    micro_batch = per_replica // micro
    m = config.model
    ghost = m.ghost_batch_size
    # Also a batch smaller than the ghost size: the virtual batch is never shrunk (its statistics
    # would then depend on the number of replicas); the trainer checks again with the hardware.
    if m.norm == "ghost" and micro_batch % ghost:
        on = f" on {replicas} replicas ({source})" if replicas > 1 else ""
        raise UsageError(
            f"{where}: ghost batch norm splits each (micro-)batch of {micro_batch}{on} into "
            f"virtual batches of model.ghost_batch_size={ghost}, which does not divide it; use a "
            f"batch that is a multiple of {ghost} per replica (at least {ghost * replicas} here), "
            f"fewer replicas, or another --config.model.ghost_batch_size"
        )


def _check_model(config, classes, shape) -> None:
    m = config.model
    _choice("model.arch", m.arch, architectures.names())
    _choice("model.norm", m.norm, architectures.NORMS)
    if m.norm == "ghost":
        _num("model.ghost_batch_size", m.ghost_batch_size, low=1, integer=True)
    if not is_sweep(config):
        try:
            families.param_count(m.arch, m.depth, m.width, classes, shape, norm=m.norm)
        except (ValueError, TypeError) as e:
            raise UsageError(
                f"model.depth={m.depth!r}, model.width={m.width!r}: {e} "
                f"(--config.model.depth=..., --config.model.width=...)"
            ) from None


def _check_optim(config) -> None:
    o = config.optim
    _choice("optim.name", o.name, OPTIMIZERS)
    fix_lr = (
        "a learning rate of 0 does not train and a negative one ascends the loss; "
        "the study tunes the rate through sweep.lr_multipliers"
    )
    _num("optim.base_lr", o.base_lr, low=0, low_open=True, fix=fix_lr)
    _num("optim.reference_batch", o.reference_batch, low=1, integer=True)
    _choice("optim.scaling", o.scaling, SCALING_RULES)
    _num("optim.lr_multiplier", o.lr_multiplier, low=0, low_open=True)
    _num("optim.momentum", o.momentum, low=0, high=1, high_open=True)
    _num("optim.momentum_warmup_steps", o.momentum_warmup_steps, low=0, integer=True)
    if o.momentum_warmup_steps and o.name not in ("momentum", "nesterov", "lars"):
        raise UsageError(
            f"optim.momentum_warmup_steps={o.momentum_warmup_steps} needs an optimizer with "
            f"momentum, but optim.name={o.name!r}; use momentum, nesterov or lars, or "
            f"--config.optim.momentum_warmup_steps=0"
        )
    _num("optim.weight_decay", o.weight_decay, low=0)
    if o.name == "adam" and o.weight_decay > 0:
        raise UsageError(
            "optim.name='adam' with optim.weight_decay > 0: use --config.optim.name=adamw "
            "(decoupled decay), or --config.optim.weight_decay=0"
        )
    _num("optim.lars_eta", o.lars_eta, low=0, low_open=True)
    _choice("optim.lars_trust_ratio", o.lars_trust_ratio, TRUST_RATIO_FORMS)
    _num("optim.lars_epsilon", o.lars_epsilon, low=0)
    _choice("optim.schedule", o.schedule, SCHEDULES)
    _num("optim.warmup_epochs", o.warmup_epochs, low=0)
    _num("optim.warmup_steps", o.warmup_steps, low=0, integer=True)
    _choice("optim.warmup_fixed", o.warmup_fixed, WARMUP_FIXED)
    decay = list(o.decay_epochs or [])
    for d in decay:
        _num("optim.decay_epochs", d, low=0, low_open=True, listed=True)
    if decay != sorted(decay):
        raise UsageError(
            f"optim.decay_epochs={decay} must increase; fix the list in the config file"
        )
    _num("optim.decay_factor", o.decay_factor, low=0, high=1, low_open=True)
    _num("optim.poly_power", o.poly_power, low=0, low_open=True)
    _num("optim.end_lr_fraction", o.end_lr_fraction, low=0, high=1)


def _target_value(where: str, metric: str, value, *, listed: bool = False) -> None:
    """A target's value: an accuracy in (0, 1], a loss above 0."""
    spec = targets.TARGET_METRICS_SPEC.get(metric)
    if spec is not None and spec.bounded_by_one:
        _num(
            where,
            value,
            low=0,
            high=1,
            low_open=True,
            fix="an accuracy above 1 can never be met",
            listed=listed,
        )
    else:
        _num(
            where,
            value,
            low=0,
            low_open=True,
            fix="a cross-entropy loss is never 0 or below",
            listed=listed,
        )


def parse_target(where: str, spec) -> tuple[str, float]:
    """An entry of train.extra_targets, "metric:value" (e.g. "train_loss:0.1"), as (metric,
    value); a UsageError naming `where` if it is malformed."""
    fix = (
        'write "metric:value", e.g. "train_loss:0.1", with metric one of '
        f"{', '.join(TARGET_METRICS)} (a list: change it in the config file)"
    )
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise UsageError(f"{where}={spec!r} is not a target; {fix}")
    metric, text = (part.strip() for part in spec.split(":"))
    if metric not in TARGET_METRICS:
        raise UsageError(
            f"{where}={spec!r} names no target metric{suggest(metric, TARGET_METRICS)}; {fix}"
        )
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{where}={spec!r} has no number after the colon; {fix}") from None
    _target_value(where, metric, value, listed=True)
    return metric, value


def _check_train(config, num_train) -> None:
    t = config.train
    _num(
        "train.max_device_batch",
        t.max_device_batch,
        low=0,
        integer=True,
        fix="0 means no accumulation",
    )
    _num("train.max_epochs", t.max_epochs, low=0)
    _num("train.max_steps", t.max_steps, low=0, integer=True)
    if t.max_steps <= 0 and t.max_epochs <= 0:
        raise UsageError(
            "no training budget: set --config.train.max_epochs > 0 or --config.train.max_steps > 0"
        )
    _num("train.min_steps", t.min_steps, low=0, integer=True)
    if t.max_steps and t.min_steps > t.max_steps:
        raise UsageError(
            f"train.min_steps={t.min_steps} is above the budget train.max_steps={t.max_steps}; "
            f"lower min_steps or raise max_steps"
        )
    _num("train.steps_per_loop", t.steps_per_loop, low=1, integer=True)
    _num(
        "train.eval_every_examples",
        t.eval_every_examples,
        low=0,
        integer=True,
        fix="0 means once an epoch",
    )
    _num("train.eval_batch", t.eval_batch, low=1, integer=True)
    _num("train.eval_train_limit", t.eval_train_limit, low=0, integer=True)
    _choice("train.target_metric", t.target_metric, TARGET_METRICS)
    _target_value("train.target_value", t.target_metric, t.target_value)
    for i, spec in enumerate(t.extra_targets or []):
        parse_target(f"train.extra_targets[{i}]", spec)
    _choice("train.target_bn", t.target_bn, defaults.TARGET_BN_MODES)
    _num("train.target_bn_examples", t.target_bn_examples, low=1, integer=True)
    _num("train.target_bn_batch", t.target_bn_batch, low=1, integer=True)
    subset = min(t.target_bn_examples, num_train)
    if t.target_bn == "recompute" and t.target_bn_batch > subset:
        raise UsageError(
            f"train.target_bn_batch={t.target_bn_batch} is larger than the subset its statistics "
            f"come from ({subset} examples: train.target_bn_examples and the training set); "
            f"use at most {subset} (--config.train.target_bn_batch=...)"
        )
    ghost = config.model.ghost_batch_size
    if t.target_bn == "recompute" and config.model.norm == "ghost" and t.target_bn_batch % ghost:
        raise UsageError(
            f"train.target_bn_batch={t.target_bn_batch} is not a multiple of "
            f"model.ghost_batch_size={ghost}, as ghost batch norm in training mode needs; use a "
            f"multiple of {ghost} (--config.train.target_bn_batch=...)"
        )
    _num("train.seed", t.seed, low=0, integer=True)
    _num(
        "train.checkpoint_every_steps",
        t.checkpoint_every_steps,
        low=0,
        integer=True,
        fix="0 means ten checkpoints per run",
    )
    _num("train.diverge_loss", t.diverge_loss, low=0, low_open=True)
    _num("train.gradient_every_examples", t.gradient_every_examples, low=0, integer=True)
    _num("train.probe_size", t.probe_size, low=0, integer=True)
    _num("train.probe_chunk", t.probe_chunk, low=1, integer=True)
    _num("train.noise_scale_ema", t.noise_scale_ema, low=0, high=1, high_open=True)


def _check_runtime(config) -> None:
    rt = config.runtime
    _choice("runtime.strategy", rt.strategy, STRATEGIES)
    _choice("runtime.mixed_precision", rt.mixed_precision, PRECISIONS)
    jit = rt.jit_compile
    if not (
        isinstance(jit, bool)
        or str(jit).lower() in ("auto", "true", "false", "1", "0", "yes", "no")
    ):
        raise UsageError(
            f"runtime.jit_compile={jit!r} is not valid; use auto, True or False "
            f"(--config.runtime.jit_compile=...)"
        )
    devices = list(rt.devices or [])
    if devices and rt.strategy != "cpu":
        raise UsageError(
            "runtime.devices lists CPU devices for the cpu strategy only; add "
            "--config.runtime.strategy=cpu or drop runtime.devices"
        )


def _check_sweep(config, num_train, classes, shape) -> None:
    s = config.sweep
    f = s.family
    _choice("sweep.family.kind", f.kind, families.KINDS)
    for b in _ints("sweep.batch_sizes", s.batch_sizes):  # not empty: see is_sweep
        _check_batch("sweep.batch_sizes", b, config, num_train)
    lrs = list(s.lr_multipliers or [])
    if not lrs:
        raise UsageError(
            "sweep.lr_multipliers is empty; list at least one in the config file, e.g. [1.0]"
        )
    for lr in lrs:
        _num(
            "sweep.lr_multipliers",
            lr,
            low=0,
            low_open=True,
            listed=True,
            fix="a multiplier of 0 or below makes the learning rate 0 or negative",
        )
    seeds = _ints("sweep.seeds", s.seeds, low=0)
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"sweep.seeds={seeds} repeats a seed; list each seed once")
    _ints("sweep.confirm_seeds", s.confirm_seeds, low=0, nonempty=False)
    _num("sweep.eps", s.eps, low=0, low_open=True)
    _num("sweep.max_lr_extensions", s.max_lr_extensions, low=0, integer=True)
    if f.kind == "budget":
        _num("sweep.family.budget", f.budget, low=0, low_open=True)
    arch = config.model.arch
    try:
        families.from_config(
            arch, f, num_classes=classes, input_shape=shape, norm=config.model.norm
        )
    except (ValueError, TypeError) as e:
        raise UsageError(f"sweep.family (kind={f.kind!r}, arch={arch!r}): {e}") from None


def _check_data_present(config, tfds_name) -> None:
    """A TFDS set that is not prepared, found without importing TensorFlow (local folders only)."""
    d = config.data
    if tfds_name is None or d.download:
        return
    data_dir = (
        d.data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
    )
    if "://" in data_dir:
        return
    if glob.glob(os.path.join(data_dir, tfds_name, "*", "dataset_info.json")):
        return
    raise RuntimeProblem(
        f"TFDS data set {d.name!r} is not prepared in data_dir={data_dir}; point "
        f"--config.data.data_dir at a prepared copy, prepare it on a machine with network "
        f'(python -c "import '
        f"tensorflow_datasets as tfds; tfds.builder({tfds_name!r}, data_dir={data_dir!r})"
        f'.download_and_prepare()", or --config.data.download=True), or use the offline '
        f"--config.data.name=mnist_embedded (or digits_embedded)"
    )


def _check_hardware(config) -> None:
    """Hardware that a strategy asks for and that is plainly absent (no TensorFlow needed to see
    it)."""
    rt = config.runtime
    name = rt.strategy
    if name == "tpu" and not hardware.tpu_reachable(rt.tpu):
        raise RuntimeProblem(
            "runtime.strategy=tpu but this machine is not a TPU VM (no /dev/accel0 or /dev/vfio/0) "
            "and no TPU is named; run on a TPU VM, name one with --config.runtime.tpu=NAME, or use "
            "--config.runtime.strategy=auto"
        )
    if name == "gpu" and not hardware.gpu_visible():
        raise RuntimeProblem(
            "runtime.strategy=gpu but this machine shows no GPU (no /dev/nvidia*, or "
            "CUDA_VISIBLE_DEVICES hides them); run on a GPU machine with the [gpu] extra, or use "
            "--config.runtime.strategy=cpu (or auto)"
        )
    if name == "multi_worker":
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            raise RuntimeProblem(
                "runtime.strategy=multi_worker needs TF_CONFIG (cluster and task) in the "
                "environment; set it on every worker, or use --config.runtime.strategy=auto"
            )
        try:
            json.loads(tf_config)
        except json.JSONDecodeError as e:
            raise RuntimeProblem(
                f"TF_CONFIG is not valid JSON ({e}); fix the environment variable"
            ) from None


def _check_theory(config) -> None:
    t = config.get("theory")
    if t is None:
        raise UsageError(
            "config.kind='theory' needs a config.theory section; start from configs/theory.py"
        )
    for key in ("input_dim", "budget", "fixed_width", "n_samples"):
        if key in t:
            _num(f"theory.{key}", t[key], low=1, integer=True)
    if "n_inits" in t:
        _num(
            "theory.n_inits",
            t.n_inits,
            low=2,
            integer=True,
            fix="the intervals need two draws or more",
        )
    for key in ("widths", "depths"):
        if key in t:
            _ints(f"theory.{key}", t[key], low=1)
    if "label_noise" in t:
        _num("theory.label_noise", t.label_noise, low=0)
    for kind in t.get("kinds", []):
        _choice("theory.kinds", kind, ("linear", "relu"))


# The sections of a training config and the defaults.py function that makes each: every field
# of these exists in every config, so the code reads `config.section.field` with no fallback.
SECTIONS = {
    "model": defaults.model_config,
    "data": defaults.data_config,
    "optim": defaults.optim_config,
    "train": defaults.train_config,
    "runtime": defaults.runtime_config,
    "sweep": defaults.sweep_config,
}


def _check_fields(config) -> None:
    """Each section has exactly the fields that defaults.py gives it (`sweep` may be None: one
    run), so that a config file written by hand fails here, not as an AttributeError mid-run."""
    fix = "build the config from wide_tf.spec.defaults.base_config(), which sets every field"
    for section, make in SECTIONS.items():
        have = config.get(section)
        if have is None and section == "sweep":
            continue
        if have is None:
            raise UsageError(f"the config has no {section} section; {fix}")
        _same_fields(section, have, make(), fix)


def _same_fields(where: str, have, want, fix: str) -> None:
    for k in want:
        if k not in have:
            raise UsageError(f"{where}.{k} is missing from the config; {fix}")
    for k in have:
        if k not in want:
            raise UsageError(
                f"{where}.{k} is not a config field{suggest(k, list(want))}; remove or rename it "
                f"in the config file"
            )
        if hasattr(want[k], "keys") and hasattr(have[k], "keys"):  # sweep.family
            _same_fields(f"{where}.{k}", have[k], want[k], fix)


def check_config(config, overrides=()) -> None:
    """Raises a Problem for the first thing in `config` (and the overrides that made it) that
    cannot work; returns None when the config is fit to run."""
    check_overrides(config, overrides)
    kind = config.get("kind", "study")
    _choice("kind", kind, KINDS)
    if kind == "theory":
        _check_theory(config)
        return
    _check_fields(config)
    num_train, classes, shape, tfds_name = _dataset(config)
    _num("data.num_train", config.data.num_train, low=0, integer=True, fix="0 means all")
    _num("data.shuffle_buffer", config.data.shuffle_buffer, low=1, integer=True)
    _check_model(config, classes, shape)
    _check_optim(config)
    _check_train(config, num_train)
    _check_runtime(config)
    if is_sweep(config):
        _check_sweep(config, num_train, classes, shape)
    else:
        _check_batch("train.global_batch", config.train.global_batch, config, num_train)
    if _TARGET_REPLICAS is None:  # this machine is the one that runs it
        _check_hardware(config)
        _check_data_present(config, tfds_name)


def design_warnings(config) -> list[str]:
    """What a study can run but a reader should doubt (warnings, not errors)."""
    if config.get("kind", "study") != "study" or not is_sweep(config):
        return []
    num_train = _dataset(config)[0]
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


def check_shard(text) -> None:
    if not text:
        return
    try:
        i, n = (int(v) for v in str(text).split("/"))
    except ValueError:
        raise UsageError(
            f"--shard={text!r} is not of the form i/n; e.g. --shard=0/2 and --shard=1/2"
        ) from None
    if not 0 <= i < n:
        raise UsageError(f"--shard={text!r}: need 0 <= i < n, e.g. --shard=0/{max(n, 2)}")


def parse_workers(text) -> int | None:
    """--workers as a count, or None when it was left out (the machine's default)."""
    if text is None or str(text).strip() == "":
        return None
    fix = "give a whole number of processes, e.g. --workers=2, or leave it out for one per core"
    try:
        n = int(str(text).strip())
    except ValueError:
        raise UsageError(f"--workers={text!r} is not a whole number; {fix}") from None
    if n < 1:
        raise UsageError(f"--workers={n} is less than 1; {fix}")
    return n


def check_workers(text, config=None, trial=None, workdir=None) -> None:
    """--workers=N with N > 1 needs a study, one trial at a time per process, a strategy that one
    process per core or GPU can use, and a workdir on which claims are atomic."""
    n = parse_workers(text)
    if n is None or n == 1:
        return
    if trial is not None:
        raise UsageError(f"--trial runs one trial in this process; drop --workers={n} or --trial")
    if config is not None and not is_sweep(config):
        raise UsageError(
            f"--workers={n} needs a study (a config with a sweep); a single run or the theory "
            "check runs in one process: drop --workers"
        )
    if config is not None and config.runtime.strategy in ("tpu", "multi_worker"):
        raise UsageError(
            f"--workers={n} with runtime.strategy={config.runtime.strategy}: one process drives "
            "those devices; drop --workers (or use --workers=1)"
        )
    if workdir:
        from wide_tf.store import claims  # pure Python; google-cloud-storage only for gs://

        try:
            claims.check_store(workdir)
        except claims.ClaimError as e:
            raise UsageError(str(e)) from None


# ------------------------------------------------------------------------------------------------
# The workdir


def study_part(d: dict) -> dict:
    """The part of a config (as JSON) that defines the study's results (as study._study_part)."""
    d = json.loads(json.dumps(d))
    for section, keys in OPERATIONAL.items():
        if keys is None:
            d.pop(section, None)
        elif isinstance(d.get(section), dict):
            d[section] = {k: v for k, v in d[section].items() if k not in keys}
    return d


def _diff_keys(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


def _writable(path: str) -> None:
    """Raises RuntimeProblem unless a file can be created in `path` or its nearest existing
    folder."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise UsageError(
            f"cannot create --workdir={path}: {probe} is a file, not a folder; choose "
            f"another --workdir"
        )
    try:
        fd, name = tempfile.mkstemp(prefix=".wide_tf_write_test-", dir=probe)
        os.close(fd)
        os.remove(name)
    except OSError as e:
        raise RuntimeProblem(
            f"cannot write in {probe} ({e.strerror or e}); choose a --workdir you can write to, "
            f"or fix the folder's permissions"
        ) from None


def _check_run_kind(config, workdir: str) -> None:
    """Refuses a study in a single run's workdir, and a single run in a study's."""
    is_study = is_sweep(config)
    has_study = os.path.exists(os.path.join(workdir, "config.json")) or os.path.isdir(
        os.path.join(workdir, "trials")
    )
    has_single = os.path.exists(os.path.join(workdir, "result.json")) or os.path.isdir(
        os.path.join(workdir, "checkpoints")
    )
    kind = config.get("kind", "study")
    if kind == "study" and is_study and has_single and not has_study:
        raise UsageError(
            f"--workdir={workdir} holds a single run (result.json or checkpoints/), not a "
            f"study; use a new --workdir for the study"
        )
    if kind == "study" and not is_study and has_study:
        raise UsageError(
            f"--workdir={workdir} holds a study (config.json, trials/); a config without a "
            f"sweep runs in the workdir itself: use a new --workdir"
        )


def _check_same_study(config, workdir: str) -> None:
    """Refuses a study whose results-defining config differs from the one in the workdir."""
    cfg_path = os.path.join(workdir, "config.json")
    if not (is_sweep(config) and os.path.exists(cfg_path)):
        return
    try:
        with open(cfg_path) as f:
            theirs = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeProblem(
            f"{cfg_path} is unreadable ({type(e).__name__}: {e}); restore it, or move it aside "
            f"and run the same command to write it again"
        ) from None
    mine = study_part(json.loads(config.to_json_best_effort()))
    diff = list(_diff_keys(study_part(theirs), mine))
    if diff:
        raise UsageError(
            f"--workdir={workdir} holds a different study (config differs in: "
            f"{', '.join(diff[:6])}{' ...' if len(diff) > 6 else ''}); use a new --workdir, "
            f"or the config that made it"
        )


def _results_warnings(workdir: str) -> list[str]:
    """A warning for each line of results.jsonl that is not a whole result."""
    results = os.path.join(workdir, "results.jsonl")
    if not os.path.exists(results):
        return []
    warnings = []
    with open(results, "rb") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
                ok = isinstance(rec, dict) and "trial_id" in rec
            except ValueError:
                ok = False
            if not ok:
                warnings.append(
                    f"{results} line {i} is not a whole result (corrupted or cut short); it is "
                    f"ignored and its trial is taken from trials/<id>/result.json or run again"
                )
    return warnings


def _check_run_files(workdir: str) -> None:
    """Refuses an unreadable result.json and an empty (truncated) checkpoint file, of the single
    run in the workdir or of any trial."""
    result_files = glob.glob(os.path.join(workdir, "result.json")) + glob.glob(
        os.path.join(workdir, "trials", "*", "result.json")
    )
    for path in result_files:
        try:
            with open(path) as f:
                json.load(f)
        except (OSError, ValueError) as e:
            raise RuntimeProblem(
                f"{path} is not a whole result ({type(e).__name__}); delete it and run the same "
                f"command again: that run resumes from its checkpoint"
            ) from None
    ckpt_files = glob.glob(os.path.join(workdir, "checkpoints", "ckpt-*")) + glob.glob(
        os.path.join(workdir, "trials", "*", "checkpoints", "ckpt-*")
    )
    for path in ckpt_files:
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            folder = os.path.dirname(path)
            raise RuntimeProblem(
                f"checkpoint file {path} is empty (truncated); delete {folder} to run that trial "
                f"from the start, or restore the file"
            )


def check_workdir(config, workdir: str) -> list[str]:
    """Checks a local workdir without changing any of its files; returns warning lines.

    Refuses (UsageError) a workdir that is a file or holds another study or another kind of run;
    RuntimeProblem for a folder that cannot be written, an unreadable config.json or result.json,
    and an empty (truncated) checkpoint file. Unreadable lines of results.jsonl are warnings: the
    study ignores them and runs those trials again."""
    if not workdir or "://" in workdir:
        return []
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise UsageError(f"--workdir={workdir} is a file, not a folder; choose another --workdir")
    _writable(workdir)
    if not os.path.isdir(workdir):
        return []
    _check_run_kind(config, workdir)
    _check_same_study(config, workdir)
    warnings = _results_warnings(workdir)
    _check_run_files(workdir)
    return warnings
