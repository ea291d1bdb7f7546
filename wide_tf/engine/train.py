"""Owns one training run: the host loop, evaluation on a cadence in examples, stop-at-target,
divergence, gradient measurements, checkpoints and resume, TensorBoard summaries and result.json.
Reads no flags."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from wide_tf.config.validate import parse_target
from wide_tf.engine import data as data_lib
from wide_tf.engine import optim as optim_lib
from wide_tf.engine import preemption
from wide_tf.engine.measure import TwoBatchNoiseScale, diversity, per_example
from wide_tf.engine.models import build_model
from wide_tf.engine.steps import BatchPlan, InMemoryEvalSet, Stepper
from wide_tf.engine.strategy import Runtime, setup_runtime
from wide_tf.spec import optimizers as optimizers_spec
from wide_tf.spec import plan as plan_lib
from wide_tf.spec import rules
from wide_tf.spec import targets as targets_lib
from wide_tf.store import workdir as wd

TARGET_METRICS = targets_lib.TARGET_METRICS
# With train.checkpoint_every_steps=0 (ten checkpoints per run), at least this long between two.
DEFAULT_CHECKPOINT_MIN_S = 10.0


class ConfigError(ValueError):
    """A run's config asks for something that cannot be done; the message says what to change."""


_comparison = targets_lib.comparison


def _target_met(metric: str, value: float, evaluation: dict) -> bool:
    return targets_lib.met(metric, value, evaluation[metric])


def extra_targets(config) -> list[tuple[str, float]]:
    """train.extra_targets as (metric, value) pairs, in the config's order."""
    return [
        parse_target(f"train.extra_targets[{i}]", spec)
        for i, spec in enumerate(config.train.extra_targets or [])
    ]


def momentum_ramp_steps(optim_cfg) -> float | None:
    """1 / (1 - momentum): the steps over which heavy-ball momentum builds up to its full effect
    (the weight of past gradients sums to it), for the optimizers that use optim.momentum; None
    for the others. A steps-to-target of this order may be a transient of the optimizer."""
    if not optimizers_spec.uses_momentum(optim_cfg.name) or not optim_cfg.momentum:
        return None
    return 1.0 / (1.0 - float(optim_cfg.momentum))


def interpolated_crossing(prev: dict | None, now: dict, metric: str, target: float) -> float:
    """The step at which `metric` crossed `target`, interpolated linearly between the evaluation
    before (`prev`, where it had not) and `now` (where it first had). Without this, steps-to-target
    is rounded up to the evaluation cadence, which at large batches is a large fraction of S."""
    if prev is None or prev.get(metric) is None or now["step"] <= prev["step"]:
        return float(now["step"])
    v0, v1 = float(prev[metric]), float(now[metric])
    frac = (target - v0) / (v1 - v0) if v1 != v0 else 1.0
    frac = min(max(frac, 0.0), 1.0)
    return float(prev["step"] + frac * (now["step"] - prev["step"]))


def _budget_steps(t, n_train: int, batch: int) -> int:
    return plan_lib.budget_steps(
        max_steps=t.max_steps,
        max_epochs=t.max_epochs,
        min_steps=t.min_steps,
        num_train=n_train,
        batch=batch,
    )


def _check(config, info) -> None:
    """The config checks' cross-field rules (spec.rules), on this run's training set; the batch's
    split over the replicas is checked once they are known (BatchPlan, below)."""
    try:
        rules.check(config, info.num_train, replicas=None)
    except rules.RuleError as e:
        raise ConfigError(str(e)) from None


def _model_policy(model) -> str:
    """The dtype policy of the model's first layer with weights (the logits layer stays float32)."""
    layer = next((candidate for candidate in model.layers if candidate.weights), None)
    return (layer or model).dtype_policy.name


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
        "momentum": o.momentum,
        "weight_decay": o.weight_decay,
        "norm": m.norm,
        # How batch norm is judged at every evaluation (None: the model has no batch norm).
        "target_bn": t.target_bn if m.norm in ("batch", "ghost") else None,
        "target_bn_examples": t.target_bn_examples if t.target_bn == "recompute" else None,
        "target_bn_batch": t.target_bn_batch if t.target_bn == "recompute" else None,
        "momentum_warmup_steps": o.momentum_warmup_steps,
        "ghost_batch_size": m.ghost_batch_size if m.norm == "ghost" else None,
        "data": d.name,
        "augment": d.augment,
        "shuffle_buffer": d.shuffle_buffer,
        "max_device_batch": t.max_device_batch,
        # What "diverged" means, and what the training metric is measured on.
        "diverge_loss": t.diverge_loss,
        "eval_train_limit": t.eval_train_limit,
        # The numbers of the schedule and of LARS that change the run (only those in use).
        "schedule_settings": {
            k: o[k]
            for k in {
                "cosine": ("end_lr_fraction",),
                "polynomial": ("poly_power", "end_lr_fraction"),
                "multistep": ("decay_factor", "decay_epochs"),
            }.get(o.schedule, ())
        },
        "lars": (
            {k: o[f"lars_{k}"] for k in ("eta", "trust_ratio", "epsilon", "clip")}
            if o.name == "lars"
            else None
        ),
        # The gradient statistics: how often, and on how many examples (n of the batch bound).
        "gradient_every_examples": t.gradient_every_examples,
        "probe_size": t.probe_size,
    }


class _GradientProbe:
    """Exact gradient diversity on a fixed probe set, measured every `every` examples.

    Compiled once per model (a tf.function over the probe's fixed chunks) and run through
    `strategy.run` on the devices, where the weights are: the probe set lives in variables there,
    every replica computes the same three sums (per-example squared norms, squared norm of the
    summed gradient, loss), and one packed tensor of three numbers comes back per measurement."""

    def __init__(self, config, model, strategy):
        self.every = config.train.gradient_every_examples
        size = config.train.probe_size
        chunk = config.train.probe_chunk
        x, y = data_lib.load_arrays(config.data, "train", limit=size or None)
        self.n = len(y)
        engine = per_example.PerExampleGradients.for_model(model)
        with strategy.scope():
            chunks = [
                tuple(tf.Variable(a, trainable=False) for a in (xb, yb, w))
                for xb, yb, w, _ in per_example._chunks(
                    np.asarray(x, np.float32), np.asarray(y, np.int32), chunk
                )
            ]

        def replica_sums():
            s1 = loss = 0.0
            summed = None
            for xb, yb, wb in chunks:
                sq, losses, grads = engine._chunk_impl(
                    xb.read_value(), yb.read_value(), wb.read_value()
                )
                s1 += tf.reduce_sum(sq)
                loss += tf.reduce_sum(losses)
                summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
            q = tf.add_n([tf.reduce_sum(tf.square(g)) for g in summed])
            return tf.stack([s1, q, loss])

        @tf.function(autograph=False)
        def sums():
            # Every replica holds the same weights and probe set: their mean is any one's value.
            return strategy.reduce(
                tf.distribute.ReduceOp.MEAN, strategy.run(replica_sums), axis=None
            )

        self._sums = sums

    def due(self, examples_before: int, examples_now: int) -> bool:
        return self.every > 0 and examples_now // self.every > examples_before // self.every

    def __call__(self, model=None) -> dict:
        s1, q, _ = (float(v) for v in self._sums().numpy())
        stats = diversity.stats_from_norms([s1], q, n=self.n)
        return {k: float(stats[k]) for k in ("diversity", "batch_bound", "noise_scale")}


def batch_norm_layers(model) -> list:
    """Every batch-norm layer of `model` (ghost batch norm included), nested ones too."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


class _BatchNormRecompute:
    """Batch-norm statistics recomputed from training data for the evaluations that judge the
    target (train.target_bn='recompute'), so that no moving-average lag enters steps-to-target.

    With momentum 0.9 the moving statistics are an average over the last ~10 steps' batches,
    computed with older weights: judged with them, a model reaches its target some steps after
    its weights could. Here, before an evaluation, the model runs in training mode over a fixed
    subset of the training set (the first train.target_bn_examples examples, in batches of
    train.target_bn_batch, the same for every batch size and learning rate) and each layer's
    moving mean and variance are set to the plain average of its per-batch statistics (for ghost
    batch norm, of its ghost groups' statistics); the evaluation then runs in inference mode as
    usual, and `restore` puts the training run's moving statistics back, so training is unchanged.

    Each batch's statistics are read by tracing the layers with momentum 0 (the layers read
    their momentum as a Python number while tracing; it is set back right after), so a batch's
    update replaces the moving statistics with that batch's statistics, which are summed. Like
    the gradient probe, the subset lives in variables on the devices and every replica runs the
    same batches (so the replicas' copies stay equal; checked on two CPU replicas with batch norm).
    One tf.function, traced once per model (kept with it across a study's learning rates).
    Cost: one training-mode forward pass over the subset per evaluation, plus two host copies of
    the (small) statistics: an evaluation of a WRN local member took 1.7-1.9x as long."""

    def __init__(self, config, model, strategy):
        t = config.train
        self.layers = batch_norm_layers(model)
        self.variables = [v for layer in self.layers for v in layer_stats(layer)]
        x, _ = data_lib.load_arrays(config.data, "train", limit=t.target_bn_examples)
        batch = t.target_bn_batch  # at most len(x) (validate.py)
        self.num_batches = len(x) // batch
        self.examples = self.num_batches * batch
        x = np.asarray(x[: self.examples], np.float32).reshape(
            (self.num_batches, batch) + x.shape[1:]
        )
        with strategy.scope():
            self._x = tf.Variable(x, trainable=False)
        layers, variables, k = self.layers, self.variables, self.num_batches

        def replica_batch_stats(i):
            """One batch in training mode with momentum 0: the moving statistics become the
            batch's (Python numbers read while tracing, set back right after)."""
            momenta = [layer.momentum for layer in layers]
            for layer in layers:
                layer.momentum = 0.0
            try:
                model(self._x[i], training=True)
            finally:
                for layer, m in zip(layers, momenta):
                    layer.momentum = m
            return [v.value + 0.0 for v in variables]  # read after the update (auto deps)

        @tf.function(autograph=False)
        def recompute():
            # The loop runs outside `strategy.run` (as the training loop does): ghost batch norm
            # all-reduces over replicas, which MirroredStrategy refuses inside replica control flow.
            def one(i, sums):
                stats = strategy.run(replica_batch_stats, args=(i,))
                stats = [strategy.reduce(tf.distribute.ReduceOp.MEAN, x, axis=None) for x in stats]
                return i + 1, [total + x for total, x in zip(sums, stats)]

            _, sums = tf.while_loop(
                lambda i, _: i < k, one, [tf.constant(0), [tf.zeros(v.shape) for v in variables]]
            )
            for v, total in zip(variables, sums):
                v.assign(total / k)

        self._recompute = recompute

    def recompute(self) -> list:
        """Sets the statistics from the training subset; returns the training run's, for
        `restore`."""
        saved = [v.numpy() for v in self.variables]
        self._recompute()
        return saved

    def restore(self, saved: list) -> None:
        for v, value in zip(self.variables, saved):
            v.assign(value)


def layer_stats(layer) -> tuple:
    """A batch-norm layer's moving statistics (the variables an inference-mode pass reads)."""
    return (layer.moving_mean, layer.moving_variance)


class MetricsWriter:
    """Where a run's numbers go: `scalars` sends a dict of scalars to TensorBoard (the run's
    train/ or eval/ events; non-finite values are skipped), `history` rewrites metrics.jsonl (one
    line per evaluation, atomically) and `log` writes the log line. Only the chief writes files;
    every worker logs. Adding a logged scalar is one key in a dict passed to `scalars`.

    Events are written by TensorBoard's own event-file writer (a background thread; tf.gfile
    paths, so gs:// works) in the format of tf.summary.scalar (a float32 tensor with the scalars
    plugin's metadata): tf.summary costs ~0.3 ms of eager ops per value, this ~0.01 ms, and a
    run in a study writes a dozen values per host loop."""

    _SCALAR = scalar_metadata.create_summary_metadata(display_name=None, description=None)

    def __init__(self, workdir: str, chief: bool, name: str):
        self.workdir, self.chief, self.name = workdir, chief, name
        # Event files are created on the first scalar, not here: a run that stops before it
        # trains (a damaged checkpoint, say) leaves the workdir exactly as it found it.
        self._writers: dict = {}

    def scalars(self, kind: str, step: int, values: dict) -> None:
        if not self.chief:
            return
        if kind not in self._writers:
            # (Its file name holds the time, host, pid and a counter: a resumed run adds a file.)
            self._writers[kind] = EventFileWriter(wd.join(self.workdir, kind))
        value = [
            summary_pb2.Summary.Value(
                tag=k, tensor=tensor_util.make_tensor_proto(np.float32(v)), metadata=self._SCALAR
            )
            for k, v in values.items()
            if v is not None and math.isfinite(v)
        ]
        if value:
            self._writers[kind].add_event(
                event_pb2.Event(
                    wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=value)
                )
            )

    def history(self, records: list) -> None:
        if self.chief:
            wd.write_text_atomic(
                wd.join(self.workdir, wd.METRICS), "".join(wd.dumps_line(r) + "\n" for r in records)
            )

    def log(self, message: str, *args, warning: bool = False) -> None:
        (logging.warning if warning else logging.info)("[%s] " + message, self.name, *args)

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()


# Settings of config.optim that are numbers in the schedule's variables: runs that differ only in
# these reuse one model, optimizer and traced step (see _build).
_SCHEDULE_NUMBERS = (
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
)


def _build_key(config, runtime, info, plan) -> str:
    """Everything a run's model, optimizer, traced functions and evaluation sets depend on, except
    the numbers held in variables (initial weights, learning-rate schedule, divergence
    threshold)."""
    optim = {k: v for k, v in config.optim.to_dict().items() if k not in _SCHEDULE_NUMBERS}
    optim["decay_boundaries"] = len(config.optim.decay_epochs)
    t = config.train
    return json.dumps(
        {
            "strategy": id(runtime.strategy),
            "policy": runtime.mixed_precision,
            "jit": runtime.jit_compile,
            "model": config.model.to_dict(),
            "optim": optim,
            "plan": dataclasses.astuple(plan),
            "info": [info.num_classes, list(info.input_shape)],
            "data": config.data.to_dict(),
            "eval": [t.eval_batch, t.eval_train_limit],
            "probe": [t.probe_size, t.probe_chunk],
            "target_bn": [t.target_bn, t.target_bn_examples, t.target_bn_batch],
        },
        sort_keys=True,
        default=str,
    )


@dataclasses.dataclass
class _Built:
    """A run's model, optimizer, compiled step, evaluation sets and probe, kept for the next run
    with the same key (the next learning rate or seed of the same member and batch size in a
    study): the traced functions are reused, only variables are reset."""

    key: str
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    stepper: Stepper
    eval_sets: dict
    host_var: tf.Variable  # a run's host-side state, saved as a JSON string in its checkpoints
    checkpoint: tf.train.Checkpoint
    optimizer_init: list  # the optimizer's variables right after build (iterations 0, zero slots)
    init_weights: dict  # seed -> the model's initial weights
    # seed -> {what: value}: the initial model's evaluations and gradient diversity, which every
    # run of this key with that seed shares (same weights, evaluation sets and probe set), so the
    # learning rates of a grid measure them once (see Run.at_init).
    at_init: dict = dataclasses.field(default_factory=dict)
    _probe: _GradientProbe | None = None
    bn_recompute: _BatchNormRecompute | None = None  # train.target_bn='recompute' on a BN model

    def probe(self, config) -> _GradientProbe:
        if self._probe is None:
            self._probe = _GradientProbe(config, self.model, self.stepper.strategy)
        self._probe.every = config.train.gradient_every_examples
        return self._probe


_BUILT: dict[str, _Built] = {}  # at most one entry: the last run's


def clear_cache() -> None:
    """Drops the kept model and functions (and Keras's global state with them)."""
    if _BUILT:
        _BUILT.clear()
        keras.backend.clear_session()


def _new_model(config, info) -> keras.Model:
    m = config.model
    return build_model(
        m.arch,
        m.depth,
        m.width,
        info.num_classes,
        info.input_shape,
        norm=m.norm,
        ghost_batch_size=m.ghost_batch_size,
    )


def _initial_weights(built: _Built, config, info, seed: int) -> list:
    """The weights a fresh model gets with this seed (the same for every batch size and LR)."""
    if seed not in built.init_weights:
        keras.utils.set_random_seed(seed)
        built.init_weights[seed] = [w.numpy() for w in _new_model(config, info).weights]
    return built.init_weights[seed]


def _build(config, runtime, info, plan, steps_per_epoch: float, total_steps: int) -> _Built:
    """A model, optimizer and Stepper for this run: the kept ones, reset, when the key matches
    (no retrace, no rebuild), else new ones (and the old ones are dropped)."""
    t = config.train
    key = _build_key(config, runtime, info, plan)
    built = _BUILT.get(key)
    if built is None:
        clear_cache()  # the previous run's graphs go (a study used to do this after every run)
        keras.utils.set_random_seed(t.seed)  # the same initial weights for every batch size and LR
        runtime.apply_policy()  # again for every build: clear_session() resets the dtype policy
        built = _BUILT[key] = _new_built(
            key, config, runtime, info, plan, steps_per_epoch, total_steps
        )
        return built
    built.model.set_weights(_initial_weights(built, config, info, t.seed))
    for v, value in zip(built.optimizer.variables, built.optimizer_init):
        v.assign(value)
    schedule = optim_lib.build_schedule(
        config.optim, plan.global_batch, steps_per_epoch, total_steps
    )
    built.optimizer._learning_rate.assign_from(schedule)
    built.stepper.reset(t.diverge_loss)
    keras.utils.set_random_seed(t.seed)
    return built


def _new_built(key, config, runtime, info, plan, steps_per_epoch, total_steps) -> _Built:
    t, strategy = config.train, runtime.strategy
    with strategy.scope():
        model = _new_model(config, info)
        optimizer = optim_lib.build_optimizer(
            config.optim,
            plan.global_batch,
            steps_per_epoch,
            total_steps,
            variables=model.trainable_variables,
        )
        # Before the first step (docs/design.md, "TensorFlow / Keras 3 facts").
        optimizer.build(model.trainable_variables)
        stepper = Stepper(
            model,
            optimizer,
            strategy,
            plan,
            jit_compile=runtime.jit_compile,
            diverge_loss=t.diverge_loss,
            diagnostics=optim_lib.optimizer_spec(config.optim.name).diagnostics,
        )
    with tf.device("/cpu:0"):
        host_var = tf.Variable("", trainable=False, dtype=tf.string)
    bn_recompute = None
    if t.target_bn == "recompute" and batch_norm_layers(model):
        bn_recompute = _BatchNormRecompute(config, model, strategy)
    return _Built(
        key=key,
        bn_recompute=bn_recompute,
        host_var=host_var,
        checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer, host_state=host_var),
        model=model,
        optimizer=optimizer,
        stepper=stepper,
        eval_sets={
            "train": _eval_set(config, runtime, info, "train", t.eval_train_limit or None),
            "test": _eval_set(config, runtime, info, "test", None),
        },
        optimizer_init=[v.numpy() for v in optimizer.variables],
        init_weights={t.seed: [w.numpy() for w in model.weights]},
    )


def _eval_set(config, runtime, info, split: str, limit: int | None):
    """An evaluation set: in memory on one replica when it fits, else a distributed dataset."""
    replicas = runtime.num_replicas
    batch = config.train.eval_batch // replicas * replicas or replicas
    n = min(limit or info.num_train, info.num_train) if split == "train" else info.num_test
    if replicas == 1 and InMemoryEvalSet.fits(n * int(np.prod(info.input_shape))):
        x, y = data_lib.load_arrays(config.data, split, limit=limit)
        return InMemoryEvalSet(x, y, batch)
    return data_lib.make_eval_dataset(config.data, split, batch, runtime.strategy, limit=limit)


@dataclasses.dataclass
class RunState:
    """Everything a run carries from one host loop to the next, and into its checkpoints (as a
    JSON string beside the model and optimizer), besides the weights and optimizer state."""

    step: int = 0
    # The primary target's: None while running; then 'reached', 'not_reached' or 'diverged' (a
    # run that diverges after it reached the primary target, while it trains on towards the extra
    # targets, stays 'reached': that crossing is as valid as in a run without extra targets).
    status: str | None = None
    steps_to_target: int | None = None
    steps_to_target_interp: float | None = (
        None  # the crossing between the two evaluations around it
    )
    # One entry per train.extra_targets entry: None until it is first met, then
    # [step, interpolated step]. Saved in checkpoints, so a resumed run keeps earlier crossings.
    extra_crossings: list = dataclasses.field(default_factory=list)
    diverged_at: int | None = None  # the step at which the run diverged
    best_test_accuracy: float | None = None
    history: list = dataclasses.field(default_factory=list)  # one dict per evaluation
    gradient: list = dataclasses.field(default_factory=list)  # one dict per probe measurement
    noise: dict | None = None  # the two-batch noise-scale estimator's state
    train_time_s: float = 0.0
    wall_time_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str, step: int) -> RunState:
        """From a checkpoint's JSON; `step` (the optimizer's) where the checkpoint predates the
        field. Unknown keys (from older versions) are ignored."""
        d = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        d.setdefault("step", step)
        if d.get("status") == "diverged" and d.get("diverged_at") is None:
            d["diverged_at"] = d["step"]  # a checkpoint from before the field
        return cls(**{k: v for k, v in d.items() if k in names})


class Run:
    """One training run: `restore`, then `train_until` the next evaluation, `evaluate`, `measure`
    the gradient, `save`, and finally `result`; `run` is the loop that ties them together.

    Set-up (data sizes, the batch plan, the budget and evaluation steps, the model, optimizer and
    compiled step, kept from the last run when they can be: see `_build`) happens here, in
    __init__."""

    def __init__(self, config, workdir: str, runtime: Runtime, trial: dict | None = None):
        self.config, self.workdir, self.runtime, self.trial = config, workdir, runtime, trial or {}
        t, strategy = config.train, runtime.strategy
        self.info = info = data_lib.dataset_info(config.data)
        _check(config, info)
        self.plan = plan = BatchPlan.make(t.global_batch, runtime.num_replicas, t.max_device_batch)
        ghost = config.model.ghost_batch_size
        if config.model.norm == "ghost" and plan.micro_batch % ghost:
            # Also a batch smaller than the ghost size: the virtual batch is never shrunk, since
            # its statistics would then depend on the number of replicas (and micro-batches).
            raise ConfigError(
                f"ghost batch norm needs each per-replica (micro-)batch to be a multiple of "
                f"model.ghost_batch_size={ghost}, but it is {plan.micro_batch} (global batch "
                f"{plan.global_batch} over {plan.num_replicas} replica(s) x "
                f"{plan.num_micro_batches} micro-batch(es)); lower model.ghost_batch_size (to a "
                f"divisor of {plan.micro_batch}) "
                f"or raise the batch"
            )
        self.batch = batch = plan.global_batch
        self.steps_per_epoch = info.num_train / batch
        self.total_steps = _budget_steps(t, info.num_train, batch)
        self.eval_every = t.eval_every_examples or info.num_train
        self.eval_steps = set(plan_lib.eval_steps(batch, self.eval_every, self.total_steps))
        self.name = self.trial.get("trial_id", "run")
        self.extra_targets = extra_targets(config)

        self.built = built = _build(
            config, runtime, info, plan, self.steps_per_epoch, self.total_steps
        )
        self.model, self.optimizer, self.stepper = built.model, built.optimizer, built.stepper
        # Multi-worker: every worker restores from, and saves with, the chief's checkpoints (a
        # save may run collectives), but only the chief writes into the workdir; the others save
        # into a scratch folder that they delete, and write no summaries, metrics or result.
        self.chief = strategy.extended.should_checkpoint
        self.scratch = (
            None if self.chief else wd.join(workdir, f".worker{strategy.cluster_resolver.task_id}")
        )
        self.checkpoint_dir = wd.join(workdir, wd.CHECKPOINTS)
        built.host_var.assign("")
        self.manager = tf.train.CheckpointManager(
            built.checkpoint,
            self.checkpoint_dir if self.chief else wd.join(self.scratch, wd.CHECKPOINTS),
            max_to_keep=2,
        )
        self.metrics = MetricsWriter(workdir, self.chief, self.name)
        want_probe = t.gradient_every_examples or t.gradient_at_init
        self.probe = built.probe(config) if want_probe else None
        self.state = RunState()
        self.noise = None
        self.train_iter = None
        self._clock = time.time()

    # ---- the pieces ------------------------------------------------------------------------------

    def restore(self) -> None:
        """Continues from the chief's last checkpoint, if any; opens the data stream at the step."""
        latest = tf.train.latest_checkpoint(self.checkpoint_dir)
        if latest:
            self.built.checkpoint.restore(latest).assert_existing_objects_matched()
            # A diverged run's optimizer may have run past the step it diverged at (see
            # Stepper): the state's step is the one that counts.
            self.state = RunState.from_json(
                self.built.host_var.numpy().decode(), int(self.optimizer.iterations.numpy())
            )
            self.metrics.log("resumed from %s at step %d", latest, self.state.step)
        t = self.config.train
        n_extra = len(self.extra_targets)
        crossings = list(self.state.extra_crossings)[:n_extra]
        self.state.extra_crossings = crossings + [None] * (n_extra - len(crossings))
        self.noise = TwoBatchNoiseScale(decay=t.noise_scale_ema)
        if self.state.noise:
            self.noise = TwoBatchNoiseScale.from_dict(self.state.noise)
        # Always the distributed iterator, even on one CPU device: a plain one is cheaper to
        # create (~0.15 s less per run) but its steps were 1.5-4x slower here (no prefetch ahead).
        self.train_iter = iter(
            data_lib.make_train_dataset(
                self.config.data,
                self.batch,
                self.runtime.strategy,
                t.seed,
                start_step=self.state.step,
            )
        )

    def train_until(self, target_step: int) -> dict:
        """One host call of at most train.steps_per_loop steps towards `target_step`; returns the
        loop's training scalars (also sent to TensorBoard). One device-to-host read."""
        st, plan = self.state, self.plan
        n = min(self.config.train.steps_per_loop, target_step - st.step)
        t0 = time.time()
        scalars = self.stepper.train(self.train_iter, n)
        dt = time.time() - t0
        st.step += int(scalars["steps"])  # all n, or up to the first diverged step
        st.train_time_s += dt
        examples = max(scalars["examples"], 1.0)
        out = {
            "batch_loss": scalars["loss_sum"] / examples,
            "batch_accuracy": scalars["correct"] / examples,
            "grad_norm": math.sqrt(scalars["grad_norm_sq"]),
            "param_norm": math.sqrt(scalars["param_norm_sq"]),
            "update_norm": math.sqrt(scalars["update_norm_sq"]),
            "learning_rate": scalars["learning_rate"],  # of the next step
            "examples_per_s": scalars["examples"] / dt if dt > 0 else 0.0,
        }
        if self.stepper.diagnostics is not None:  # the optimizer's own, e.g. LARS trust ratios
            out.update({k: scalars[k] for k in self.stepper.diagnostics.names})
        if plan.num_replicas * plan.num_micro_batches > 1 and math.isfinite(scalars["big_grad_sq"]):
            # Averages over the loop's steps: G2 and S are linear in the two squared norms.
            done = max(scalars["steps"], 1.0)
            self.noise.update(
                scalars["small_grad_sq"] / done,
                scalars["big_grad_sq"] / done,
                plan.micro_batch,
                self.batch,
            )
            st.noise = self.noise.to_dict()
            if self.noise.value is not None:
                out["noise_scale_two_batch"] = float(self.noise.value)
        self.metrics.scalars("train", st.step, out)
        if scalars["diverged"]:
            st.diverged_at = st.step
            if st.steps_to_target is None:
                st.status = "diverged"
            self.metrics.log(
                "diverged at step %d (loss %.4g): recorded as a result, not an error",
                st.step,
                out["batch_loss"],
                warning=True,
            )
        return out

    def evaluate(self, train_scalars: dict | None = None, check_target: bool = True) -> dict:
        """Training and test accuracy and loss at the current step, into the history; with
        `check_target`, whether the target is met (the first time: the run has reached it)."""
        st = self.state
        sets = self.built.eval_sets
        both = self.at_init("eval", lambda: self.evaluate_sets(sets))
        tr, te = both["train"], both["test"]
        ev = {
            "step": st.step,
            "epoch": st.step * self.batch / self.info.num_train,
            "examples": st.step * self.batch,
            "train_accuracy": tr["accuracy"],
            "train_loss": tr["loss"],
            "test_accuracy": te["accuracy"],
            "test_loss": te["loss"],
        }
        if train_scalars:
            ev.update(train_scalars)
        self.metrics.scalars(
            "eval",
            st.step,
            {k: ev[k] for k in ("train_accuracy", "train_loss", "test_accuracy", "test_loss")},
        )
        best = st.best_test_accuracy
        st.best_test_accuracy = te["accuracy"] if best is None else max(best, te["accuracy"])
        st.history.append(ev)
        if check_target:
            self.check_targets(ev)
        return ev

    def check_targets(self, ev: dict) -> None:
        """Records the first crossing of the primary target and of every extra target at this
        evaluation (the last one in the history), each interpolated like the primary."""
        st, t = self.state, self.config.train
        prev = st.history[-2] if len(st.history) >= 2 else None

        def log(metric, value):
            if st.step > 0:
                self.metrics.log(
                    "target %s %s %s reached at step %d (%.3g epochs)",
                    metric,
                    _comparison(metric),
                    value,
                    st.step,
                    st.step / self.steps_per_epoch,
                )

        if st.steps_to_target is None and _target_met(t.target_metric, t.target_value, ev):
            st.steps_to_target, st.status = st.step, "reached"
            st.steps_to_target_interp = interpolated_crossing(
                prev, ev, t.target_metric, t.target_value
            )
            log(t.target_metric, t.target_value)
        for i, (metric, value) in enumerate(self.extra_targets):
            if st.extra_crossings[i] is None and _target_met(metric, value, ev):
                st.extra_crossings[i] = [st.step, interpolated_crossing(prev, ev, metric, value)]
                log(metric, value)

    def all_targets_reached(self) -> bool:
        st = self.state
        return st.steps_to_target is not None and all(c is not None for c in st.extra_crossings)

    def evaluate_sets(self, sets: dict) -> dict:
        """The training and evaluation sets' loss and accuracy, with the batch-norm statistics
        that train.target_bn asks for (the training run's own are left as they were)."""
        recompute = self.built.bn_recompute
        saved = recompute.recompute() if recompute is not None else None
        try:
            return {k: self.stepper.evaluate(sets[k]) for k in ("train", "test")}
        finally:
            if saved is not None:
                recompute.restore(saved)

    def at_init(self, what: str, compute) -> dict:
        """`compute()`, a dict of numbers of the model at the current step; at step 0 (the initial
        weights of this seed) computed once per seed and key, and copied for the other runs."""
        if self.state.step != 0:
            return compute()
        cache = self.built.at_init.setdefault(self.config.train.seed, {})
        if what not in cache:
            cache[what] = compute()
        return dict(cache[what])

    def measure(self) -> None:
        """Exact gradient diversity on the probe set at the current step."""
        st = self.state
        g = self.at_init("gradient", lambda: self.probe(self.model))
        g.update(step=st.step, examples=st.step * self.batch)
        st.gradient.append(g)
        self.metrics.scalars(
            "eval",
            st.step,
            {
                "gradient/diversity": g["diversity"],
                "gradient/batch_bound": g["batch_bound"],
                "gradient/noise_scale_exact": g["noise_scale"],
            },
        )
        self.metrics.log(
            "step %d: gradient diversity %.4g, batch bound %.4g (probe of %d examples)",
            st.step,
            g["diversity"],
            g["batch_bound"],
            self.probe.n,
        )

    def save(self) -> None:
        """A checkpoint (model, optimizer, state) and metrics.jsonl."""
        now = time.time()
        self.state.wall_time_s += now - self._clock
        self._clock = now
        self.built.host_var.assign(self.state.to_json())
        self.manager.save(checkpoint_number=self.state.step)
        self.metrics.history(self.state.history)
        self.metrics.flush()  # the events up to this checkpoint, with it

    def running(self) -> bool:
        st = self.state
        stop_at_target = self.config.train.stop_at_target
        return (
            st.step < self.total_steps
            and st.diverged_at is None
            # With extra targets, the run stops once every target is reached.
            and not (stop_at_target and self.all_targets_reached())
        )

    # ---- the run ---------------------------------------------------------------------------------

    def run(self) -> dict:
        t = self.config.train
        self.restore()
        st = self.state
        self.log_start()
        self._clock = time.time()
        if st.step == 0 and not st.history:
            self.evaluate()
            if self.probe is not None:
                self.measure()
        ckpt_every = t.checkpoint_every_steps or max(1, self.total_steps // 10)
        # The default cadence (ten per run) also waits DEFAULT_CHECKPOINT_MIN_S between saves: a
        # run of a few seconds needs no checkpoint every 0.1 s (each cost ~25 ms here). Resume is
        # exact from any checkpoint, so this only changes how much work a kill can lose.
        ckpt_min_s = 0.0 if t.checkpoint_every_steps else DEFAULT_CHECKPOINT_MIN_S
        last_ckpt, last_ckpt_time = st.step, time.time()
        while self.running():
            examples_before = st.step * self.batch
            scalars = self.train_until(min(s for s in self.eval_steps if s > st.step))
            if st.diverged_at is not None:
                break
            if self.probe is not None and self.probe.due(examples_before, st.step * self.batch):
                self.measure()
            if st.step in self.eval_steps:
                ev = self.evaluate(scalars)
                self.log_progress(scalars, ev)
            if st.step - last_ckpt >= ckpt_every and time.time() - last_ckpt_time >= ckpt_min_s:
                self.save()
                last_ckpt, last_ckpt_time = st.step, time.time()
            if preemption.requested():  # SIGTERM: checkpoint now and stop (wide_tf/preemption.py)
                if last_ckpt != st.step:
                    self.save()
                raise preemption.Preempted(self.name, st.step)
        if st.status is None:
            st.status = "reached" if st.steps_to_target is not None else "not_reached"
        if st.diverged_at is None and (not st.history or st.history[-1]["step"] != st.step):
            self.evaluate(
                check_target=False
            )  # the final numbers; the target counts on the cadence only
        self.save()
        self.metrics.close()
        return self.result()

    def log_start(self) -> None:
        plan = self.plan
        self.metrics.log(
            "%s, %d params, batch %d (%d replica(s) x %d micro-batch(es) of %d), "
            "peak lr %.4g, %d steps (%.3g epochs) budget, eval every %d examples",
            self.model.name,
            self.params,
            self.batch,
            plan.num_replicas,
            plan.num_micro_batches,
            plan.micro_batch,
            self.peak_lr,
            self.total_steps,
            self.total_steps / self.steps_per_epoch,
            self.eval_every,
        )

    def log_progress(self, scalars: dict, ev: dict) -> None:
        st = self.state
        self.metrics.log(
            "step %d/%d  epoch %.2f  loss %.4f  acc %.4f | train acc %.4f  test acc %.4f | "
            "lr %.4g  %.0f ex/s",
            st.step,
            self.total_steps,
            st.step / self.steps_per_epoch,
            scalars["batch_loss"],
            scalars["batch_accuracy"],
            ev["train_accuracy"],
            ev["test_accuracy"],
            scalars["learning_rate"],
            scalars["examples_per_s"],
        )

    @property
    def params(self) -> int:
        return int(sum(np.prod(v.shape) for v in self.model.trainable_variables))

    @property
    def peak_lr(self) -> float:
        return float(optim_lib.peak_learning_rate(self.config.optim, self.batch))

    def targets_result(self) -> list[dict]:
        """result.json's "targets": the primary target, then train.extra_targets in order."""
        st, t = self.state, self.config.train

        def entry(metric, value, crossing):
            if crossing is None:
                status = "diverged" if st.diverged_at is not None else "not_reached"
                step = interp = None
            else:
                status, (step, interp) = "reached", crossing
                step, interp = int(step), float(step if interp is None else interp)
            return {
                "metric": metric,
                "value": float(value),
                "status": status,
                "steps_to_target": step,
                "steps_to_target_interp": interp,
                "epochs_to_target": None
                if step is None
                else step * self.batch / self.info.num_train,
            }

        primary = (
            None if st.steps_to_target is None else (st.steps_to_target, st.steps_to_target_interp)
        )
        return [entry(t.target_metric, t.target_value, primary)] + [
            entry(m, v, c) for (m, v), c in zip(self.extra_targets, st.extra_crossings)
        ]

    def result(self) -> dict:
        """result.json (written by the chief; the other workers delete their scratch folder)."""
        config, t, st, batch, n_train = (
            self.config,
            self.config.train,
            self.state,
            self.batch,
            self.info.num_train,
        )
        s_target = st.steps_to_target if st.status == "reached" else None
        last = st.history[-1]
        result = dict(self.trial)
        result.update(
            {
                "trial_id": self.name,
                "arch": config.model.arch,
                "depth": config.model.depth,
                "width": config.model.width,
                "params": self.params,
                "batch_size": batch,
                "lr_multiplier": config.optim.lr_multiplier,
                "learning_rate": self.peak_lr,
                "optimizer": config.optim.name,
                "seed": t.seed,
                "num_train": n_train,
                "status": st.status,
                "target": {"metric": t.target_metric, "value": t.target_value},
                "steps_to_target": s_target,
                # The crossing interpolated between the two evaluations around it (the analysis uses
                # it).
                "steps_to_target_interp": None
                if s_target is None
                else (
                    st.steps_to_target_interp
                    if st.steps_to_target_interp is not None
                    else float(s_target)
                ),
                "epochs_to_target": None if s_target is None else s_target * batch / n_train,
                "examples_to_target": None if s_target is None else s_target * batch,
                # Every target, the primary first (its numbers are the ones above).
                "targets": self.targets_result(),
                # How finely the evaluation cadence resolved the primary crossing: the evaluations
                # after the initial one up to and including the one that first met the target.
                "evaluations_to_target": None
                if s_target is None
                else sum(1 for ev in st.history if 0 < ev["step"] <= s_target),
                # 1 / (1 - momentum), to set steps-to-target against momentum's build-up.
                "momentum_ramp_steps": momentum_ramp_steps(config.optim),
                "diverged_at_step": st.diverged_at,
                "steps": st.step,
                "epochs": st.step * batch / n_train,
                "final": {
                    k: last.get(k)
                    for k in ("train_accuracy", "train_loss", "test_accuracy", "test_loss")
                },
                "best_test_accuracy": st.best_test_accuracy,
                "wall_time_s": st.wall_time_s,
                "examples_per_s": st.step * batch / st.train_time_s if st.train_time_s else None,
                "gradient": {
                    "history": st.gradient,
                    "noise_scale_ema": None
                    if self.noise.value is None
                    else float(self.noise.value),
                },
                "runtime": self.runtime.describe(),
                # The policy the model was really built with (not only the one asked for).
                "dtype_policy": _model_policy(self.model),
                "protocol": describe_protocol(config),
            }
        )
        result.setdefault(
            "member", f"{config.model.arch}-d{config.model.depth}-w{config.model.width}"
        )
        if st.diverged_at is not None:
            result["final"] = {k: None for k in result["final"]}  # no meaningful model to evaluate
        if self.chief:
            wd.write_json(wd.join(self.workdir, wd.RESULT), result)
        elif tf.io.gfile.exists(self.scratch):
            tf.io.gfile.rmtree(self.scratch)
        self.metrics.log(
            "%s: steps to target %s, epochs to target %s, final train acc %s, test acc %s",
            st.status,
            result["steps_to_target"],
            None if result["epochs_to_target"] is None else round(result["epochs_to_target"], 3),
            *(
                None if v is None else round(v, 4)
                for v in (result["final"]["train_accuracy"], result["final"]["test_accuracy"])
            ),
        )
        return result


def train_and_evaluate(
    config, workdir: str, runtime: Runtime | None = None, trial: dict | None = None
) -> dict:
    """Trains one model as `config` says, in `workdir`; resumes from its last checkpoint; returns
    (and writes) result.json. A finished run is not repeated."""
    result_path = wd.join(workdir, wd.RESULT)
    if tf.io.gfile.exists(result_path):
        logging.info("Run in %s already finished; reading its result.", workdir)
        return wd.read_json(result_path)
    tf.io.gfile.makedirs(workdir)
    return Run(config, workdir, runtime or setup_runtime(config.runtime), trial).run()
