"""wide_tf.schema.hardware: the TPU, GPU and CPU probes, on a machine faked by monkeypatching."""

import pytest

from wide_tf.schema import hardware


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


def test_cuda_visible_devices_as_uuids_are_gpus_not_cpu_cores(machine, monkeypatch):
    """UUIDs (GPU-..., MIG-...) were dropped, so a GPU machine fell back to one worker
    per CPU core. CUDA stops at the first entry it cannot read, and so does gpu_ids."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6, MIG-1b2c")
    assert hardware.gpu_ids() == ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "MIG-1b2c"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-abc,-1,3")
    assert hardware.gpu_ids() == [2, "GPU-abc"]
    # The planner: one worker per GPU, each pinned to its UUID (not one per CPU core).
    from wide_tf.checks import loader
    from wide_tf.study import workers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb")
    config = loader.load_config("configs/mlp.py:smoke")
    assert workers.default_workers(config) == 2
    assert [s.gpu for s in workers.plan(2, "r", config)] == ["GPU-aaa", "GPU-bbb"]


class _Smi:
    """A stand-in for subprocess.run of nvidia-smi: records the command, answers `stdout`."""

    def __init__(self, stdout="", returncode=0, error=None):
        self.stdout, self.returncode, self.error, self.calls = stdout, returncode, error, []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        if self.error:
            raise self.error
        return hardware.subprocess.CompletedProcess(cmd, self.returncode, self.stdout, "no GPU")


def test_a_gpus_memory_is_read_from_nvidia_smi_for_the_visible_gpu(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    smi = _Smi("46068\n")
    total, source = hardware.gpu_memory_bytes(run=smi)
    assert total == 46068 * 2**20 and "nvidia-smi memory.total of GPU GPU-abc" == source
    assert smi.calls[0][-1] == "-i=GPU-abc"  # nvidia-smi ignores CUDA_VISIBLE_DEVICES
    assert hardware.gpu_memory_bytes(3, run=_Smi("", returncode=6))[0] is None
    missing = hardware.gpu_memory_bytes(0, run=_Smi(error=FileNotFoundError("nvidia-smi")))
    assert missing[0] is None and "FileNotFoundError" in missing[1]
    mig = hardware.gpu_memory_bytes("MIG-1b2c", run=_Smi("81920\n"))
    assert mig[0] is None and "whole GPU" in mig[1]
