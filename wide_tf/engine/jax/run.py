"""Owns the JAX backend of one run: its runtime (the local devices), its Trainer (the compiled loop
of engine/jax/step.py over the training set held on the devices), its Evaluator (bounded passes
over the evaluation sets on the devices; the snapshot is a reference, since JAX arrays are never
written in place) and its Checkpointer (NumPy .npz files keyed by variable path, no TensorFlow),
as engine/interface.py declares them. The build (model, optimizer, compiled functions, device
data) is kept for the next run with the same compile key (engine/compile_key.py), as
engine/tf/reuse.py keeps TensorFlow's."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import sys
import types
import zipfile

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wide_tf.engine import arrays, compile_key, preemption, restore, schedules, seeding, timing
from wide_tf.engine import optim as optim_lib
from wide_tf.engine.base import Account, BaseEvaluator, BaseTrainer
from wide_tf.engine.jax import data as jax_data
from wide_tf.engine.jax import step as jax_step
from wide_tf.engine.measure import diversity
from wide_tf.engine.models.norm import batch_norm_layers
from wide_tf.engine.state import BatchPlan, RunPlan, RunState
from wide_tf.schema import datasets
from wide_tf.schema.problems import RuntimeProblem
from wide_tf.store import workdir as wd


def _tensorboard_without_tensorflow() -> None:
    """TensorBoard's event writer (engine/summaries.py) reaches files through
    `tensorboard.compat.tf`, which imports TensorFlow whenever it is installed; the module
    `tensorboard.compat.notf`, when importable, makes it use TensorBoard's own stub instead
    (tensorboard/compat/__init__.py). Set here, for the JAX backend's processes only, and only
    when TensorFlow is not loaded already. The stub's files are local ones (and S3): a gs://
    workdir's event files need TensorFlow installed and a process that imported it."""
    if "tensorflow" not in sys.modules and "tensorboard.compat.notf" not in sys.modules:
        sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")


_tensorboard_without_tensorflow()


@dataclasses.dataclass(frozen=True)
class JaxRuntime:
    """The hardware a JAX run uses: every local device as one data-parallel replica."""

    devices: tuple
    platform: str  # 'cpu' | 'gpu' | 'tpu'
    num_replicas: int
    mixed_precision: str = "float32"
    jit_compile: bool = True  # always: every step is jax.jit
    tf32: bool = False
    chief: bool = True  # the process that writes (jax.process_index() == 0)

    def apply_policy(self) -> None:
        keras.mixed_precision.set_global_policy(self.mixed_precision)

    def describe(self) -> str:
        return (
            f"JAX {jax.__version__} on {self.platform}, {self.num_replicas} replica(s) "
            f"(shard_map data parallel), policy={self.mixed_precision}"
        )


# The environment flag that makes a JAX run one process of several (launch_tpu.sh --backend=jax
# sets it on every worker of a multi-host slice): setup_runtime then calls
# jax.distributed.initialize() before it touches a device, and the run's mesh spans every
# process's devices. JAX's multi-host programming model: every host runs the same program, and
# jax.distributed.initialize() must come before any other JAX call; on Cloud TPU it takes no
# arguments (the coordinator, process count and index come from the TPU metadata)
# (https://docs.jax.dev/en/latest/multi_process.html). Elsewhere (a CPU test, a GPU cluster
# without a scheduler JAX detects) JAX_COORDINATOR_ADDRESS (read by JAX itself), JAX_NUM_PROCESSES
# and JAX_PROCESS_ID (read here) give them.
DISTRIBUTED_ENV = "WIDE_TF_JAX_DISTRIBUTED"


def distributed() -> bool:
    """Whether this process is one of several (WIDE_TF_JAX_DISTRIBUTED=1)."""
    return os.environ.get(DISTRIBUTED_ENV, "") == "1"


def setup_runtime(runtime_cfg) -> JaxRuntime:
    """Every local device (runtime.strategy='cpu': the CPU devices only); the dtype policy as on
    TensorFlow ('auto': mixed_bfloat16 on TPU, float32 elsewhere). Under WIDE_TF_JAX_DISTRIBUTED=1:
    jax.distributed.initialize() first, then every process's devices (jax.devices()) as the
    replicas, and only process 0 writes (chief)."""
    if distributed():
        if not jax.distributed.is_initialized():
            named = (("num_processes", "JAX_NUM_PROCESSES"), ("process_id", "JAX_PROCESS_ID"))
            given = {k: int(os.environ[v]) for k, v in named if os.environ.get(v)}
            jax.distributed.initialize(**given)
        devices = jax.devices("cpu") if runtime_cfg.strategy == "cpu" else jax.devices()
    else:
        devices = jax.local_devices(backend="cpu" if runtime_cfg.strategy == "cpu" else None)
    platform = devices[0].platform
    policy = runtime_cfg.mixed_precision
    if policy == "auto":
        policy = "mixed_bfloat16" if platform == "tpu" else "float32"
    runtime = JaxRuntime(
        tuple(devices), platform, len(devices), policy, chief=jax.process_index() == 0
    )
    runtime.apply_policy()
    return runtime


def _numbers(schedule) -> dict:
    return {k: jnp.asarray(v, jnp.float32) for k, v in schedule.numbers().items()}


class _Build:
    """A kept model, optimizer, stepper and device data: one per compile key (the last run's)."""

    def __init__(self, key, config, runtime, info, batch_plan, plan, new_model):
        self.key = key
        t = config.train
        seeding.seed_host(t.seed)
        self.model = new_model(config, info)
        self.schedule = schedules.build_schedule(
            config.optim, plan.batch, plan.steps_per_epoch, plan.total_steps
        )
        spec = optim_lib.optimizer_spec(config.optim.name)
        # A float learning rate (a variable of the optimizer's): the step writes the schedule's
        # value into it before each update, from numbers that are arguments (step.py).
        self.optimizer = spec.build(config.optim, 0.0, self.model.trainable_variables)
        self.optimizer.build(self.model.trainable_variables)
        self.spec = datasets.of(config.data)
        self.stepper = jax_step.JaxStepper(
            self.model,
            self.optimizer,
            self.schedule,
            batch_plan,
            self.spec,
            runtime.devices,
            augment=config.data.augment,
            diagnostics=spec.diagnostics,
        )
        self.evaluation = jax_step.JaxEvaluation(self.stepper)
        self.recompute = None
        if t.target_bn == "recompute" and batch_norm_layers(self.model):
            x, _ = arrays.train_arrays(config.data)
            batch = int(t.target_bn_batch)
            k = min(int(t.target_bn_examples), len(x)) // batch
            x = arrays.normalize(x[: k * batch], self.spec).reshape((k, batch) + x.shape[1:])
            batches = jax.device_put(x, self.stepper.replicated)
            self.recompute = jax_step.JaxRecompute(self.stepper, batches)
        self.probe = jax_step.JaxProbe(self.stepper)
        self.optimizer_init = [np.asarray(v.value) for v in self.optimizer.variables]
        self.init_weights = {t.seed: [np.asarray(w.value) for w in self.model.weights]}
        self.at_init: dict = {}
        replicated = self.stepper.replicated
        images, labels = arrays.train_arrays(config.data)
        self.train_data = jax.device_put((images, labels), replicated)
        self.eval_sets = {
            "train": _EvalSet(config, "train", t.eval_train_limit or None, runtime, self.stepper),
            "test": _EvalSet(config, "test", None, runtime, self.stepper),
        }
        self._probe = None

    def weights_for(self, seed: int, config, info, new_model) -> list:
        if seed not in self.init_weights:
            seeding.seed_host(seed)
            self.init_weights[seed] = [np.asarray(w.value) for w in new_model(config, info).weights]
        return self.init_weights[seed]

    def probe_chunks(self, config):
        """The probe set (the first train.probe_size training examples, normalised) in padded
        chunks of train.probe_chunk, on the devices; and its size."""
        if self._probe is None:
            x, y = arrays.train_arrays(config.data)
            size = config.train.probe_size or len(y)
            x, y = arrays.normalize(x[:size], self.spec), np.asarray(y[:size], np.int32)
            chunk = int(config.train.probe_chunk)
            chunks = []
            for i in range(0, len(y), chunk):
                xb, yb = x[i : i + chunk], y[i : i + chunk]
                pad = chunk - len(yb)
                w = np.concatenate([np.ones(len(yb), np.float32), np.zeros(pad, np.float32)])
                xb = np.concatenate([xb, np.zeros((pad,) + xb.shape[1:], np.float32)])
                yb = np.concatenate([yb, np.zeros(pad, np.int32)])
                chunks.append(jax.device_put((xb, yb, w), self.stepper.replicated))
            self._probe = (chunks, len(y))
        return self._probe


class _EvalSet:
    """An evaluation split on the devices, padded to whole batches, each batch split over the
    replicas (jax_data.eval_arrays)."""

    def __init__(self, config, split, limit, runtime, stepper):
        replicas = runtime.num_replicas
        batch = config.train.eval_batch // replicas * replicas or replicas
        x, y, w, self.num_examples = jax_data.eval_arrays(config.data, split, batch, limit)
        sharded = NamedSharding(stepper.mesh, P(None, "data"))
        self.x, self.y, self.w = jax.device_put((x, y, w), sharded)


_BUILT: dict = {}


def clear_cache() -> None:
    """Drops the kept build (and Keras's global state with it)."""
    if _BUILT:
        _BUILT.clear()
        keras.backend.clear_session()


class _Holder(Account):
    """The run's device state (jax_step.JaxStepper's dict), which the trainer advances, the
    evaluator reads and the checkpointer saves and restores; the snapshot's weights; and the
    run's time account."""

    def __init__(self):
        super().__init__()
        self.state = None
        self.snapshot = None  # (trainable, non_trainable) of the held step


class Trainer(BaseTrainer):
    """engine/interface.Trainer on JAX: `train(n)` is one call of the compiled loop."""

    def __init__(self, config, runtime, batch_plan: BatchPlan, plan: RunPlan, build, holder):
        super().__init__(config, runtime, batch_plan, plan, holder, build.at_init)
        self.build, self.holder = build, holder
        self.order = None
        t = config.train
        self.hyper = {
            "schedule": _numbers(
                schedules.build_schedule(
                    config.optim, plan.batch, plan.steps_per_epoch, plan.total_steps
                )
            ),
            "diverge_loss": jnp.float32(t.diverge_loss),
            "seed": jnp.int32(t.seed),
        }

    def _open(self, step: int) -> None:
        n = len(arrays.train_arrays(self.config.data)[1])
        self.order = jax_data.TrainOrder(
            n, self.plan.batch, self.config.train.seed, self.config.data.shuffle_buffer
        )

    def _call(self, num_steps: int):
        rows = max(int(self.plan.steps_per_loop), num_steps)
        index, epochs = self.order.take(self.state.step, num_steps)
        pad = ((0, rows - num_steps), (0, 0))
        block = (np.pad(index, pad), np.pad(epochs, pad))

        def call():
            self.holder.state, scalars = self.build.stepper.train(
                self.holder.state, self.build.train_data, block, num_steps, self.hyper
            )
            return scalars

        return call

    def _diagnostics(self):
        return self.build.stepper.diagnostics

    def _probe(self):
        chunks, n = self.build.probe_chunks(self.config)

        def compute():
            s1, q, _ = self.build.probe.probe(self.holder.state, chunks)
            stats = diversity.stats_from_norms([s1], q, n=n)
            return {k: float(stats[k]) for k in ("diversity", "batch_bound", "noise_scale")}

        return compute, n

    def _model(self):
        return self.build.model

    def _probe_examples(self) -> int | None:
        return self.build.probe_chunks(self.config)[1] if self.plan.probe else None

    def finish(self) -> None:
        self.order = None


class Evaluator(BaseEvaluator):
    """engine/interface.Evaluator on JAX: each set's pass is one compiled while-loop that stops
    once `bound` says no target can be met. A pass reads the state's arrays (`weights`)."""

    def __init__(self, config, build, holder):
        super().__init__(config, build.eval_sets, holder, build.at_init)
        self.build, self.holder = build, holder

    def _weights(self):
        return self.holder.state

    @contextlib.contextmanager
    def _snapshot(self):
        trainable, non_trainable = self.holder.snapshot
        yield {"trainable": trainable, "non_trainable": non_trainable}

    @contextlib.contextmanager
    def _statistics(self, state):
        if self.build.recompute is not None:  # train.target_bn='recompute'
            with timing.timed("eval", self.holder.time_s):
                state = self.build.recompute(state)
        yield state

    def _pass(self, state, eval_set, bound):
        return self.build.evaluation.evaluate(state, eval_set, bound)

    def hold(self) -> None:
        # JAX arrays are immutable: the snapshot is the current state's arrays themselves.
        self.holder.snapshot = (self.holder.state["trainable"], self.holder.state["non_trainable"])


_CKPT = re.compile(r"^ckpt-(\d+)\.npz$")
# A checkpoint's arrays are keyed GROUP/VARIABLE_PATH (trainable/dense_1/kernel, optimizer/
# momentum/dense_1_kernel_momentum, snapshot/trainable/...): a model or optimizer that lists its
# variables in another order restores each value to its own variable, and a missing or foreign
# one is named instead of landing on its neighbour.
GROUPS = ("trainable", "non_trainable", "optimizer")


class CheckpointMismatch(RuntimeProblem):
    """The checkpoint's variables are not the model's and optimizer's: which ones differ."""


def variable_names(variables, owner: str | None = None) -> list[str]:
    """Each variable's path (Keras's: layer / variable), less its `owner`'s name in front (the
    optimizer's: sgd, sgd_1, ... in the order a process builds them, so a resumed run's may
    differ), which must be unique, as a checkpoint key."""
    cut = f"{owner}/" if owner else None
    names = [str(v.path) for v in variables]
    names = [n[len(cut) :] if cut and n.startswith(cut) else n for n in names]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CheckpointMismatch(
            f"variables share a path ({', '.join(repeated[:3])}): a checkpoint cannot tell them "
            "apart; give their layers distinct names"
        )
    return names


def pack(groups: dict[str, tuple[list[str], list]]) -> dict[str, np.ndarray]:
    """{group: (names, values)} -> {'group/name': array}."""
    out = {}
    for group, (names, values) in groups.items():
        if len(names) != len(values):
            raise CheckpointMismatch(f"{group}: {len(values)} values for {len(names)} variables")
        out.update({f"{group}/{n}": np.asarray(v) for n, v in zip(names, values)})
    return out


def unpack(data: dict, group: str, names: list[str], path: str = "the checkpoint") -> list:
    """The values of `group` in the order of `names` (this build's variables), by name;
    CheckpointMismatch naming what is missing or left over."""
    prefix = f"{group}/"
    stored = {k[len(prefix) :] for k in data if k.startswith(prefix)}
    missing, extra = [n for n in names if n not in stored], sorted(stored - set(names))
    if missing or extra:
        raise CheckpointMismatch(
            f"{path} does not hold this run's {group} variables"
            + (f"; missing {', '.join(missing[:3])}" if missing else "")
            + (f"; not in the model {', '.join(extra[:3])}" if extra else "")
            + "; delete the run's checkpoints/ folder to start it afresh"
        )
    return [data[prefix + n] for n in names]


class Checkpointer:
    """engine/interface.Checkpointer on JAX: WORKDIR/checkpoints/ckpt-STEP.npz holds the model's,
    the optimizer's and the snapshot's arrays, each keyed by its variable's path (GROUPS), and the
    RunState as JSON, written atomically (the two latest are kept). NumPy's format, read and
    written through the workdir store (a gs:// workdir through tf.io.gfile where TensorFlow is
    installed)."""

    KEEP = 2

    def __init__(self, build, holder, workdir: str, chief: bool, log):
        self.build, self.holder, self.log, self.chief = build, holder, log, chief
        self.directory = wd.join(workdir, wd.CHECKPOINTS)

    def _steps(self) -> list[int]:
        found = (_CKPT.match(name) for name in wd.listdir(self.directory))
        return sorted(int(m.group(1)) for m in found if m)

    def names(self) -> dict[str, list[str]]:
        """This build's variable paths per group, in the order its state lists the values."""
        stepper = self.build.stepper
        model, optimizer = stepper.model, stepper.optimizer
        return {
            "trainable": variable_names(model.trainable_variables),
            "non_trainable": variable_names(model.non_trainable_variables),
            "optimizer": variable_names(optimizer.variables, optimizer.name),
        }

    def load(self) -> RunState | None:
        """The newest checkpoint that reads whole (engine/restore.py): a damaged one is named
        and skipped when an older one is whole."""
        paths = [wd.join(self.directory, f"ckpt-{s}.npz") for s in reversed(self._steps())]
        errors = (OSError, ValueError, KeyError, IndexError, EOFError, zipfile.BadZipFile)
        candidates = [(p, [p]) for p in paths]
        path, loaded = restore.newest_readable(
            candidates, self._read, errors, self.log, set_aside=self.chief
        )
        if path is None:
            return None
        state, snapshot, run_state = loaded
        stepper = self.build.stepper
        self.holder.state = jax.device_put(state, stepper.replicated)
        if snapshot is not None:
            self.holder.snapshot = jax.device_put(snapshot, stepper.replicated)
        self.log("resumed from %s at step %d", path, run_state.step)
        return run_state

    def _read(self, path: str):
        """(the train state, the snapshot or None, the RunState) of one checkpoint, every array
        read (a cut-short file fails here, before anything is placed on the devices)."""
        with np.load(io.BytesIO(wd.read_bytes(path))) as f:
            data = {k: f[k] for k in f.files}
        stepper, names = self.build.stepper, self.names()
        state = {g: unpack(data, g, names[g], path) for g in GROUPS}
        state["diverged"] = np.asarray(False)
        snapshot = None
        if any(k.startswith("snapshot/") for k in data):
            snap = {k[len("snapshot/") :]: v for k, v in data.items() if k.startswith("snapshot/")}
            snapshot = (
                unpack(snap, "trainable", names["trainable"], path),
                unpack(snap, "non_trainable", names["non_trainable"], path),
            )
        iterations = int(state["optimizer"][stepper._iterations])
        return state, snapshot, RunState.from_json(bytes(data["run_state"]).decode(), iterations)

    def save(self, state: RunState) -> None:
        if not self.chief:
            return
        device, names = jax.device_get(self.holder.state), self.names()
        out = {"run_state": np.frombuffer(state.to_json().encode(), np.uint8)}
        out.update(pack({g: (names[g], device[g]) for g in GROUPS}))
        snapshot = self.holder.snapshot
        if snapshot is not None:
            snap = pack(
                {
                    "trainable": (names["trainable"], jax.device_get(snapshot[0])),
                    "non_trainable": (names["non_trainable"], jax.device_get(snapshot[1])),
                }
            )
            out.update({f"snapshot/{k}": v for k, v in snap.items()})
        buffer = io.BytesIO()
        np.savez(buffer, **out)
        wd.makedirs(self.directory)
        wd.write_bytes_atomic(wd.join(self.directory, f"ckpt-{state.step}.npz"), buffer.getvalue())
        for old in self._steps()[: -self.KEEP]:
            wd.remove(wd.join(self.directory, f"ckpt-{old}.npz"))

    def close(self) -> None:
        pass


@dataclasses.dataclass
class Backend:
    """One run's Trainer, Evaluator and Checkpointer on JAX, and the build they share."""

    trainer: Trainer
    evaluator: Evaluator
    checkpointer: Checkpointer
    build: _Build


def make(config, workdir, runtime, info, batch_plan, plan, new_model, chief, log) -> Backend:
    """The backend of one run: the kept build when the compile key matches (its compiled
    functions reused), else a new one; the run's state from its seed's initial weights."""
    preemption.set_collective(*preemption.jax_collective())  # hosts agree where they stop
    key = json.dumps(
        {
            "config": compile_key.config_key(config),
            "plan": dataclasses.astuple(batch_plan),
            "devices": [str(d) for d in runtime.devices],
            "policy": runtime.mixed_precision,
        },
        sort_keys=True,
        default=str,
    )
    build = _BUILT.get(key)
    if build is None:
        clear_cache()
        runtime.apply_policy()
        build = _BUILT[key] = _Build(key, config, runtime, info, batch_plan, plan, new_model)
    holder = _Holder()
    weights = build.weights_for(config.train.seed, config, info, new_model)
    holder.state = build.stepper.initial_state(weights, build.optimizer_init)
    seeding.seed_host(config.train.seed)
    trainer = Trainer(config, runtime, batch_plan, plan, build, holder)
    checkpointer = Checkpointer(build, holder, workdir, chief, log)
    return Backend(trainer, Evaluator(config, build, holder), checkpointer, build)


def device_cap(config, runtime) -> int:
    """The largest per-device batch: the config's (no GPU default table on JAX yet)."""
    return int(config.train.max_device_batch)


def is_chief(runtime) -> bool:
    return runtime.chief
