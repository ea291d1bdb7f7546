"""Owns the VM's set-up after the install (vm_setup.sh ends with it): the environment file every
later step sources (the runtime's variables) and one line of the versions installed.

  python -m wide_tf.launch.vm.setup --env=~/wide_tf_env.sh --runtime=pjrt --stack=... [--tpu=NAME]
      [--distributed]

Runtimes: pjrt (a single host, TensorFlow: PJRT_DEVICE=TPU, NEXT_PLUGGABLE_DEVICE_USE_C_API=true,
TF_PLUGGABLE_DEVICE_LIBRARY_PATH=libtpu's .so and the recipe's TF_XLA_FLAGS, set before TensorFlow
is imported, as keras-io examples/keras_rs/distributed_embedding_tf.py does), stream_executor
(--pjrt=off: none of them), grpc_tpu_server (a TensorFlow pod: the client on worker 0 names the TPU,
TPU_LOAD_LIBRARY=0, with the recipe's flags where the graph is built), jax (none; --distributed
makes each worker of a multi-host slice one JAX process of several).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from wide_tf.launch.software import RECIPE_XLA_FLAGS

RUNTIMES = ("pjrt", "stream_executor", "grpc_tpu_server", "jax")


def env_lines(runtime: str, stack: str, tpu: str, distributed: bool, libtpu_path) -> list[str]:
    """The environment file's lines; `libtpu_path` is called only under PJRT."""
    lines = ["# written by python -m wide_tf.launch.vm.setup"]
    if runtime == "pjrt":
        lines.append(
            "export PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true "
            f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={shlex.quote(libtpu_path())}"
        )
    if runtime in ("pjrt", "grpc_tpu_server"):
        lines.append(f"export TF_XLA_FLAGS={shlex.quote(RECIPE_XLA_FLAGS)}")
    if runtime == "grpc_tpu_server":
        lines.append(f"export TPU_NAME={shlex.quote(tpu)} TPU_LOAD_LIBRARY=0")
    if distributed:
        lines.append("export WIDE_TF_JAX_DISTRIBUTED=1")
    lines.append(f"export WIDE_TF_TPU_RUNTIME={runtime} WIDE_TF_TPU_STACK={shlex.quote(stack)}")
    return lines


def _libtpu_path() -> str:
    import libtpu

    return libtpu.get_library_path()


def versions(runtime: str) -> str:
    """One line: what the venv holds, read by importing it (the install's proof)."""
    import importlib.metadata as md

    if runtime == "jax":
        os.environ["KERAS_BACKEND"] = "jax"
        import jax
        import keras

        return (
            f"wide_tf install: {sys.version.split()[0]} JAX {jax.__version__} libtpu "
            f"{md.version('libtpu')} Keras {keras.__version__} tensorflow-cpu "
            f"{md.version('tensorflow-cpu')}"
        )
    import keras
    import tensorflow as tf

    return (
        f"wide_tf install: {sys.version.split()[0]} TensorFlow {tf.__version__} Keras "
        f"{keras.__version__}"
    )


def main(argv: list[str]) -> int:
    args = dict(a.removeprefix("--").partition("=")[::2] for a in argv)
    runtime = args.get("runtime", "")
    if runtime not in RUNTIMES or not args.get("env") or not args.get("stack"):
        print(f"error: give --env, --stack and --runtime={'|'.join(RUNTIMES)}", file=sys.stderr)
        return 2
    lines = env_lines(
        runtime, args["stack"], args.get("tpu", ""), "distributed" in args, _libtpu_path
    )
    with open(os.path.expanduser(args["env"]), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(versions(runtime), flush=True)
    if runtime == "grpc_tpu_server":  # TensorFlow's TPU server on every worker of a pod image
        up = subprocess.run(["systemctl", "is-active", "--quiet", "tpu-runtime"]).returncode == 0
        if not up:
            print(
                f"warning: the tpu-runtime service (TensorFlow's TPU server, port 8470) is not "
                f"active on {os.uname().nodename}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
