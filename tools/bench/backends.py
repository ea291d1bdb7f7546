"""Owns the backend benchmark: one WRN training step at a large batch, on JAX over 8
virtual CPU devices (shard_map) against TensorFlow's MirroredStrategy over 2 logical CPU devices,
per example, through the package's own run (engine/train.setup: the Trainer either backend makes).
Each measurement runs in its own child process (a process runs one Keras backend), the two
backends alternating round by round so that the machine's drift falls on both.

    python -m tools.bench.backends [--batch=1024] [--steps=2] [--rounds=2]

Prints one row per backend: the devices, the first call's seconds (compilation included), the
median seconds of a step afterwards, examples per second, and the ratio to TensorFlow's."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    # name: (KERAS_BACKEND, XLA_FLAGS' device count, runtime.devices for TensorFlow)
    "tensorflow, MirroredStrategy on 2 logical CPUs": ("tensorflow", None, 2),
    "jax, shard_map on 8 virtual CPU devices": ("jax", 8, None),
}


def _config(backend: str, batch: int, steps: int, tf_devices: int | None):
    from wide_tf.schema import defaults

    config = defaults.base_config("wrn", "mnist_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = 10, 1, "batch"
    config.optim.name = "momentum"
    config.runtime.backend = backend
    config.runtime.strategy = "cpu"
    if tf_devices:
        config.runtime.devices = tuple(f"/cpu:{i}" for i in range(tf_devices))
    config.train.global_batch = batch
    config.train.steps_per_loop = steps
    config.train.max_steps = 1000
    config.train.gradient_every_examples = 0
    return config


def child(backend: str, batch: int, steps: int, tf_devices: int | None) -> dict:
    """In a child process: set up one run and time its Trainer's calls."""
    if backend == "tensorflow" and tf_devices:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(tf_devices)]
        )
    from wide_tf.engine import train
    from wide_tf.engine.state import RunState

    config = _config(backend, batch, steps, tf_devices)
    with tempfile.TemporaryDirectory() as tmp:
        _, run = train.setup(config, tmp, train.runtime_for(config))
        run.trainer.restore(RunState())
        start = time.perf_counter()
        run.trainer.train(steps)
        first = time.perf_counter() - start
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run.trainer.train(steps)
            times.append((time.perf_counter() - start) / steps)
        replicas = run.trainer.describe().batch_plan["replicas"]
    return {"first_s": first, "step_s": statistics.median(times), "replicas": replicas}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        backend, flags, tf_devices = CASES[args.child]
        print("JSON " + json.dumps(child(backend, args.batch, args.steps, tf_devices)))
        return
    rows: dict = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, (backend, devices, _) in CASES.items():
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
            env["CUDA_VISIBLE_DEVICES"] = ""
            if devices:
                env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
                env["JAX_PLATFORMS"] = "cpu"
            command = [sys.executable, "-m", "tools.bench.backends", "--child", name]
            command += [f"--batch={args.batch}", f"--steps={args.steps}"]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            line = next((x for x in out.stdout.splitlines() if x.startswith("JSON ")), None)
            if line is None:
                sys.exit(f"error: the {name} child failed:\n{out.stderr[-3000:]}")
            rows[name].append(json.loads(line[5:]))
    print(f"WRN-10-1 (batch norm) on the embedded MNIST, batch {args.batch}, {args.rounds} rounds")
    base = None
    for name, got in rows.items():
        step = statistics.median(r["step_s"] for r in got)
        first = statistics.median(r["first_s"] for r in got)
        base = base or step
        print(
            f"{name:50s} replicas {got[0]['replicas']}  first call {first:7.2f} s  "
            f"step {step:7.3f} s  {args.batch / step:8.0f} ex/s  time vs TF {step / base:5.2f}x"
        )


if __name__ == "__main__":
    main()
