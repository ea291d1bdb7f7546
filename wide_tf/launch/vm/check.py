"""Owns `--check`'s study stage: the memory model's worst row of a config built and stepped on this
machine's accelerator, its measured peak memory beside the model's figure, the compile seconds,
the seconds of 20 steps, a checkpoint written to the workdir (a gs:// path on a TPU VM) and read
back, and which TPU runtime came up.

  python -m wide_tf.launch.vm.check --config=configs/wrn.py --workdir=gs://BUCKET/wrn \
      [--config.a.b=V]

The worst row is hardware_fit's: the member and batch size whose step the memory model gives the
most bytes per replica (the largest member at the largest batch per replica, after the config's
train.max_device_batch, or on a GPU the default micro-batch engine/tf/strategy.py would choose). Its
model is stepped on synthetic examples of the study's shapes, travelling as the real infeed's
packed images do, with the optimizer the study builds: memory and speed do not depend on the pixel
values. Nothing of the study is written but WORKDIR/check/ (removed again after the read-back).
Exit status: 0 every stage passed, 1 one failed (its line says which), 2 a usage error.
"""

from __future__ import annotations

import os
import sys
import time

from wide_tf.checks import hardware_fit, loader
from wide_tf.schema import datasets, memory
from wide_tf.store import remove

STEPS_FIRST = 3  # the compiled program's first call: trace, compile, 3 steps
STEPS_TIMED = 20
USAGE = "--config=FILE[:VARIANT] --workdir=PATH [--config.a.b=VALUE ...]"


def worst_row(config, replicas: int, policy: str, cap: int) -> hardware_fit.Row:
    """The memory model's row of the most bytes per replica at `replicas`, `policy` and `cap`."""
    rows = hardware_fit.rows(config, replicas, policy, cap)
    return max(rows, key=lambda r: r.bytes)


def tpu_runtime(environ=os.environ, maps_path: str = "/proc/self/maps") -> str:
    """Which TPU runtime TensorFlow took, and how that is known. PJRT: TensorFlow loads libtpu as
    a next pluggable device when PJRT_DEVICE=TPU, NEXT_PLUGGABLE_DEVICE_USE_C_API=true and
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH are set before its import (the keras-io recipe
    examples/keras_rs/distributed_embedding_tf.py sets exactly these; launch_tpu.sh writes them to
    the VM's env file); the library's path mapped in this process confirms the load. Without them
    a TPU runs on TensorFlow's stream executor (the TPU VM images' default before PJRT)."""
    lib = environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "")
    pjrt = (
        environ.get("PJRT_DEVICE") == "TPU"
        and environ.get("NEXT_PLUGGABLE_DEVICE_USE_C_API") == "true"
        and bool(lib)
    )
    if not pjrt:
        return (
            "stream executor (PJRT_DEVICE=TPU, NEXT_PLUGGABLE_DEVICE_USE_C_API=true and "
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH not all set)"
        )
    try:
        with open(maps_path) as f:
            mapped = any(lib in line for line in f)
    except OSError:
        return f"PJRT (the pluggable-device variables name {lib}; its load not confirmed)"
    loaded = "mapped in this process" if mapped else "NOT mapped in this process"
    return f"PJRT (pluggable device {lib}, {loaded})"


def _peak_bytes(tf, strategy) -> tuple[int | None, str]:
    """The first replica's device memory peak as TensorFlow reports it; None on a CPU."""
    device = strategy.extended.worker_devices[0]
    if "CPU" in device.upper().rsplit("/", 1)[-1]:
        return None, f"{device}: a CPU (TensorFlow's memory info counts GPU and TPU memory)"
    try:
        return int(tf.config.experimental.get_memory_info(device)["peak"]), device
    except (ValueError, RuntimeError, KeyError) as e:
        return None, f"{device}: {type(e).__name__}"


def _size(n: int) -> str:
    return f"{n / memory.GB:.2f} GB" if n >= memory.GB else f"{n / 1e6:.1f} MB"


def _iterator(tf, strategy, config, per_replica: int):
    """Synthetic batches of the study's shapes, packed as the infeed packs images."""
    import numpy as np

    from wide_tf.engine.tf import data

    spec = datasets.get(config.data.name)
    rng = np.random.default_rng(0)
    u8 = rng.integers(0, 256, size=(per_replica, *spec.input_shape), dtype=np.uint8)
    x = data.pack_images(tf.constant(u8))
    y = tf.constant(rng.integers(0, spec.num_classes, size=per_replica), tf.int32)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    return iter(strategy.distribute_datasets_from_function(lambda ctx: ds))


def _checkpoint(tf, model, optimizer, workdir: str, out) -> None:
    """Writes model and optimizer to WORKDIR/check/ckpt through tf.io.gfile (gs:// on a VM), reads
    them back into the same objects after zeroing one weight, and compares it."""
    folder = f"{workdir.rstrip('/')}/check"
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    weight = model.trainable_variables[0]
    before = weight.numpy()
    start = time.perf_counter()
    path = ckpt.write(f"{folder}/ckpt")
    wrote = time.perf_counter() - start
    size = sum(tf.io.gfile.stat(f"{folder}/{name}").length for name in tf.io.gfile.listdir(folder))
    weight.assign(tf.zeros_like(weight))
    start = time.perf_counter()
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(path).assert_consumed()
    read = time.perf_counter() - start
    if not (weight.numpy() == before).all():
        raise RuntimeError(f"the checkpoint read back from {path} differs from what was written")
    remove.remove_tree(folder)  # never through a link planted at WORKDIR/check
    out(
        f"check: checkpoint {size / 1e6:.1f} MB written to {path} in {wrote:.1f} s, read back "
        f"in {read:.1f} s, the same weights (then removed)"
    )


def _build(config, runtime, row, cap):
    """The worst row's model, the study's optimizer and a Stepper, under the strategy's scope."""
    import keras

    from wide_tf.engine import optim as optim_lib
    from wide_tf.engine.models import build_model
    from wide_tf.engine.tf.step import BatchPlan, Stepper

    member = next(m for m in hardware_fit.members(config) if m.name == row.member)
    plan = BatchPlan.make(row.batch, runtime.num_replicas, cap)
    spec = datasets.get(config.data.name)
    steps_per_epoch = max(1, spec.num_train // row.batch)
    with runtime.strategy.scope():
        keras.utils.set_random_seed(0)
        model = build_model(
            member.arch,
            member.depth,
            member.width,
            spec.num_classes,
            spec.input_shape,
            norm=config.model.norm,
            ghost_batch_size=config.model.ghost_batch_size,
        )
        optimizer = optim_lib.build_optimizer(
            config.optim, row.batch, steps_per_epoch, 10**6, variables=model.trainable_variables
        )
        optimizer.build(model.trainable_variables)
        stepper = Stepper(
            model,
            optimizer,
            runtime.strategy,
            plan,
            jit_compile=runtime.jit_compile,
            input_spec=spec,
        )
    return member, plan, model, optimizer, stepper


def _first_call(tf, config, runtime, row, plan, stepper, out):
    """Trace, compile and 3 steps; the measured peak beside the memory model's figure."""
    iterator = _iterator(tf, runtime.strategy, config, plan.per_replica)
    start = time.perf_counter()
    stepper.train(iterator, STEPS_FIRST)
    compile_s = time.perf_counter() - start
    peak, where = _peak_bytes(tf, runtime.strategy)
    model_bytes = memory.step_bytes(
        row.elements, row.params, plan.micro_batch, runtime.mixed_precision
    )
    measured = (
        f"measured peak {_size(peak)} on {where} (TensorFlow's get_memory_info)"
        if peak is not None
        else f"measured peak not reported ({where})"
    )
    out(
        f"check: worst row {row.member} at batch {row.batch} ({plan.per_replica} per replica in "
        f"{plan.num_micro_batches} micro-batch(es) of {plan.micro_batch}, "
        f"{runtime.mixed_precision}): memory model {_size(model_bytes)} per replica, "
        f"{measured}; first call (trace, compile, {STEPS_FIRST} steps) {compile_s:.1f} s"
    )
    return iterator


def run(config, workdir: str, out=print) -> None:
    """The stages, each one line to `out`; an exception is the failed stage."""
    import keras
    import tensorflow as tf

    from wide_tf.engine.tf import strategy as strategy_lib

    start = time.perf_counter()
    runtime = strategy_lib.setup_runtime(config.runtime)
    tpu = runtime.platform == "tpu"
    out(
        f"check: {runtime.describe()}; TensorFlow {tf.__version__}, Keras {keras.__version__}; "
        f"TPU runtime: {tpu_runtime() if tpu else 'none (' + runtime.platform + ')'}; "
        f"set up in {time.perf_counter() - start:.1f} s"
    )
    cap = int(config.train.max_device_batch or 0)
    row = worst_row(config, runtime.num_replicas, runtime.mixed_precision, cap)
    member = next(m for m in hardware_fit.members(config) if m.name == row.member)
    config.model.depth, config.model.width = member.depth, member.width
    config.train.global_batch = row.batch
    cap = cap or strategy_lib.max_device_batch(config, runtime)
    _, plan, model, optimizer, stepper = _build(config, runtime, row, cap)
    iterator = _first_call(tf, config, runtime, row, plan, stepper, out)
    start = time.perf_counter()
    scalars = stepper.train(iterator, STEPS_TIMED)
    timed = time.perf_counter() - start
    out(
        f"check: {STEPS_TIMED} steps in {timed:.2f} s ({timed / STEPS_TIMED * 1e3:.1f} ms a step, "
        f"{STEPS_TIMED * row.batch / timed:,.0f} examples/s; one timing, not a median)"
        + (" (diverged on random labels: the timing still holds)" if scalars["diverged"] else "")
    )
    _checkpoint(tf, model, optimizer, workdir, out)


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(f"usage: python -m wide_tf.launch.vm.check {USAGE}")
        return 0
    spec = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    workdir = next((a.split("=", 1)[1] for a in args if a.startswith("--workdir=")), None)
    overrides = [a for a in args if a.startswith("--config.") and "=" in a]
    unknown = [a for a in args if not a.startswith(("--config=", "--workdir=", "--config."))]
    if spec is None or not workdir or unknown:
        extra = f" (unknown: {' '.join(unknown)})" if unknown else ""
        print(f"error: give a config and a workdir{extra}; usage: {USAGE}", file=sys.stderr)
        return 2
    try:
        config = loader.load_config(spec)
        for o in overrides:
            hardware_fit.apply_override(config, o)
    except (ValueError, KeyError, AttributeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        run(config, workdir)
    except Exception as e:  # noqa: BLE001  (any failure is the check's answer, as one line)
        print(f"error: check failed: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    print("check: the study stage passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
