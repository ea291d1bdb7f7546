"""Owns one training run: the host loop, evaluation on a cadence in examples, stop-at-target,
divergence, gradient measurements, checkpoints and resume, TensorBoard summaries and result.json.
Reads no flags."""

from __future__ import annotations

import dataclasses
import json
import math
import time

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from wide_tf import data as data_lib
from wide_tf import optim as optim_lib
from wide_tf import workdir as wd
from wide_tf.models import build_model
from wide_tf.steps import BatchPlan, InMemoryEvalSet, Stepper
from wide_tf.strategy import Runtime, setup_runtime

TARGET_METRICS = ("train_accuracy", "train_loss", "test_accuracy")
# With train.checkpoint_every_steps=0 (ten checkpoints per run), at least this long between two.
DEFAULT_CHECKPOINT_MIN_S = 10.0


class ConfigError(ValueError):
    """A run's config asks for something that cannot be done; the message says what to change."""


def _target_met(metric: str, value: float, evaluation: dict) -> bool:
    got = evaluation[metric]
    return got <= value if metric.endswith("loss") else got >= value


def _eval_steps(batch: int, every_examples: int, total_steps: int) -> set[int]:
    """Steps at which the run evaluates: the first step at or past every multiple of
    `every_examples` examples, so every batch size is checked at the same points of training."""
    steps = {total_steps}
    k = 1
    while True:
        s = math.ceil(k * every_examples / batch)
        if s >= total_steps:
            return steps
        steps.add(s)
        k += 1


def _budget_steps(t, n_train: int, batch: int) -> int:
    """The run's budget in steps: train.max_steps if set, else max_epochs' worth of steps but at
    least train.min_steps (a floor, so the largest batches get enough updates)."""
    if t.get("max_steps", 0) > 0:
        return int(t.max_steps)
    return max(math.ceil(t.max_epochs * n_train / batch), int(t.get("min_steps", 0)))


def _check(config, info) -> None:
    t = config.train
    if t.target_metric not in TARGET_METRICS:
        raise ConfigError(f"train.target_metric={t.target_metric!r} is not one of {TARGET_METRICS}")
    if t.global_batch > info.num_train:
        raise ConfigError(
            f"train.global_batch={t.global_batch} is larger than the training set "
            f"({info.num_train} examples); use at most {info.num_train}"
        )
    if t.get("max_steps", 0) <= 0 and t.max_epochs <= 0:
        raise ConfigError("set a budget: train.max_epochs > 0 or train.max_steps > 0")


def _model_policy(model) -> str:
    """The dtype policy of the model's first layer with weights (the logits layer stays float32)."""
    layer = next((l for l in model.layers if l.weights), None)
    return (layer or model).dtype_policy.name


def describe_protocol(config) -> dict:
    """The settings a reader needs to compare runs; copied into every result.json."""
    t, o, m, d = config.train, config.optim, config.model, config.data
    return {
        "target": f"{t.target_metric} {'<=' if t.target_metric.endswith('loss') else '>='} {t.target_value}",
        "eval_every_examples": t.eval_every_examples,
        "max_epochs": t.max_epochs,
        "max_steps": t.get("max_steps", 0),
        "min_steps": t.get("min_steps", 0),
        "optimizer": o.name,
        "schedule": o.schedule,
        "warmup": (
            f"{o.get('warmup_epochs', 0)} epochs"
            if o.get("warmup_fixed", "epochs") == "epochs"
            else f"{o.get('warmup_steps', 0)} steps"
        )
        + f" (fixed in {o.get('warmup_fixed', 'epochs')})",
        "scaling": o.scaling,
        "reference_batch": o.reference_batch,
        "momentum": o.get("momentum", 0.0),
        "weight_decay": o.get("weight_decay", 0.0),
        "norm": m.norm,
        "ghost_batch_size": m.get("ghost_batch_size", 0) if m.norm == "ghost" else None,
        "data": d.name,
        "augment": d.get("augment", False),
        "shuffle_buffer": d.shuffle_buffer,
        "max_device_batch": t.get("max_device_batch", 0),
    }


class _GradientProbe:
    """Exact gradient diversity on a fixed probe set, measured every `every` examples.

    Compiled once per model (a tf.function over the probe's fixed chunks) and run through
    `strategy.run` on the devices, where the weights are: the probe set lives in variables there,
    every replica computes the same three sums (per-example squared norms, squared norm of the
    summed gradient, loss), and one packed tensor of three numbers comes back per measurement."""

    def __init__(self, config, model, strategy):
        from wide_tf.measure import diversity, per_example  # imported only when measuring

        self.stats_from_norms = diversity.stats_from_norms
        self.every = config.train.get("gradient_every_examples", 0)
        size = config.train.get("probe_size", 512)
        chunk = config.train.get("probe_chunk", 256)
        x, y = data_lib.load_arrays(config.data, "train", limit=size)
        self.n = len(y)
        engine = per_example.PerExampleGradients.for_model(model)
        with strategy.scope():
            chunks = [
                tuple(tf.Variable(a, trainable=False) for a in (xb, yb, w))
                for xb, yb, w, _ in per_example._chunks(np.asarray(x, np.float32), np.asarray(y, np.int32), chunk)
            ]

        def replica_sums():
            s1 = loss = 0.0
            summed = None
            for xb, yb, wb in chunks:
                sq, losses, grads = engine._chunk_impl(xb.read_value(), yb.read_value(), wb.read_value())
                s1 += tf.reduce_sum(sq)
                loss += tf.reduce_sum(losses)
                summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
            q = tf.add_n([tf.reduce_sum(tf.square(g)) for g in summed])
            return tf.stack([s1, q, loss])

        @tf.function(autograph=False)
        def sums():
            # Every replica holds the same weights and probe set: their mean is any one's value.
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica_sums), axis=None)

        self._sums = sums

    def due(self, examples_before: int, examples_now: int) -> bool:
        return self.every > 0 and examples_now // self.every > examples_before // self.every

    def __call__(self, model=None) -> dict:
        s1, q, _ = (float(v) for v in self._sums().numpy())
        stats = self.stats_from_norms([s1], q, n=self.n)
        return {k: float(stats[k]) for k in ("diversity", "batch_bound", "noise_scale")}


class MetricsWriter:
    """Where a run's numbers go: `scalars` sends a dict of scalars to TensorBoard (the run's
    train/ or eval/ events; non-finite values are skipped), `history` rewrites metrics.jsonl (one
    line per evaluation, atomically) and `log` writes the log line. Only the chief writes files;
    every worker logs. Adding a logged scalar is one key in a dict passed to `scalars`."""

    def __init__(self, workdir: str, chief: bool, name: str):
        self.workdir, self.chief, self.name = workdir, chief, name
        self._writers = (
            {k: tf.summary.create_file_writer(wd.join(workdir, k)) for k in ("train", "eval")} if chief else {}
        )

    def scalars(self, kind: str, step: int, values: dict) -> None:
        if not self.chief:
            return
        with self._writers[kind].as_default(step=step):
            for k, v in values.items():
                if v is not None and math.isfinite(v):
                    tf.summary.scalar(k, v)

    def history(self, records: list) -> None:
        if self.chief:
            wd.write_text_atomic(wd.join(self.workdir, wd.METRICS), "".join(wd.dumps_line(r) + "\n" for r in records))

    def log(self, message: str, *args, warning: bool = False) -> None:
        (logging.warning if warning else logging.info)("[%s] " + message, self.name, *args)

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()


# Settings of config.optim that are numbers in the schedule's variables: runs that differ only in
# these reuse one model, optimizer and traced step (see _build).
_SCHEDULE_NUMBERS = ("base_lr", "lr_multiplier", "scaling", "reference_batch", "warmup_epochs",
                     "warmup_steps", "warmup_fixed", "decay_epochs", "decay_factor", "poly_power",
                     "end_lr_fraction", "warmup_init_fraction")


def _build_key(config, runtime, info, plan) -> str:
    """Everything a run's model, optimizer, traced functions and evaluation sets depend on, except
    the numbers held in variables (initial weights, learning-rate schedule, divergence threshold)."""
    optim = {k: v for k, v in config.optim.to_dict().items() if k not in _SCHEDULE_NUMBERS}
    optim["decay_boundaries"] = len(config.optim.get("decay_epochs", ()) or ())
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
            "eval": [t.get("eval_batch", 1024), t.get("eval_train_limit", 0)],
            "probe": [t.get("probe_size", 512), t.get("probe_chunk", 256)],
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
    trust_fn: object
    eval_sets: dict
    host_var: tf.Variable  # a run's host-side state, saved as a JSON string in its checkpoints
    checkpoint: tf.train.Checkpoint
    optimizer_init: list  # the optimizer's variables right after build (iterations 0, zero slots)
    init_weights: dict  # seed -> the model's initial weights
    _probe: "_GradientProbe | None" = None

    def probe(self, config) -> "_GradientProbe":
        if self._probe is None:
            self._probe = _GradientProbe(config, self.model, self.stepper.strategy)
        self._probe.every = config.train.get("gradient_every_examples", 0)
        return self._probe


_BUILT: dict[str, _Built] = {}  # at most one entry: the last run's


def clear_cache() -> None:
    """Drops the kept model and functions (and Keras's global state with them)."""
    if _BUILT:
        _BUILT.clear()
        keras.backend.clear_session()


def _initial_weights(built: _Built, config, info, seed: int) -> list:
    """The weights a fresh model gets with this seed (the same for every batch size and LR)."""
    if seed not in built.init_weights:
        keras.utils.set_random_seed(seed)
        m = config.model
        fresh = build_model(m.arch, m.depth, m.width, info.num_classes, info.input_shape, norm=m.norm,
                            ghost_batch_size=m.get("ghost_batch_size", 32))
        built.init_weights[seed] = [w.numpy() for w in fresh.weights]
    return built.init_weights[seed]


def _build(config, runtime, info, plan, steps_per_epoch: float, total_steps: int) -> _Built:
    """A model, optimizer and Stepper for this run: the kept ones, reset, when the key matches
    (no retrace, no rebuild), else new ones (and the old ones are dropped)."""
    t, strategy = config.train, runtime.strategy
    key = _build_key(config, runtime, info, plan)
    built = _BUILT.get(key)
    schedule = optim_lib.build_schedule(config.optim, plan.global_batch, steps_per_epoch, total_steps)
    if built is not None:
        built.model.set_weights(_initial_weights(built, config, info, t.seed))
        for v, value in zip(built.optimizer.variables, built.optimizer_init):
            v.assign(value)
        built.optimizer._learning_rate.assign_from(schedule)
        built.stepper.reset(t.get("diverge_loss", 1e3))
        keras.utils.set_random_seed(t.seed)
        return built
    clear_cache()  # the previous run's graphs go (a study used to do this after every run)
    keras.utils.set_random_seed(t.seed)  # the same initial weights for every batch size and LR
    runtime.apply_policy()  # again for every build: clear_session() resets the dtype policy
    with strategy.scope():
        m = config.model
        model = build_model(
            m.arch,
            m.depth,
            m.width,
            info.num_classes,
            info.input_shape,
            norm=m.norm,
            ghost_batch_size=m.get("ghost_batch_size", 32),
        )
        optimizer = optim_lib.build_optimizer(
            config.optim, plan.global_batch, steps_per_epoch, total_steps, variables=model.trainable_variables
        )
        optimizer.build(model.trainable_variables)  # before the first step (DESIGN.md)
        trust_fn = None
        if isinstance(optimizer, optim_lib.LARS):
            trust_fn = lambda g, v: optim_lib.lars_trust_ratios(optimizer, g, v)  # noqa: E731
        stepper = Stepper(
            model,
            optimizer,
            strategy,
            plan,
            jit_compile=runtime.jit_compile,
            diverge_loss=t.get("diverge_loss", 1e3),
            trust_ratio_fn=trust_fn,
        )
    eval_batch = (
        t.get("eval_batch", 1024) // runtime.num_replicas * runtime.num_replicas or runtime.num_replicas
    )

    def eval_set(split: str, limit: int | None):
        n = min(limit or info.num_train, info.num_train) if split == "train" else info.num_test
        if runtime.num_replicas == 1 and InMemoryEvalSet.fits(n * int(np.prod(info.input_shape))):
            x, y = data_lib.load_arrays(config.data, split, limit=limit)
            return InMemoryEvalSet(x, y, eval_batch)
        return data_lib.make_eval_dataset(config.data, split, eval_batch, strategy, limit=limit)

    with tf.device("/cpu:0"):
        host_var = tf.Variable("", trainable=False, dtype=tf.string)
    built = _Built(
        key=key,
        host_var=host_var,
        checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer, host_state=host_var),
        model=model,
        optimizer=optimizer,
        stepper=stepper,
        trust_fn=trust_fn,
        eval_sets={
            "train": eval_set("train", t.get("eval_train_limit", 0) or None),
            "test": eval_set("test", None),
        },
        optimizer_init=[v.numpy() for v in optimizer.variables],
        init_weights={t.seed: [w.numpy() for w in model.weights]},
    )
    _BUILT[key] = built
    return built


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
    runtime = runtime or setup_runtime(config.runtime)
    strategy = runtime.strategy
    info = data_lib.dataset_info(config.data)
    _check(config, info)
    t = config.train
    plan = BatchPlan.make(t.global_batch, runtime.num_replicas, t.get("max_device_batch", 0))
    ghost = config.model.get("ghost_batch_size", 0)
    if config.model.norm == "ghost" and plan.micro_batch % ghost:
        # Also a batch smaller than the ghost size: the virtual batch is never shrunk, since
        # its statistics would then depend on the number of replicas (and micro-batches).
        raise ConfigError(
            f"ghost batch norm needs each per-replica (micro-)batch to be a multiple of "
            f"model.ghost_batch_size={ghost}, but it is {plan.micro_batch} (global batch "
            f"{plan.global_batch} over {plan.num_replicas} replica(s) x {plan.num_micro_batches} "
            f"micro-batch(es)); lower model.ghost_batch_size (to a divisor of {plan.micro_batch}) "
            f"or raise the batch"
        )
    n_train, batch = info.num_train, plan.global_batch
    steps_per_epoch = n_train / batch
    total_steps = _budget_steps(t, n_train, batch)
    eval_every = t.get("eval_every_examples", 0) or n_train
    eval_steps = _eval_steps(batch, eval_every, total_steps)
    name = (trial or {}).get("trial_id", "run")

    built = _build(config, runtime, info, plan, steps_per_epoch, total_steps)
    model, optimizer, stepper, trust_fn = built.model, built.optimizer, built.stepper, built.trust_fn
    params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    peak_lr = float(optim_lib.peak_learning_rate(config.optim, batch))

    # Host-side state travels in the checkpoint as a JSON string beside the model and optimizer.
    # The Checkpoint object is kept with the model (its saver caches its traced save functions).
    host_var, ckpt = built.host_var, built.checkpoint
    host_var.assign("")
    # Multi-worker: every worker restores from, and saves with, the chief's checkpoints (a save
    # may run collectives), but only the chief writes into the workdir; the others save into a
    # scratch folder that they delete, and write no summaries, metrics or result.
    chief = strategy.extended.should_checkpoint
    scratch = None if chief else wd.join(workdir, f".worker{strategy.cluster_resolver.task_id}")
    chief_dir = wd.join(workdir, wd.CHECKPOINTS)
    manager = tf.train.CheckpointManager(
        ckpt, chief_dir if chief else wd.join(scratch, wd.CHECKPOINTS), max_to_keep=2
    )
    latest = tf.train.latest_checkpoint(chief_dir)
    state = {
        "history": [],
        "steps_to_target": None,
        "best_test_accuracy": None,
        "train_time_s": 0.0,
        "wall_time_s": 0.0,
        "gradient": [],
        "noise": None,
        "status": None,
        "train_log": [],
    }
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
        state = json.loads(host_var.numpy().decode())
        logging.info(
            "[%s] resumed from %s at step %d",
            name,
            latest,
            int(optimizer.iterations.numpy()),
        )
    # A diverged run's optimizer may have run past the step it diverged at (see Stepper): the
    # host state's step is the one that counts.
    step = int(state.get("step", optimizer.iterations.numpy()))

    from wide_tf.measure import TwoBatchNoiseScale

    noise = TwoBatchNoiseScale(decay=t.get("noise_scale_ema", 0.95))
    if state["noise"]:
        noise = TwoBatchNoiseScale.from_dict(state["noise"])
    probe = (
        built.probe(config)
        if t.get("gradient_every_examples", 0) or t.get("gradient_at_init", False)
        else None
    )

    if isinstance(strategy, tf.distribute.OneDeviceStrategy) and runtime.platform == "cpu":
        # One CPU device: the plain iterator of the same per-replica stream (a distributed
        # iterator's multi-device prefetch cost ~0.15 s to create per run, for nothing here).
        train_iter = iter(data_lib.train_input_fn(config.data, batch, t.seed, start_step=step)(None))
    else:
        train_iter = iter(data_lib.make_train_dataset(config.data, batch, strategy, t.seed, start_step=step))
    eval_sets = built.eval_sets
    metrics = MetricsWriter(workdir, chief, name)

    def evaluate(at_step: int, train_scalars: dict | None) -> dict:
        tr = stepper.evaluate(eval_sets["train"])
        te = stepper.evaluate(eval_sets["test"])
        ev = {
            "step": at_step,
            "epoch": at_step * batch / n_train,
            "examples": at_step * batch,
            "train_accuracy": tr["accuracy"],
            "train_loss": tr["loss"],
            "test_accuracy": te["accuracy"],
            "test_loss": te["loss"],
        }
        if train_scalars:
            ev.update(train_scalars)
        metrics.scalars("eval", at_step, {k: ev[k] for k in ("train_accuracy", "train_loss", "test_accuracy", "test_loss")})
        best = state["best_test_accuracy"]
        state["best_test_accuracy"] = te["accuracy"] if best is None else max(best, te["accuracy"])
        state["history"].append(ev)
        return ev

    def measure_gradient(at_step: int) -> None:
        g = probe(model)
        g.update(step=at_step, examples=at_step * batch)
        state["gradient"].append(g)
        metrics.scalars(
            "eval",
            at_step,
            {
                "gradient/diversity": g["diversity"],
                "gradient/batch_bound": g["batch_bound"],
                "gradient/noise_scale_exact": g["noise_scale"],
            },
        )
        metrics.log(
            "step %d: gradient diversity %.4g, batch bound %.4g (probe of %d examples)",
            at_step,
            g["diversity"],
            g["batch_bound"],
            probe.n,
        )

    def save_state():
        host_var.assign(json.dumps(state))
        manager.save(checkpoint_number=step)
        metrics.history(state["history"])

    metrics.log(
        "%s, %d params, batch %d (%d replica(s) x %d micro-batch(es) of %d), "
        "peak lr %.4g, %d steps (%.3g epochs) budget, eval every %d examples",
        model.name,
        params,
        batch,
        plan.num_replicas,
        plan.num_micro_batches,
        plan.micro_batch,
        peak_lr,
        total_steps,
        total_steps / steps_per_epoch,
        eval_every,
    )
    start = time.time()
    if step == 0 and not state["history"]:
        ev = evaluate(0, None)
        if probe is not None:
            measure_gradient(0)
        if _target_met(t.target_metric, t.target_value, ev):
            state["steps_to_target"], state["status"] = 0, "reached"
    ckpt_every = t.get("checkpoint_every_steps", 0) or max(1, total_steps // 10)
    # The default cadence (ten per run) also waits DEFAULT_CHECKPOINT_MIN_S between saves: a run
    # of a few seconds needs no checkpoint every 0.1 s (each cost ~25 ms here). Resume is exact
    # from any checkpoint, so this only changes how much work a kill can lose.
    ckpt_min_s = 0.0 if t.get("checkpoint_every_steps", 0) else DEFAULT_CHECKPOINT_MIN_S
    last_ckpt, last_ckpt_time = step, time.time()
    stop_at_target = t.get("stop_at_target", True)
    while (
        step < total_steps
        and state["status"] not in ("diverged",)
        and not (stop_at_target and state["status"] == "reached")
    ):
        next_eval = min(s for s in eval_steps if s > step)
        n = min(t.get("steps_per_loop", 100), next_eval - step)
        t0 = time.time()
        scalars = stepper.train(train_iter, n)
        dt = time.time() - t0
        examples_before = step * batch
        # One packed read per loop (Stepper.train): the steps that counted (all of them, or up to
        # the first diverged one), the learning rate of the next step and the divergence flag.
        step += int(scalars["steps"])
        state["step"] = step
        done = max(scalars["steps"], 1.0)
        lr = scalars["learning_rate"]
        train_scalars = {
            "batch_loss": scalars["loss_sum"] / max(scalars["examples"], 1.0),
            "batch_accuracy": scalars["correct"] / max(scalars["examples"], 1.0),
            "grad_norm": math.sqrt(scalars["grad_norm_sq"]),
            "param_norm": math.sqrt(scalars["param_norm_sq"]),
            "update_norm": math.sqrt(scalars["update_norm_sq"]),
            "learning_rate": lr,
            "examples_per_s": scalars["examples"] / dt if dt > 0 else 0.0,
        }
        if trust_fn is not None:
            train_scalars.update(
                trust_ratio_min=scalars["trust_min"],
                trust_ratio_mean=scalars["trust_mean"],
                trust_ratio_max=scalars["trust_max"],
            )
        if plan.num_replicas * plan.num_micro_batches > 1 and math.isfinite(scalars["big_grad_sq"]):
            # Averages over the loop's steps: G2 and S are linear in the two squared norms.
            noise.update(
                scalars["small_grad_sq"] / done, scalars["big_grad_sq"] / done, plan.micro_batch, batch
            )
            state["noise"] = noise.to_dict()
            if noise.value is not None:
                train_scalars["noise_scale_two_batch"] = float(noise.value)
        state["train_time_s"] += dt
        metrics.scalars("train", step, train_scalars)
        if scalars["diverged"]:
            state["status"] = "diverged"
            metrics.log(
                "diverged at step %d (loss %.4g): recorded as a result, not an error",
                step,
                train_scalars["batch_loss"],
                warning=True,
            )
            break
        if probe is not None and probe.due(examples_before, step * batch):
            measure_gradient(step)
        if step in eval_steps:
            ev = evaluate(step, train_scalars)
            metrics.log(
                "step %d/%d  epoch %.2f  loss %.4f  acc %.4f | train acc %.4f  test acc %.4f | "
                "lr %.4g  %.0f ex/s",
                step,
                total_steps,
                step / steps_per_epoch,
                train_scalars["batch_loss"],
                train_scalars["batch_accuracy"],
                ev["train_accuracy"],
                ev["test_accuracy"],
                lr,
                train_scalars["examples_per_s"],
            )
            if state["steps_to_target"] is None and _target_met(t.target_metric, t.target_value, ev):
                state["steps_to_target"], state["status"] = step, "reached"
                metrics.log(
                    "target %s reached at step %d (%.3g epochs)",
                    describe_protocol(config)["target"],
                    step,
                    step / steps_per_epoch,
                )
        if step - last_ckpt >= ckpt_every and time.time() - last_ckpt_time >= ckpt_min_s:
            state["wall_time_s"] += time.time() - start
            start = time.time()
            save_state()
            last_ckpt, last_ckpt_time = step, time.time()
    state["wall_time_s"] += time.time() - start
    if state["status"] is None:
        state["status"] = "reached" if state["steps_to_target"] is not None else "not_reached"
    if state["status"] != "diverged" and (not state["history"] or state["history"][-1]["step"] != step):
        evaluate(step, None)
    save_state()
    metrics.flush()

    s_target = state["steps_to_target"] if state["status"] == "reached" else None
    last = state["history"][-1]
    result = dict(trial or {})
    result.update(
        {
            "trial_id": name,
            "arch": config.model.arch,
            "depth": config.model.depth,
            "width": config.model.width,
            "params": params,
            "batch_size": batch,
            "lr_multiplier": config.optim.get("lr_multiplier", 1.0),
            "learning_rate": peak_lr,
            "optimizer": config.optim.name,
            "seed": t.seed,
            "num_train": n_train,
            "status": state["status"],
            "target": {"metric": t.target_metric, "value": t.target_value},
            "steps_to_target": s_target,
            "epochs_to_target": None if s_target is None else s_target * batch / n_train,
            "examples_to_target": None if s_target is None else s_target * batch,
            "steps": step,
            "epochs": step * batch / n_train,
            "final": {k: last.get(k) for k in ("train_accuracy", "train_loss", "test_accuracy", "test_loss")},
            "best_test_accuracy": state["best_test_accuracy"],
            "wall_time_s": state["wall_time_s"],
            "examples_per_s": step * batch / state["train_time_s"] if state["train_time_s"] else None,
            "gradient": {
                "history": state["gradient"],
                "noise_scale_ema": None if noise.value is None else float(noise.value),
            },
            "runtime": runtime.describe(),
            # The policy the model was really built with (not only the one asked for).
            "dtype_policy": _model_policy(model),
            "protocol": describe_protocol(config),
        }
    )
    result.setdefault("member", f"{config.model.arch}-d{config.model.depth}-w{config.model.width}")
    if state["status"] == "diverged":
        result["final"] = {k: None for k in result["final"]}  # no meaningful model to evaluate
    if chief:
        wd.write_json(result_path, result)
    elif tf.io.gfile.exists(scratch):
        tf.io.gfile.rmtree(scratch)
    metrics.log(
        "%s: steps to target %s, epochs to target %s, final train acc %s, test acc %s",
        state["status"],
        result["steps_to_target"],
        None if result["epochs_to_target"] is None else round(result["epochs_to_target"], 3),
        *(
            None if v is None else round(v, 4)
            for v in (result["final"]["train_accuracy"], result["final"]["test_accuracy"])
        ),
    )
    return result
