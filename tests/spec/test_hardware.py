"""wide_tf.spec.hardware: the TPU, GPU and CPU probes, on a machine faked by monkeypatching."""

import pytest

from wide_tf.spec import hardware


@pytest.fixture
def machine(monkeypatch):
    """A machine with the device files in `files` (a set the test fills) and no accelerator env."""
    files: set[str] = set()
    monkeypatch.setattr(hardware.os.path, "exists", lambda p: p in files)
    monkeypatch.setattr(
        hardware.glob,
        "glob",
        lambda pattern: (
            sorted(f for f in files if f.startswith("/dev/nvidia") and f[11:].isdigit())
            if pattern == hardware.NVIDIA_GLOB
            else []
        ),
    )
    for var in ("TPU_NAME", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    return files


def test_a_tpu_vm_is_seen_by_its_device_files_or_a_name(machine, monkeypatch):
    assert not hardware.tpu_vm() and not hardware.tpu_reachable("")
    assert hardware.tpu_reachable("my-tpu")
    machine.add("/dev/vfio/0")
    assert hardware.tpu_vm() and hardware.tpu_reachable("")
    machine.clear()
    monkeypatch.setenv("TPU_NAME", "node")
    assert hardware.tpu_named() and hardware.tpu_reachable("") and not hardware.tpu_vm()


def test_gpus_are_the_nvidia_devices_unless_cuda_visible_devices_says(machine, monkeypatch):
    assert not hardware.gpu_devices_present() and not hardware.gpu_visible()
    assert hardware.gpu_ids() == []
    machine.update({"/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl"})
    assert hardware.gpu_visible() and hardware.gpu_ids() == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert hardware.gpus_hidden() and not hardware.gpu_visible() and hardware.gpu_ids() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert hardware.gpu_visible() and hardware.gpu_ids() == [3, 5]


def test_wsl_and_rocm_devices_count_as_gpus(machine):
    machine.add("/dev/kfd")
    assert hardware.gpu_visible()
    machine.clear()
    machine.add("/dev/dxg")
    assert hardware.gpu_devices_present()


def test_cpu_cores_follow_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {3, 1}, raising=False)
    assert hardware.cpu_cores() == [1, 3]
    monkeypatch.delattr(hardware.os, "sched_getaffinity")
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 2)
    assert hardware.cpu_cores() == [0, 1]
