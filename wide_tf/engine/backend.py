"""Owns the choice of Keras's backend for this process: runtime.backend ('tensorflow' or 'jax') into
KERAS_BACKEND before Keras is first imported (Keras reads it once, at import). Imports neither
Keras nor TensorFlow; the command line and the worker entry point call `select` first."""

from __future__ import annotations

import os
import sys

from wide_tf.schema.problems import RuntimeProblem


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
