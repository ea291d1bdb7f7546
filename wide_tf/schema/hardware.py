"""Owns what this machine has, seen without TensorFlow: a TPU VM, GPUs and the usable CPU cores.

One home for the probes that the config checks, the strategy, the worker planner and main's log
level all make, so that a new accelerator's device file is added once. Reading /dev, the
environment and, for a GPU's memory, nvidia-smi: starting TensorFlow to ask would cost seconds and,
on a GPU, claim its memory (and TensorFlow reports a GPU's name, not its total memory).
"""

from __future__ import annotations

import glob
import os
import subprocess

# Device files of a TPU VM (TPU v4 and later: /dev/accel*; v5e/v6e through VFIO).
TPU_DEVICES = ("/dev/accel0", "/dev/vfio/0")
# An NVIDIA GPU (/dev/nvidiaN), a GPU under WSL (/dev/dxg), an AMD GPU through ROCm (/dev/kfd).
NVIDIA_GLOB = "/dev/nvidia[0-9]*"
OTHER_GPU_DEVICES = ("/dev/dxg", "/dev/kfd")


def tpu_vm() -> bool:
    """True on a TPU VM: one of its accelerator device files exists."""
    return any(os.path.exists(p) for p in TPU_DEVICES)


def tpu_named() -> bool:
    """True when the environment names a TPU (TPU_NAME), as a TPU node's host does."""
    return bool(os.environ.get("TPU_NAME"))


def tpu_reachable(tpu: str = "") -> bool:
    """True when a TPU was named (runtime.tpu or TPU_NAME) or this is a TPU VM."""
    return bool(tpu) or tpu_named() or tpu_vm()


def gpu_devices_present() -> bool:
    """True when a GPU device file exists, whatever CUDA_VISIBLE_DEVICES says."""
    return bool(glob.glob(NVIDIA_GLOB)) or any(os.path.exists(p) for p in OTHER_GPU_DEVICES)


def gpus_hidden() -> bool:
    """True when CUDA_VISIBLE_DEVICES hides every GPU ('' or '-1')."""
    return os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")


def gpu_visible() -> bool:
    """True when this process can see a GPU: a device file exists and CUDA does not hide it."""
    return gpu_devices_present() and not gpus_hidden()


# CUDA_VISIBLE_DEVICES names GPUs by index or by UUID ("GPU-8932f937-...", a MIG instance
# "MIG-...", or the older "MIG-GPU-<uuid>/<gi>/<ci>"); CUDA stops at the first entry it cannot read
# (the CUDA C Programming Guide, "CUDA Environment Variables"). A UUID is kept as given, so that a
# worker is pinned to it the same way (study/workers.py).
UUID_PREFIXES = ("GPU-", "MIG-")


def gpu_ids() -> list[int | str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set (indices as ints, UUIDs as
    strings, up to the first entry CUDA would stop at), else the /dev/nvidiaN devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids: list[int | str] = []
        for v in (v.strip() for v in visible.split(",")):
            if v.isdigit():
                ids.append(int(v))
            elif v.startswith(UUID_PREFIXES):
                ids.append(v)
            else:  # '-1', '' or a typo: CUDA sees nothing from here on
                break
        return ids
    return sorted(int(p[len("/dev/nvidia") :]) for p in glob.glob(NVIDIA_GLOB))


def gpu_memory_bytes(gpu: int | str | None = None, run=None) -> tuple[int | None, str]:
    """The total memory of GPU `gpu` (an index or UUID as CUDA_VISIBLE_DEVICES gives it; None: the
    first GPU this process sees) as NVML reports it through `nvidia-smi --query-gpu=memory.total`
    (MiB), and where the figure comes from; (None, why) when it cannot be read. nvidia-smi ships
    with NVIDIA's driver and, unlike CUDA, ignores CUDA_VISIBLE_DEVICES: the GPU is named with -i.
    A MIG instance is refused: memory.total is its whole GPU's, not the instance's."""
    if gpu is None:
        ids = gpu_ids()
        gpu = ids[0] if ids else 0
    if isinstance(gpu, str) and gpu.startswith("MIG-"):
        return None, f"{gpu} is a MIG instance: nvidia-smi's memory.total is its whole GPU's"
    run = run or subprocess.run
    cmd = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", f"-i={gpu}"]
    try:
        out = run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{' '.join(cmd)} failed ({type(e).__name__}: {e})"
    text = (out.stdout or "").strip().splitlines()
    if out.returncode != 0 or not text or not text[0].strip().isdigit():
        why = (out.stderr or out.stdout or "no output").strip().splitlines()
        return None, f"{' '.join(cmd)} gave no memory.total ({why[0] if why else 'no output'})"
    return int(text[0].strip()) * 2**20, f"nvidia-smi memory.total of GPU {gpu}"


def cpu_cores() -> list[int]:
    """The cores this process may run on (a container or taskset may allow fewer than exist)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity API
        return list(range(os.cpu_count() or 1))
