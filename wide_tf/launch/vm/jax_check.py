"""Owns the device stage of `--check --backend=jax` (the launcher): JAX's devices as a run of this
package takes them (engine/jax/run.setup_runtime: every local device, or every process's under
WIDE_TF_JAX_DISTRIBUTED=1, after jax.distributed.initialize()), their kinds, the process count and
index, the JAX and libtpu versions, the first device's memory limit, and one psum over all of
them, against the replica count the launcher checked the config for. No TensorFlow: a line says
whether any module of it was loaded.

  python -m wide_tf.launch.vm.jax_check --replicas=N

Every process of a multi-host slice runs it (JAX's programs are the same on every host); each
prints its own lines. Exit status: 0 as expected, 3 another device count or a wrong psum, 2 a
usage error.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
import types

USAGE = "--replicas=N (the replica count the launcher checked the config for)"


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "not installed"


def _memory(device) -> str:
    try:
        stats = device.memory_stats() or {}
    except (AttributeError, RuntimeError, NotImplementedError):
        stats = {}
    limit = stats.get("bytes_limit")
    return f"{limit / 2**30:.1f} GiB" if limit else "not reported"


def report(expected: int, strategy: str = "auto") -> int:
    """Prints the check's lines; returns the exit status (0, or 3 when the devices differ)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")  # engine.jax.run imports Keras
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from wide_tf.engine.jax import run as jax_run

    cfg = types.SimpleNamespace(strategy=strategy, mixed_precision="auto")
    runtime = jax_run.setup_runtime(cfg)
    devices = runtime.devices
    kinds = sorted({d.device_kind for d in devices})
    print(
        f"wide_tf check: runtime JAX {jax.__version__} on {runtime.platform} (PJRT), libtpu "
        f"{_version('libtpu')}; process {jax.process_index()} of {jax.process_count()}"
        f"{' (jax.distributed)' if jax_run.distributed() else ''}",
        flush=True,
    )
    print(
        f"wide_tf check: {len(devices)} device(s) ({jax.local_device_count()} on this host), "
        f"kind {', '.join(kinds)}; first: {devices[0]}, memory limit "
        f"{_memory(jax.local_devices()[0])}; policy {runtime.mixed_precision}",
        flush=True,
    )
    print(f"wide_tf check: jax.devices() = {list(jax.devices())}", flush=True)
    mesh = Mesh(np.asarray(devices), ("data",))
    ones = jax.device_put(np.ones(len(devices), np.float32), NamedSharding(mesh, P("data")))
    total = jax.jit(
        jax.shard_map(
            lambda x: jax.lax.psum(x.sum(), "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
        )
    )(ones)
    total = int(np.asarray(total))
    loaded = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))
    print(
        f"wide_tf check: a psum over every device gave {total} (expected {len(devices)}); "
        f"TensorFlow {'loaded' if loaded else 'not loaded'} in this process",
        flush=True,
    )
    ok = total == len(devices) == expected
    print(
        f"wide_tf check: JAX sees {len(devices)} replica(s) (expected {expected})",
        flush=True,
    )
    return 0 if ok else 3


def main(argv: list[str]) -> int:
    expected = None
    strategy = "auto"
    for a in argv:
        if a.startswith("--replicas=") and a.split("=", 1)[1].isdigit():
            expected = int(a.split("=", 1)[1])
        elif a.startswith("--strategy=") and a.split("=", 1)[1] in ("auto", "tpu", "cpu"):
            strategy = a.split("=", 1)[1]
        else:
            print(f"error: unexpected argument {a!r}; usage: {USAGE}", file=sys.stderr)
            return 2
    if not expected:
        print(f"error: --replicas is required; usage: {USAGE}", file=sys.stderr)
        return 2
    return report(expected, strategy)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
