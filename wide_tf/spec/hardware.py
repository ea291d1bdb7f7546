"""Owns what this machine has, seen without TensorFlow: a TPU VM, GPUs and the usable CPU cores.

One home for the probes that the config checks, the strategy, the worker planner and main's log
level all make, so that a new accelerator's device file is added once. Reading /dev and the
environment only: starting TensorFlow to ask would cost seconds and, on a GPU, claim its memory.
"""

from __future__ import annotations

import glob
import os

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


def gpu_ids() -> list[int]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the /dev/nvidiaN
    devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return [int(v) for v in ids if v.isdigit()]
    return sorted(int(p[len("/dev/nvidia") :]) for p in glob.glob(NVIDIA_GLOB))


def cpu_cores() -> list[int]:
    """The cores this process may run on (a container or taskset may allow fewer than exist)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity API
        return list(range(os.cpu_count() or 1))
