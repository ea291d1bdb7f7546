"""Owns the choice of tf.distribute strategy and the per-platform defaults (XLA, mixed
precision)."""

from __future__ import annotations

import dataclasses
import json
import os

import keras
import tensorflow as tf
from absl import logging

from wide_tf.schema import datasets, families, hardware, memory
from wide_tf.schema.fields import PRECISIONS, STRATEGIES
from wide_tf.schema.problems import RuntimeProblem


class StrategyError(RuntimeProblem):
    """The requested strategy cannot be set up on this machine."""


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What the trainer needs to know about the hardware it runs on."""

    strategy: tf.distribute.Strategy
    platform: str  # 'tpu' | 'gpu' | 'cpu'
    num_replicas: int
    jit_compile: bool
    mixed_precision: str  # a keras dtype policy name
    # float32 matmuls and convolutions run in TF32 (10-bit mantissa): Ampere and later GPUs, by
    # TensorFlow's default (tensor_float_32)
    tf32: bool = False

    def apply_policy(self) -> None:
        """Sets this runtime's Keras dtype policy. Called before every model is built: the policy
        lives in Keras's global state, which `keras.backend.clear_session()` resets to float32."""
        keras.mixed_precision.set_global_policy(self.mixed_precision)

    def describe(self) -> str:
        return (
            f"{type(self.strategy).__name__} on {self.platform}, {self.num_replicas} replica(s), "
            f"jit_compile={self.jit_compile}, policy={self.mixed_precision}"
            + (" (TF32 matmuls and convolutions)" if self.tf32 else "")
        )


def _tpu_strategy(tpu: str) -> tf.distribute.Strategy:
    # 'local' is the TPU VM case; a name or grpc:// address is a TPU node.
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


_tpu_reachable = hardware.tpu_reachable  # a TPU named, or this is a TPU VM


def _multi_worker_strategy() -> tf.distribute.Strategy:
    if "TF_CONFIG" not in os.environ:
        raise StrategyError(
            "runtime.strategy=multi_worker needs TF_CONFIG (cluster and task) in the "
            "environment; set it on every worker, or use --config.runtime.strategy=auto"
        )
    try:
        json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as e:
        raise StrategyError(
            f"TF_CONFIG is not valid JSON ({e}); fix the environment variable"
        ) from e
    return tf.distribute.MultiWorkerMirroredStrategy()


def _select(name: str, tpu: str, devices: list[str] | None) -> tuple[tf.distribute.Strategy, str]:
    if name == "multi_worker":
        # First: listing devices initialises the runtime, after which collective ops can no
        # longer be configured ("Collective ops must be configured at program startup").
        strategy = _multi_worker_strategy()
        return strategy, ("gpu" if tf.config.list_logical_devices("GPU") else "cpu")
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        if _tpu_reachable(tpu):
            name = "tpu"
        elif gpus:
            name = "gpu"
        else:
            name = "cpu"
    if name == "tpu":
        return _tpu_strategy(tpu), "tpu"
    if name == "gpu":
        if not gpus:
            raise StrategyError(
                "runtime.strategy=gpu but TensorFlow sees no GPU; install the [gpu] extra "
                "(tensorflow[and-cuda]) or use --config.runtime.strategy=cpu"
            )
        if len(gpus) == 1:
            return tf.distribute.OneDeviceStrategy(gpus[0].name), "gpu"
        return tf.distribute.MirroredStrategy([d.name for d in gpus]), "gpu"
    if name == "cpu":
        if (
            devices
        ):  # several logical CPUs: used by tests and to rehearse multi-replica runs on a laptop
            return tf.distribute.MirroredStrategy(devices), "cpu"
        return tf.distribute.OneDeviceStrategy("/cpu:0"), "cpu"
    raise StrategyError(f"unknown runtime.strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


def _default_jit(platform: str, requested, replicas: int = 1) -> bool:
    # Measured (docs/design.md, "TensorFlow / Keras 3 facts"): XLA under MirroredStrategy over
    # logical CPUs fails and on CPU it made a WRN ~30% slower; on TPU it is the only path and on one
    # GPU it is usually faster. On several GPUs (MirroredStrategy, MultiWorkerMirroredStrategy) a
    # jit_compile function nested inside strategy.run fails on the first step ("merge_call
    # called while defining a new graph"; tests/engine/test_strategy.py reproduces it on two
    # logical CPUs shown to the strategy as GPUs, a CPU stand-in for the multi-GPU set-up), and
    # Keras itself turns its automatic XLA off under tf.distribute, so 'auto' is off there.
    if requested in ("auto", "fused", None):  # fused: engine/tf/fused.py, CPU only
        return platform == "tpu" or (platform == "gpu" and replicas == 1)
    if isinstance(requested, str):
        return requested.lower() in ("1", "true", "yes")
    return bool(requested)


def _default_policy(platform: str, requested: str) -> str:
    if requested in ("auto", None, ""):
        return "mixed_bfloat16" if platform == "tpu" else "float32"
    # mixed_float16 would need loss scaling in the custom loop; bfloat16 (TPU, A100/H100) does not.
    if requested not in PRECISIONS:  # "auto" was handled above
        raise StrategyError(
            f"unknown runtime.mixed_precision {requested!r}; choose auto, float32 or mixed_bfloat16"
        )
    return requested


def setup_runtime(runtime_cfg) -> Runtime:
    """Builds the strategy that `runtime_cfg.strategy` asks for, logs it, and sets the dtype
    policy."""
    strategy, platform = _select(runtime_cfg.strategy, runtime_cfg.tpu, list(runtime_cfg.devices))
    replicas = strategy.num_replicas_in_sync
    jit = _default_jit(platform, runtime_cfg.jit_compile, replicas)
    if jit and platform == "cpu" and replicas > 1:
        raise StrategyError(
            "jit_compile=True fails under MirroredStrategy over CPU devices; "
            "use --config.runtime.jit_compile=auto"
        )
    if jit and platform == "gpu" and replicas > 1:
        raise StrategyError(
            f"jit_compile=True fails on the first step under {type(strategy).__name__} with "
            f"{replicas} GPUs (XLA inside strategy.run: 'merge_call called while defining a new "
            f"graph'); use --config.runtime.jit_compile=auto (XLA off on several GPUs, on for one)"
        )
    policy = _default_policy(platform, runtime_cfg.mixed_precision)
    tf32 = tensor_float_32(platform, policy)
    runtime = Runtime(strategy, platform, strategy.num_replicas_in_sync, jit, policy, tf32)
    runtime.apply_policy()
    logging.info(
        "Runtime: %s; devices: %s",
        runtime.describe(),
        ", ".join(d for d in strategy.extended.worker_devices),
    )
    return runtime


def _gpu_name() -> str:
    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "") if gpus else ""


def gpu_device(name: str, read_memory=hardware.gpu_memory_bytes) -> memory.Device:
    """This process's GPU for the memory model: the table's entry for its CUDA name; a MIG
    instance by the profile in its name; else the total memory its driver reports (nvidia-smi).
    StrategyError naming train.max_device_batch when none of these says how much memory it has:
    the paper's batches would otherwise run out of memory on it, uncapped."""
    dev = memory.gpu_from_name(name) or memory.mig_device(name)
    if dev is not None:
        return dev
    visible = hardware.gpu_ids()
    mig = "MIG" in name.upper().split() or any(str(v).startswith("MIG-") for v in visible[:1])
    total, source = (None, "a MIG instance without a profile in its name") if mig else read_memory()
    if total:
        dev = memory.gpu_from_memory(name, total, source)
        logging.info(
            "max_device_batch: GPU %r not in the memory table; %s: %s", name, source, dev.stated
        )
        return dev
    raise StrategyError(
        f"GPU {name!r} is not in the memory table (wide_tf/schema/memory.py) and its memory could "
        f"not be read ({source}); set --config.train.max_device_batch to the examples one "
        f"micro-batch may hold on it (python -m wide_tf.checks.hardware_fit --table lists them "
        f"per GPU of the table), or add the GPU to DEVICES"
    )


def tensor_float_32(platform: str, policy: str) -> bool:
    """True when this run's float32 matmuls and convolutions run in TF32: a GPU of compute
    capability 8.0 or later (Ampere, Ada, Hopper, Blackwell) with TensorFlow's TF32 switch on,
    which is its default (tf.config.experimental.enable_tensor_float_32_execution)."""
    if platform != "gpu" or policy != "float32":
        return False
    if not tf.config.experimental.tensor_float_32_execution_enabled():
        return False
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False
    major = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
    return tuple(major)[0] >= 8


def max_device_batch(config, runtime: Runtime, device_name: str | None = None) -> int:
    """train.max_device_batch as the config gives it; on a GPU with none (0), the memory model's
    largest micro-batch of this run's model on that GPU (wide_tf.schema.memory, the GPU found by
    its CUDA name, else by the memory its driver reports: gpu_device), logged in one line, when
    the replica's batch does not fit whole (0 when it does). One worker per GPU holds the whole
    batch otherwise, which runs out of memory at the paper's batches."""
    cap = int(config.train.max_device_batch or 0)
    if cap or runtime.platform != "gpu":
        return cap
    name = _gpu_name() if device_name is None else device_name
    if not name:  # no physical GPU (logical CPUs shown as GPUs, as the multi-GPU tests do)
        logging.info("max_device_batch: TensorFlow lists no physical GPU; no default")
        return 0
    dev = gpu_device(name)
    m, data = config.model, datasets.of(config.data)
    shape, classes = tuple(data.input_shape), data.num_classes
    elements = memory.activation_elements(m.arch, m.depth, m.width, classes, shape, m.norm)
    params = families.param_count(m.arch, m.depth, m.width, classes, shape, norm=m.norm)
    ghost = int(m.ghost_batch_size) if m.norm == "ghost" else 1
    per_replica = int(config.train.global_batch) // runtime.num_replicas
    largest = memory.largest_batch(elements, params, dev, runtime.mixed_precision, ghost)
    if per_replica <= largest:
        return 0
    cap = memory.cap_for([per_replica], largest, ghost)
    logging.info(
        "max_device_batch: %d per micro-batch on %s (%s): %d examples per replica do not fit; "
        "set train.max_device_batch to choose",
        cap,
        dev.name,
        name,
        per_replica,
    )
    return cap
