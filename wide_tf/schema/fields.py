"""Owns the declared schema of every config field: its default, its domain (a number's bounds, a
choice's names, a list's entries) and a one-line doc. defaults.py builds every config from it and
checks/fields_check.py checks every field against it in one loop; the rules that relate several
fields are code, in schema/rules.py."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable

from wide_tf.schema import architectures, datasets, families, lr_schedules, optimizers, targets

# The names every choice field accepts that are not a registry of their own (optimizers, schedules,
# data sets, architectures, family kinds and target metrics are): the config checks and the engine
# read them here, so a new name is added once.
SCALING_RULES = ("none", "linear", "sqrt")  # optim.scaling
TRUST_RATIO_FORMS = ("you", "decayed_grad")  # optim.lars_trust_ratio
WARMUP_FIXED = ("epochs", "steps")  # optim.warmup_fixed
TARGET_BN_MODES = ("moving", "recompute")  # train.target_bn
PROBE_BATCHES = ("smallest", "all")  # sweep.probe_batches
STRATEGIES = ("auto", "tpu", "gpu", "cpu", "multi_worker")  # runtime.strategy
BACKENDS = ("tensorflow", "jax")  # runtime.backend: Keras's backend
PRECISIONS = ("auto", "float32", "mixed_bfloat16")  # runtime.mixed_precision
# runtime.jit_compile, any case
JIT_COMPILE = ("auto", "fused", "true", "false", "1", "0", "yes", "no")
KINDS = ("study", "theory")  # config.kind
THEORY_KINDS = ("linear", "relu")  # theory.kinds


def suggest(word, names) -> str:
    """' (did you mean 'x'?)' for the closest of `names`, or ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in names], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclasses.dataclass(frozen=True)
class Num:
    """A finite number within bounds (an integer if `integer`); `fix` adds a hint to the error."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    fix: str = ""

    def fits(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and int(value) != value:
            return False
        if not math.isfinite(value):
            return False
        low, high = self.low, self.high
        if low is not None and (value < low or (self.low_open and value == low)):
            return False
        return not (high is not None and (value > high or (self.high_open and value == high)))

    def error(self, where: str, value, *, listed: bool = False) -> str | None:
        """The one-line message for `where`=value out of this domain, or None when it fits;
        `listed`: an entry of a list (a tuple: --config.<where>='(a,b)' sets the whole list)."""
        if self.fits(value):
            return None

        def fmt(x):  # an integer bound in full (2147483647, not 2.14748e+09)
            return f"{int(x)}" if self.integer and x == int(x) else f"{x:g}"

        lo = "" if self.low is None else ("> " if self.low_open else ">= ") + fmt(self.low)
        hi = "" if self.high is None else ("< " if self.high_open else "<= ") + fmt(self.high)
        rng = " and ".join(x for x in (lo, hi) if x)
        kind = "an integer" if self.integer else "a finite number"
        return (
            f"{where}={value!r} is out of range: use {kind}{' ' + rng if rng else ''}"
            f"{'; ' + self.fix if self.fix else ''} "
            + (f"(a list: --config.{where}='(a,b,...)')" if listed else f"(--config.{where}=...)")
        )


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `names` (a tuple, or a function returning one for a registry that can grow)."""

    names: tuple | Callable[[], tuple]

    def choices(self) -> tuple:
        return self.names() if callable(self.names) else self.names

    def error(self, where: str, value) -> str | None:
        names = self.choices()
        if value in names:
            return None
        return (
            f"{where}={value!r} is not valid{suggest(value, names)}; choose one of "
            f"{', '.join(map(str, names))} (--config.{where}=...)"
        )


@dataclasses.dataclass(frozen=True)
class NumList:
    """A list whose every entry is `item`; `empty`: the error for an empty list (None: allowed)."""

    item: Num
    empty: str | None = None
    increasing: bool = False
    unique: bool = False


FREE = None  # a flag, a name or a path: any value of the default's type (ConfigDict checks it)
# The domains whose check is code in checks/fields_check.py: a value that depends on another
# field (a target's value on its metric) or a grammar of its own.
TARGET_VALUE, TARGET_LIST, JIT = "target_value", "target_list", "jit_compile"


@dataclasses.dataclass(frozen=True)
class Field:
    path: str  # section.name (sweep.family.name for the family)
    default: object
    domain: object  # Num, Choice, NumList, FREE or one of the named domains above
    doc: str
    field_type: type | None = None  # a None default's type (a FieldReference)
    when: Callable | None = None  # checked only when when(config) is true

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _int(low=0, **kw) -> Num:
    return Num(low=low, integer=True, **kw)


# Upper bounds on every count that could run away (train.min_steps=1e20 never ended,
# train.max_epochs=1e308 overflowed after TensorFlow started, train.seed=1e20 broke the RNG). Each
# lies far past any run this package plans and inside the arithmetic that consumes it.
MAX_STEPS = 10**9  # optimizer steps: a local study's runs take 10^2-10^4, ImageNet-scale ~10^6
MAX_EPOCHS = 10**6  # passes over the data (converted to steps: int64 stays exact)
MAX_EXAMPLES = 10**12  # example counts and cadences: the largest data set here has 1.28e6
MAX_COHORT = 1024  # runs of one cell trained together: a study's cell has at most a few dozen
MAX_BATCH = 2**24  # examples per batch: the largest in the large-batch literature is ~2^16-2^20
MAX_SEED = 2**31 - 1  # keras.utils.set_random_seed passes it to np.random.seed (< 2^32)
MAX_EXTENSIONS = 100  # learning-rate grid extensions, each one more trial per cell
# B_x(1+eps): below MIN_EPS the (1+eps)-fold threshold lies deep inside a run's own seed noise
# on steps-to-target (sigma 0.12 on its log, analysis/stats/generators.py); above MAX_EPS it asks
# for more than the 2^10-fold batch range of any sweep here can show (epochs-to-target grow at
# most as fast as the batch).
MIN_EPS, MAX_EPS = 1e-3, 1e3


def _steps(low=0, **kw) -> Num:
    return _int(low, high=MAX_STEPS, **kw)


def _examples(low=0, **kw) -> Num:
    return _int(low, high=MAX_EXAMPLES, **kw)


def _batch(low=1, **kw) -> Num:
    return _int(low, high=MAX_BATCH, **kw)


def _epochs(**kw) -> Num:
    return Num(low=0, high=MAX_EPOCHS, **kw)


def _empty(where: str) -> str:
    return f"{where} is empty; list at least one value, e.g. --config.{where}='(8,16)'"


def _ghost(config) -> bool:
    return config.model.norm == "ghost"


def _budget_family(config) -> bool:
    return config.sweep.family.kind == "budget"


_POSITIVE = Num(low=0, low_open=True)
_SEED = _int(0, high=MAX_SEED)
_FRACTION = Num(low=0, high=1, high_open=True)
_FIX_LR = (
    "a learning rate of 0 does not train and a negative one ascends the loss; "
    "the study tunes the rate through sweep.lr_multipliers"
)
_FIX_MULT = "a multiplier of 0 or below makes the learning rate 0 or negative"
_F = Field

MODEL = (
    _F("model.arch", "mlp", Choice(architectures.names), "the architecture (a registered name)"),
    # A float: units for an MLP (a whole number), the multiplier k for a WRN (fractional allowed).
    _F("model.depth", 2, FREE, "layers (MLP) or the 6n+4 depth (WRN); checked by the family"),
    _F("model.width", 256.0, FREE, "units (MLP) or the width multiplier k (WRN)"),
    _F("model.norm", "none", Choice(architectures.NORMS), "'none' | 'batch' | 'ghost'"),
    # The virtual batch of ghost batch norm: its statistics do not depend on the batch.
    _F("model.ghost_batch_size", 32, _batch(), "ghost batch norm's virtual batch", when=_ghost),
)
DATA = (
    _F("data.name", "mnist_embedded", Choice(datasets.NAMES), "the data set (schema/datasets.py)"),
    _F("data.data_dir", None, FREE, "TFDS data_dir; None: TFDS_DATA_DIR or ~", field_type=str),
    _F("data.download", False, FREE, "never touch the network unless asked"),
    _F("data.augment", False, FREE, "pad-crop (and flip where label-preserving)"),
    # Fixed: a buffer that grew with the batch would change the data order.
    _F("data.shuffle_buffer", 10_000, _examples(1), "the bounded shuffle's reach, in examples"),
    _F("data.num_train", 0, _examples(fix="0 means all"), "a fixed training subset; 0: the whole"),
    # The subset's permutation seed: the same for every run of a study (never the run's seed).
    _F("data.subset_seed", 20180601, _SEED, "the seed that picks data.num_train's subset"),
    _F("data.pool", 1, Choice(datasets.POOLS), "average pooling of pool x pool blocks (1: none)"),
)
OPTIM = (
    _F("optim.name", "sgd", Choice(optimizers.NAMES), "the optimizer (schema/optimizers.py)"),
    _F("optim.base_lr", 0.1, Num(low=0, low_open=True, fix=_FIX_LR), "the lr at reference_batch"),
    _F("optim.reference_batch", 256, _batch(), "the batch at which base_lr applies"),
    _F("optim.scaling", "sqrt", Choice(SCALING_RULES), "base_lr's rule over batch"),
    _F("optim.lr_multiplier", 1.0, _POSITIVE, "the lr grid's factor on the rule's guess"),
    _F("optim.momentum", 0.9, _FRACTION, "momentum/nesterov/lars: the momentum"),
    # Momentum rises linearly from 0 to optim.momentum over this many steps (0: off), to check
    # that steps-to-target is not momentum's build-up.
    _F("optim.momentum_warmup_steps", 0, _steps(), "steps of momentum's linear warm-up; 0: off"),
    _F("optim.weight_decay", 0.0, Num(low=0), "weight decay (coupled for lars)"),
    _F("optim.lars_eta", 0.001, _POSITIVE, "LARS's trust coefficient"),
    _F("optim.lars_trust_ratio", "you", Choice(TRUST_RATIO_FORMS), "LARS's ratio form"),
    _F("optim.lars_epsilon", 0.0, Num(low=0), "LARS's denominator epsilon"),
    _F("optim.lars_clip", False, FREE, "LARC: clip the local lr at the global one"),
    _F("optim.schedule", "constant", Choice(lr_schedules.NAMES), "the decay after warm-up"),
    _F("optim.warmup_epochs", 0.0, _epochs(), "warm-up length in epochs"),
    _F("optim.warmup_steps", 0, _steps(), "warm-up length in steps"),
    _F("optim.warmup_fixed", "epochs", Choice(WARMUP_FIXED), "which warm-up is fixed"),
    _F(
        "optim.decay_epochs",
        (),
        NumList(_epochs(low_open=True), increasing=True),
        "multistep's epochs",
    ),
    _F("optim.decay_factor", 0.1, Num(low=0, high=1, low_open=True), "multistep's factor"),
    _F("optim.poly_power", 2.0, _POSITIVE, "polynomial decay's power"),
    _F("optim.end_lr_fraction", 0.0, Num(low=0, high=1), "the final lr over the peak"),
)
TRAIN = (
    _F("train.global_batch", 128, FREE, "the batch (a sweep sets it); checked by schema/rules.py"),
    _F(
        "train.max_device_batch",
        0,
        _batch(0, fix="0 means no accumulation"),
        ">0: accumulate micro-batches of at most this many per replica",
    ),
    _F("train.max_epochs", 50.0, _epochs(), "the budget in epochs"),
    _F("train.max_steps", 0, _steps(), "the budget in steps; 0: max_epochs"),
    # A floor of the budget in steps: large batches are not censored by max_epochs alone.
    _F("train.min_steps", 0, _steps(), "a floor of the budget in steps"),
    _F("train.steps_per_loop", 100, _steps(1), "optimizer steps per tf.function call"),
    _F(
        "train.eval_every_examples",
        0,
        _examples(fix="0 means once an epoch"),
        "0: once per epoch; the same points of training for every batch",
    ),
    _F("train.eval_batch", 1024, _batch(), "the evaluation batch"),
    _F(
        "train.eval_train_limit", 0, _examples(), "0: training accuracy over the whole training set"
    ),
    # The evaluation economy (engine/evaluation.py): a pass over the training set stops once no
    # unreached target can be met at this step, and the test set is evaluated only for the
    # curves; steps-to-target and every target's record stay exactly as with every pass whole.
    _F("train.eval_economy", True, FREE, "skip the passes that cannot be a crossing (exact)"),
    _F(
        "train.curve_every_examples",
        0,
        _examples(fix="0 means every 10 evaluations"),
        "whole train and test evaluations for the curves; a multiple of eval_every_examples",
    ),
    _F("train.target_metric", "train_accuracy", Choice(targets.TARGET_METRICS), "the target"),
    _F("train.target_value", 0.99, TARGET_VALUE, "an accuracy in (0, 1], a loss above 0"),
    # Stop once the primary target and every extra target is met (or at the budget).
    _F("train.stop_at_target", True, FREE, "stop once every target is met"),
    # More targets judged on the same evaluations, each "metric:value" with a metric of
    # target_metric's choices, e.g. ["train_loss:0.1", "test_accuracy:0.9"].
    _F("train.extra_targets", (), TARGET_LIST, 'more targets, each "metric:value"'),
    # The batch-norm statistics of the evaluations (every one, so also those that judge the
    # targets): 'moving' (the training run's moving averages, which lag the weights by
    # ~1/(1 - 0.9) steps) or 'recompute' (recomputed before each evaluation from the first
    # target_bn_examples training examples in batches of target_bn_batch; the training run's
    # moving averages are put back after it).
    _F("train.target_bn", "moving", Choice(TARGET_BN_MODES), "the evaluations' BN stats"),
    _F("train.target_bn_examples", 1024, _examples(1), "recompute: the subset of the statistics"),
    _F("train.target_bn_batch", 256, _batch(), "recompute: the batch of the statistics"),
    _F("train.seed", 0, _SEED, "the run's seed (a sweep sets it)"),
    _F(
        "train.checkpoint_every_steps",
        0,
        _steps(fix="0 means ten checkpoints per run"),
        "0: ten checkpoints per run",
    ),
    _F("train.diverge_loss", 1e3, _POSITIVE, "a loss above this (or non-finite) ends the run"),
    _F("train.gradient_every_examples", 0, _examples(), "the gradient probe's cadence; 0: off"),
    _F("train.gradient_at_init", False, FREE, "also probe the gradients at initialisation"),
    # Examples of the gradient probe; 0: the whole training set (the batch bound n x diversity
    # saturates near the probe size n, so a small probe caps it).
    _F("train.probe_size", 0, _examples(), "the gradient probe's examples; 0: the training set"),
    _F("train.probe_chunk", 256, _batch(), "the gradient probe's chunk"),
    _F("train.noise_scale_ema", 0.95, _FRACTION, "the noise scale's moving-average decay"),
)
RUNTIME = (
    # Keras's backend, fixed per process before Keras is imported (engine/backend.py); part of the
    # study's identity (schema/identity.py).
    _F("runtime.backend", "tensorflow", Choice(BACKENDS), "tensorflow | jax"),
    _F("runtime.strategy", "auto", Choice(STRATEGIES), "auto | tpu | gpu | cpu | ..."),
    _F("runtime.tpu", "", FREE, "TPU name or 'local'; empty: auto-detect a TPU VM"),
    # cpu strategy only: e.g. ['/cpu:0', '/cpu:1'] to rehearse multi-replica runs.
    _F("runtime.devices", (), FREE, "the cpu strategy's devices"),
    _F(
        "runtime.jit_compile",
        "auto",
        JIT,
        "auto: XLA on TPU and GPU; fused: an MLP's CPU host call in one XLA program",
    ),
    _F(
        "runtime.mixed_precision",
        "auto",
        Choice(PRECISIONS),
        "auto: bfloat16 on TPU, float32 elsewhere",
    ),
    # A study's runs of one (member, batch) cell that are ready together, trained as one compiled
    # program with a leading run axis (engine/cohort.py, engine/jax/cohort.py; JAX only).
    _F(
        "runtime.cohort",
        1,
        _int(1, high=MAX_COHORT),
        "the most runs of one cell trained together (jax); 1: one at a time",
    ),
)
SWEEP = (
    # 'budget' (depths at a fixed budget), 'width' (fixed depth), 'depth' (fixed width)
    _F("sweep.family.kind", "budget", Choice(families.KINDS), "the family's kind"),
    _F("sweep.family.budget", 0.0, _POSITIVE, "the parameter budget", when=_budget_family),
    _F("sweep.family.depths", (), FREE, "the depths (checked by the family)"),
    _F("sweep.family.widths", (), FREE, "the widths (checked by the family)"),
    _F("sweep.family.depth", 0, FREE, "kind='width': the fixed depth"),
    _F("sweep.family.width", 0.0, FREE, "kind='depth': the fixed width"),
    _F("sweep.family.tolerance", 0.05, FREE, "the budget's relative tolerance"),
    _F(
        "sweep.batch_sizes",
        (),
        NumList(_batch(), empty=_empty("sweep.batch_sizes"), unique=True),
        "the batches",
    ),
    _F(
        "sweep.lr_multipliers",
        (1.0,),
        NumList(
            Num(low=0, low_open=True, fix=_FIX_MULT),
            empty=(
                "sweep.lr_multipliers is empty; list at least one, e.g. "
                "--config.sweep.lr_multipliers='(1.0,)'"
            ),
        ),
        "log grid around the scaling rule's guess, per batch size",
    ),
    _F("sweep.extend_lr_grid", True, FREE, "add one grid point past an edge that won"),
    _F("sweep.max_lr_extensions", 2, _int(0, high=MAX_EXTENSIONS), "at most this many extensions"),
    _F(
        "sweep.seeds",
        (0,),
        NumList(_SEED, empty=_empty("sweep.seeds"), unique=True),
        "tuning seeds: every learning rate of the grid runs on each",
    ),
    _F("sweep.confirm_seeds", (), NumList(_SEED), "the chosen rate is re-run on these seeds"),
    # B_x(1+eps), the model-free critical batch: epochs-to-target (1 + eps)-fold over the two
    # smallest batches' (1.0: doubled, McCandlish's B_crit; Zhang et al. use 0.2).
    _F("sweep.eps", 1.0, Num(low=MIN_EPS, high=MAX_EPS), "B_x(1+eps)'s eps"),
    # Which runs measure the gradient probe along training (train.gradient_every_examples): the
    # report reads it only at each member's smallest batch (the noise-scale prediction).
    _F(
        "sweep.probe_batches",
        "smallest",
        Choice(PROBE_BATCHES),
        "smallest: the probe along training only at the smallest batch; all: in every run",
    ),
)
SECTIONS = {
    "model": MODEL,
    "data": DATA,
    "optim": OPTIM,
    "train": TRAIN,
    "runtime": RUNTIME,
    "sweep": SWEEP,
}
FIELDS = {f.path: f for section in SECTIONS.values() for f in section}


def field(path: str) -> Field:
    return FIELDS[path]
