"""Owns the registry of backends (runtime.backend's name -> the folder under engine/ that runs it)
and the choice of Keras's backend for this process: runtime.backend ('tensorflow' or 'jax') into
KERAS_BACKEND before Keras is first imported (Keras reads it once, at import). Imports neither
Keras nor TensorFlow, nor a backend folder until `load` is called; the command line and the worker
entry point call `select` first."""

from __future__ import annotations

import importlib
import os
import sys

from wide_tf.schema.problems import RuntimeProblem

# runtime.backend -> its folder under engine/. Each folder's run.py offers the same five names:
# setup_runtime, device_cap, is_chief, make and clear_cache (engine/train.py calls nothing else).
# A folder may also offer cohort.py (`make`: several runs' training calls as one; `cohort` below).
FOLDERS = {"tensorflow": "tf", "jax": "jax"}


class BackendError(RuntimeProblem):
    """Keras is already running under another backend in this process."""


def of(config) -> str:
    """The backend a config asks for (configs written before the field: TensorFlow)."""
    runtime = config.get("runtime") if hasattr(config, "get") else None
    return str((runtime or {}).get("backend", "tensorflow") or "tensorflow")


def select(config) -> str:
    """Sets KERAS_BACKEND for this process (and the processes it starts) to the config's
    backend; returns it. Refuses (BackendError, one line) when Keras was already imported with
    another: a process runs one backend."""
    name = of(config)
    keras = sys.modules.get("keras")
    if keras is not None:
        running = keras.backend.backend()
        if running != name:
            raise BackendError(
                f"runtime.backend={name!r}, but Keras already runs on {running!r} in this process; "
                f"start a new process (KERAS_BACKEND is read once, when Keras is imported)"
            )
    os.environ["KERAS_BACKEND"] = name
    return name


def _module_name(name: str) -> str:
    if name not in FOLDERS:
        raise BackendError(f"runtime.backend={name!r} is not one of {sorted(FOLDERS)}")
    return f"wide_tf.engine.{FOLDERS[name]}.run"


def load(name: str):
    """The run module of backend `name` (imported here, on first use: a backend's folder loads
    its framework, which a process of the other backend never imports)."""
    return importlib.import_module(_module_name(name))


def cohort(name: str):
    """The cohort module of backend `name` (its `make(trainers)`: the runs' shared training call,
    engine/cohort.py); BackendError where the backend trains one run at a time only."""
    module = f"{_module_name(name).rsplit('.', 1)[0]}.cohort"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise BackendError(
            f"runtime.backend={name!r} trains one run at a time; runtime.cohort > 1 needs "
            f"runtime.backend='jax'"
        ) from None


def loaded() -> list:
    """The run modules of the backends this process has already imported."""
    return [sys.modules[m] for m in map(_module_name, FOLDERS) if m in sys.modules]
