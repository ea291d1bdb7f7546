"""Owns the reuse of a compiled step across runs: the model, optimizer, traced functions,
evaluation sets, probe and batch-norm recompute of the last run (one process-global entry), kept
for the next run whose traced program is the same (the next learning rate or seed of a study's
group), with only their variables reset; kept too for the same member at another batch, with a
new Stepper (the one part whose shapes depend on the batch; an MLP on one CPU replica keeps its
Stepper and stream, the batch a variable of their traces); and the keys that say when."""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np
import tensorflow as tf

from wide_tf.engine import arrays, schedules, seeding
from wide_tf.engine import optim as optim_lib
from wide_tf.engine.compile_key import config_key
from wide_tf.engine.models.norm import batch_norm_layers
from wide_tf.engine.tf import data as data_lib
from wide_tf.engine.tf import fused as fused_lib
from wide_tf.engine.tf import stream as stream_lib
from wide_tf.engine.tf.bn_stats import BatchNormRecompute
from wide_tf.engine.tf.probe import GradientProbe
from wide_tf.engine.tf.snapshot import Snapshot
from wide_tf.engine.tf.step import DeviceEvalSet, Stepper
from wide_tf.schema import datasets


def build_key(config, runtime, info, plan, member_only: bool = False) -> str:
    """Everything a run's model, optimizer, traced functions and evaluation sets depend on: the
    config's part (engine/compile_key.config_key: the whole config but KEY_EXCLUDED), with the
    runtime's strategy (the object: each has its own devices and graphs), dtype policy and XLA
    setting, the batch plan and the data's shapes. `member_only`: without the batch
    (train.global_batch, the plan), what the model, optimizer, evaluation sets, probe and
    snapshot depend on; only the Stepper depends on the batch."""
    key = config_key(config, member_only)
    key["engine"] = {
        "strategy": id(runtime.strategy),
        "policy": runtime.mixed_precision,
        "jit": runtime.jit_compile,
        "plan": dataclasses.astuple(plan),
        "info": [info.num_classes, list(info.input_shape)],
    }
    if member_only:
        del key["engine"]["plan"]
    return json.dumps(key, sort_keys=True, default=str)


@dataclasses.dataclass
class Built:
    """A run's model, optimizer, compiled step, evaluation sets and probe, kept for the next run
    with the same key (the next learning rate or seed of the same member and batch size in a
    study): the traced functions are reused, only variables are reset."""

    key: str
    member_key: str  # build_key(member_only=True): the same member at any batch size
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
    # learning rates of a grid measure them once (see engine/host_scalars.at_init).
    at_init: dict = dataclasses.field(default_factory=dict)
    snapshot: Snapshot | None = None  # the evaluation economy's (engine/evaluation.py)
    _probe: GradientProbe | None = None
    bn_recompute: BatchNormRecompute | None = None  # train.target_bn='recompute' on a BN model
    _stream: stream_lib.InMemoryTrainStream | None = None  # this batch's; a new batch drops it

    def train_stream(self, config, runtime, info, batch: int, start_step: int):
        """The run's training stream at `start_step` (what the traced loop calls get_next on):
        the kept in-memory stream on one CPU replica, else a new distributed iterator (its
        prefetch overlaps the host's input work with the devices'). Not a plain tf.data iterator
        on one CPU: cheaper to open than the distributed one, but its steps were 1.5-4x slower
        here (no prefetch ahead); the in-memory stream is both cheap and fast."""
        d = config.data
        if runtime.num_replicas == 1 and runtime.platform == "cpu" and batch <= info.num_train:
            if self._stream is None:
                open_batch = self.stepper.open_batch is not None
                self._stream = stream_lib.InMemoryTrainStream(d, batch, open_batch)
            elif self._stream.batch != batch:  # an open stream, kept for this member's batches
                self._stream.rebatch(batch)
            return self._stream.start(config.train.seed, start_step)
        dataset = data_lib.make_train_dataset(
            d, batch, runtime.strategy, config.train.seed, start_step=start_step
        )
        return iter(dataset)

    def probe(self, config) -> GradientProbe:
        if self._probe is None:
            self._probe = GradientProbe(config, self.model, self.stepper.strategy)
        self._probe.every = config.train.gradient_every_examples
        return self._probe


_BUILT: dict[str, Built] = {}  # at most one entry: the last run's


def clear_cache() -> None:
    """Drops the kept model and functions (and Keras's global state with them)."""
    if _BUILT:
        _BUILT.clear()
        # With Keras's gc.collect(): the old runs' tf.data iterators are freed here, between
        # runs. Left to the automatic collector, one was freed in the middle of tracing the next
        # step, and its destructor (which waits for the iterator's threads) hung the process.
        keras.backend.clear_session()


def _initial_weights(built: Built, config, info, seed: int, new_model) -> list:
    """The weights a fresh model gets with this seed (the same for every batch size and LR)."""
    if seed not in built.init_weights:
        seeding.seed_host(seed)
        built.init_weights[seed] = [w.numpy() for w in new_model(config, info).weights]
    return built.init_weights[seed]


def build(
    config, runtime, info, plan, steps_per_epoch: float, total_steps: int, new_model
) -> Built:
    """A model, optimizer and Stepper for this run: the kept ones, reset, when the key matches
    (no retrace, no rebuild), else new ones (and the old ones are dropped). `new_model(config,
    info)` makes a fresh model (the trainer's: engine.train.new_model)."""
    t = config.train
    key = build_key(config, runtime, info, plan)
    built = _BUILT.get(key)
    if built is None:
        built = _for_new_batch(config, runtime, info, plan, key)
    if built is None:
        clear_cache()  # the previous run's graphs go (a study used to do this after every run)
        keras.utils.set_random_seed(t.seed)  # the same initial weights for every batch size and LR
        runtime.apply_policy()  # again for every build: clear_session() resets the dtype policy
        built = _BUILT[key] = _new_built(
            key, config, runtime, info, plan, steps_per_epoch, total_steps, new_model
        )
        return built
    built.model.set_weights(_initial_weights(built, config, info, t.seed, new_model))
    for v, value in zip(built.optimizer.variables, built.optimizer_init):
        v.assign(value)
    schedule = schedules.build_schedule(
        config.optim, plan.global_batch, steps_per_epoch, total_steps
    )
    built.optimizer._learning_rate.assign_from(schedule)
    built.stepper.reset(t.diverge_loss)
    # Not keras.utils.set_random_seed: TensorFlow's seed would clear the kernels of every kept
    # function (engine/seeding.py), the cost this reuse exists to avoid.
    seeding.seed_host(t.seed)
    return built


def _for_new_batch(config, runtime, info, plan, key) -> Built | None:
    """The kept build of the same member at another batch size, with a new Stepper for this
    batch (the step's shapes), or the kept open-batch Stepper serving it: its model, optimizer,
    evaluation sets, probe, snapshot and initial measurements are the batch's too, so their
    traced functions are kept (a study's groups of one member follow each other); None when no
    such build is kept."""
    member = build_key(config, runtime, info, plan, member_only=True)
    kept = next(iter(_BUILT.values()), None)
    if kept is None or kept.member_key != member:
        return None
    if kept.stepper.open_batch is not None and _open_batch(config, runtime, plan):
        _rebatch(kept.stepper, plan)
    else:
        with runtime.strategy.scope():
            kept.stepper = _stepper(config, runtime, kept.model, kept.optimizer, plan)
        kept._stream = None  # the stream's batch is this one's
    kept.key = key
    _BUILT.clear()
    _BUILT[key] = kept
    return kept


def _rebatch(stepper: Stepper, plan) -> None:
    """An open-batch Stepper (step.Stepper's `open_batch`) serving `plan`'s batch from now on,
    its traces kept: the global batch a variable of them (the loss's divisor, the examples a step
    counts), and the in-memory stream's too (`Built.train_stream` rebatches it). One trace per
    member instead of one per (member, batch), about a second of tracing each on a CPU."""
    stepper.plan = plan
    stepper.open_batch.assign(float(plan.global_batch))


def _open_batch(config, runtime, plan) -> bool:
    """Whether one Stepper serves every batch size of the member (step.Stepper's open_batch):
    an MLP on one CPU replica reading the in-memory stream, no micro-batches, neither XLA nor the
    fused loop, the shapes the batch would otherwise fix. MLPs only: their records are the same
    with the batch open as with it fixed (every record of the local study's shards, a Fashion-MNIST
    MLP's), while a WRN-22 on 7x7 Fashion-MNIST took other steps to its target (169 against 157
    at batch 128): the convolutions' graph, rewritten by TensorFlow's optimiser with the batch
    unknown, is not the same arithmetic."""
    return (
        config.model.arch == "mlp"
        and runtime.num_replicas == 1
        and runtime.platform == "cpu"
        and not runtime.jit_compile
        and not fused_lib.applies(config, runtime)
        and plan.num_micro_batches == 1
    )


def _stepper(config, runtime, model, optimizer, plan) -> Stepper:
    return Stepper(
        model,
        optimizer,
        runtime.strategy,
        plan,
        jit_compile=runtime.jit_compile,
        diverge_loss=config.train.diverge_loss,
        diagnostics=optim_lib.optimizer_spec(config.optim.name).diagnostics,
        input_spec=datasets.of(config.data),
        fused=fused_lib.applies(config, runtime),
        open_batch=_open_batch(config, runtime, plan),
    )


def _new_built(key, config, runtime, info, plan, steps_per_epoch, total_steps, new_model) -> Built:
    t, strategy = config.train, runtime.strategy
    with strategy.scope():
        model = new_model(config, info)
        optimizer = optim_lib.build_optimizer(
            config.optim,
            plan.global_batch,
            steps_per_epoch,
            total_steps,
            variables=model.trainable_variables,
        )
        # Before the first step (docs/design.md, "TensorFlow / Keras 3 facts").
        optimizer.build(model.trainable_variables)
        stepper = _stepper(config, runtime, model, optimizer, plan)
    with tf.device("/cpu:0"):
        host_var = tf.Variable("", trainable=False, dtype=tf.string)
    snapshot = Snapshot(model, strategy)
    bn_recompute = None
    if t.target_bn == "recompute" and batch_norm_layers(model):
        bn_recompute = BatchNormRecompute(config, model, strategy)
    return Built(
        key=key,
        member_key=build_key(config, runtime, info, plan, member_only=True),
        bn_recompute=bn_recompute,
        host_var=host_var,
        # The snapshot too: a resumed run may interpolate its next crossing against it.
        checkpoint=tf.train.Checkpoint(
            model=model, optimizer=optimizer, host_state=host_var, eval_snapshot=snapshot.saved
        ),
        snapshot=snapshot,
        model=model,
        optimizer=optimizer,
        stepper=stepper,
        eval_sets={
            "train": _eval_set(config, runtime, model, info, "train", t.eval_train_limit or None),
            "test": _eval_set(config, runtime, model, info, "test", None),
        },
        optimizer_init=[v.numpy() for v in optimizer.variables],
        init_weights={t.seed: [w.numpy() for w in model.weights]},
    )


def _eval_set(config, runtime, model, info, split: str, limit: int | None):
    """An evaluation set: held on the devices when its share fits each replica (one replica: the
    normalised float32 values it always evaluated; more: packed images, the bytes the streaming
    pipeline sent), else a distributed dataset. Its compiled pass is kept with the build."""
    replicas, strategy = runtime.num_replicas, runtime.strategy
    batch = config.train.eval_batch // replicas * replicas or replicas
    n = min(limit or info.num_train, info.num_train) if split == "train" else info.num_test
    padded = n + arrays.eval_padding(n, batch)
    spec = datasets.of(config.data)
    # One replica: the bound of before (the float32 copy without its padding), so that no set
    # moves between the held float values and the streamed packed ones.
    if replicas == 1 and DeviceEvalSet.fits(n * int(np.prod(info.input_shape)) * 4, 1):
        x, y = arrays.load_arrays(config.data, split, limit=limit)
        return DeviceEvalSet(
            x, y, batch, strategy, model, spec, xla=fused_lib.applies(config, runtime)
        )
    if replicas > 1 and DeviceEvalSet.fits(padded * data_lib.packed_size(spec), replicas):
        packed = data_lib.packed_eval_arrays(config.data, split, limit)
        if packed is not None:
            return DeviceEvalSet(*packed, batch, strategy, model, spec)
    return data_lib.make_eval_dataset(config.data, split, batch, strategy, limit=limit)
