"""Owns --check's TPU stage on TensorFlow: the TPU system initialised as the run takes it, its
replica count against the one the config was checked for, the runtime that came up (PJRT through
the pluggable-device variables, the stream executor, or a pod's gRPC servers), the TensorFlow and
libtpu versions, the libtpu mapped in this process and the first device's memory.

  python -m wide_tf.launch.vm.tpu_check --tpu=local|NAME --replicas=N

Exit status: 0 as expected, 3 another replica count, 2 a usage error.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys


def runtime(tpu: str, env=os.environ) -> str:
    """Which runtime this process set up, from its environment (the launcher wrote it)."""
    pjrt = (
        env.get("PJRT_DEVICE") == "TPU"
        and env.get("NEXT_PLUGGABLE_DEVICE_USE_C_API") == "true"
        and bool(env.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"))
    )
    if tpu != "local":
        return "gRPC TPU servers of the pod image (no PJRT variables)"
    if pjrt:
        lib, flags = env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"], env.get("TF_XLA_FLAGS") or "unset"
        return f"PJRT (pluggable device {lib}, TF_XLA_FLAGS {flags})"
    return "stream executor (no PJRT variables)"


def loaded_libtpu(maps_path: str = "/proc/self/maps") -> str:
    try:
        with open(maps_path) as f:
            words = f.read().split()
    except OSError:
        words = []
    libs = sorted({w for w in words if w.startswith("/") and "libtpu" in w.rsplit("/", 1)[-1]})
    return ", ".join(libs) or "no libtpu"


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "not installed"


def report(tpu: str, expected: int) -> int:
    import tensorflow as tf

    r = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
    n = tf.distribute.TPUStrategy(r).num_replicas_in_sync
    print(
        f"wide_tf check: runtime {runtime(tpu)}; tensorflow {tf.__version__}, libtpu "
        f"{_version('libtpu')}; loaded {loaded_libtpu()}; the launcher set up "
        f"{os.environ.get('WIDE_TF_TPU_RUNTIME', '?')}"
    )
    try:
        dev = tf.config.list_logical_devices("TPU")[0]
        info = tf.config.experimental.get_memory_info(dev.name)
        print(
            f"wide_tf check: {dev.name} memory in use {info['current']} bytes, peak "
            f"{info['peak']} (the HBM per replica is in wide_tf/schema/memory.py)"
        )
    except Exception as e:  # noqa: BLE001  (a device that reports no memory is a line, not a failure)
        print(f"wide_tf check: device memory not reported ({type(e).__name__}: {e})")
    print(f"wide_tf check: the TPU system has {n} replicas (expected {expected})")
    return 0 if n == expected else 3


def main(argv: list[str]) -> int:
    args = dict(a.removeprefix("--").partition("=")[::2] for a in argv)
    if not args.get("tpu") or not args.get("replicas", "").isdigit() or len(args) != 2:
        print(
            "error: usage: python -m wide_tf.launch.vm.tpu_check --tpu=local|NAME --replicas=N",
            file=sys.stderr,
        )
        return 2
    return report(args["tpu"], int(args["replicas"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
