"""Owns where a result came from: the package's version and git commit (and whether its tree was
dirty), the command line, the Python/TensorFlow/Keras/NumPy versions, the CPU (model and the
instruction sets TensorFlow's kernels pick from), the accelerator and the environment variables
that change the arithmetic. Read without TensorFlow (package metadata, /proc, git), once per
process; config.json, every result.json, the report's protocol table and the TensorBoard HParams
carry it (docs/results/digits_mlp.md says why: two machines' numbers differ in the last digits)."""

from __future__ import annotations

import functools
import glob
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata

from wide_tf.schema import hardware

# The environment variable through which the first process hands its command line to the
# processes it starts (the --workers=N workers, a suite's studies): their records name the user's
# command, not the worker's.
COMMAND_ENV = "WIDE_TF_COMMAND"
# The CPU flags of /proc/cpuinfo that decide which kernels oneDNN and Eigen run (and so the last
# digits of a float sum): vector width and the matrix units.
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Environment variables that change what TensorFlow computes or where (recorded when set).
ENV_VARS = (
    "TF_ENABLE_ONEDNN_OPTS",
    # oneDNN's instruction-set cap: AVX2 here changes float32 matmul results on an AVX-512 CPU
    # (docs/results/digits_mlp.md, "How much the numbers move between machines").
    "ONEDNN_MAX_CPU_ISA",
    "TF_XLA_FLAGS",
    "XLA_FLAGS",
    "TF_DETERMINISTIC_OPS",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)
PACKAGES = ("tensorflow", "keras", "numpy")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_line(argv=None) -> str:
    """The command that started this study: the first process's (COMMAND_ENV), else `argv`,
    with main.py's path shown as `python -m wide_tf.main`."""
    inherited = os.environ.get(COMMAND_ENV)
    if inherited and argv is None:
        return inherited
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(os.path.join("wide_tf", "main.py")):
        args = ["python", "-m", "wide_tf.main", *args[1:]]
    return shlex.join(args)


def child_env() -> dict[str, str]:
    """What a process adds to the environment of the processes it starts (workers, a suite's
    studies) so that their records name the user's command, not their own."""
    return {COMMAND_ENV: command_line()}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", _PACKAGE_DIR, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


@functools.lru_cache(maxsize=1)
def code() -> dict:
    """The package: version, git commit and whether tracked files differ from it (None for both
    outside a git checkout, e.g. a wheel install)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "version": getattr(sys.modules.get("wide_tf"), "__version__", None),
        "commit": commit or None,
        "dirty": None if status is None else bool(status),
    }


def _version(name: str) -> str | None:
    """The module's own version where it is loaded (TensorFlow also comes as tensorflow-cpu or
    tensorflow-tpu), else the installed distribution's, else None."""
    loaded = getattr(sys.modules.get(name), "__version__", None)
    if loaded:
        return str(loaded)
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str | None, list[str]]:
    """The CPU's model name and the CPU_FLAGS it has (from the first processor's entry)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return platform.processor() or None, []
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, [f for f in CPU_FLAGS if f in flags]


def accelerator() -> str:
    """What accelerator this machine has, seen without TensorFlow: the GPUs' names (NVIDIA's
    driver lists them under /proc), a TPU VM or a named TPU, else 'none'."""
    if hardware.tpu_vm():
        return "TPU VM"
    if hardware.tpu_named():
        return f"TPU {os.environ.get('TPU_NAME')}"
    if hardware.gpu_devices_present():
        names = []
        for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
            with open(info) as f:
                names += [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("Model:")]
        hidden = " (hidden: CUDA_VISIBLE_DEVICES)" if hardware.gpus_hidden() else ""
        return (", ".join(names) or "GPU") + hidden
    return "none"


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """This machine: OS, CPU model, flags and usable cores, the accelerator."""
    model, flags = _cpuinfo()
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpu_flags": flags,
        "cpu_cores": len(hardware.cpu_cores()),
        "accelerator": accelerator(),
    }


def collect(argv=None) -> dict:
    """The provenance of what this process writes now (a JSON object)."""
    return {
        "wide_tf": code(),
        "command": command_line(argv),
        "python": platform.python_version(),
        **{name: _version(name) for name in PACKAGES},
        "machine": machine(),
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
        **_frozen(),
    }


# A run of a frozen design exports its stamp here (wide_tf/analysis/frozen.py): the design's hash,
# date, margin and simulated power and size, as JSON.
FROZEN_ENV = "WIDE_TF_FROZEN"


def frozen_stamp() -> dict | None:
    """The frozen design's stamp of this process's run (None: not one, or a damaged variable)."""
    text = os.environ.get(FROZEN_ENV)
    if not text:
        return None
    try:
        s = json.loads(text)
    except ValueError:
        return None
    return s if isinstance(s, dict) and s.get("hash") else None


def _frozen() -> dict:
    """{"frozen": the stamp} in a run of a frozen design, else {} (older records: no key)."""
    s = frozen_stamp()
    return {"frozen": s} if s else {}


def summary(p: dict) -> dict[str, str]:
    """A provenance dict as a few readable rows (the report's protocol table, TensorBoard's
    HParams): {label: text}."""
    code_ = p.get("wide_tf") or {}
    m = p.get("machine") or {}
    commit = code_.get("commit")
    commit_text = (
        "no git checkout"
        if not commit
        else commit[:12] + (" (tree modified)" if code_.get("dirty") else "")
    )
    env = p.get("env") or {}
    return {
        "wide_tf": f"{code_.get('version')} at {commit_text}",
        "command": str(p.get("command")),
        "versions": ", ".join(
            f"{label} {p.get(key)}"
            for label, key in (
                ("Python", "python"),
                ("TensorFlow", "tensorflow"),
                ("Keras", "keras"),
                ("NumPy", "numpy"),
            )
        ),
        "machine": (
            f"{m.get('cpu')} ({m.get('cpu_cores')} cores; "
            f"{' '.join(m.get('cpu_flags') or []) or 'no AVX flags'}); "
            f"accelerator {m.get('accelerator')}"
        ),
        "env": ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none set",
    }
