"""Owns starting TensorFlow quietly: its C++ start-up lines are kept out of the output unless
TF_CPP_MIN_LOG_LEVEL (or --verbose) asks for them, and the checkpoint saver's chatter is dropped
from the absl log."""

from __future__ import annotations

import logging as std_logging
import os
import re
import sys
import tempfile

# Whether the user chose TensorFlow's C++ log level; if not, `import_tensorflow` picks one before
# the import. Read when main imports this module, before anything here sets it. An empty value
# (`TF_CPP_MIN_LOG_LEVEL= python ...`, an unset shell variable exported) chooses nothing: TensorFlow
# would read it as 0 and print its start-up lines.
_USER_TF_LOG_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() or None


class DropCheckpointChatter(std_logging.Filter):
    """TensorFlow's checkpoint saver logs one INFO line per save through absl, between the
    progress lines."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Sharding callback duration")


def tf_noise(line: str, level: int) -> bool:
    """True for a C++ start-up line that TF_CPP_MIN_LOG_LEVEL=level means to hide but that
    TensorFlow writes before its logging honours it (oneDNN, cudart stub, CPU feature guard).
    A line from Python code (absl's format names a .py source) is never one: this process's own
    log lines may be written while the import runs in another thread (study/workers.py)."""
    m = re.match(r"^([IWEF])\d{4} [\d:.]+\s+\d+\s+(\S+):\d+\]", line)
    if m and m.group(2).endswith(".py"):
        return False
    if m:
        return "IWEF".index(m.group(1)) < level
    if line.startswith("WARNING: All log messages before absl::InitializeLog()"):
        return level >= 1
    return line.startswith("To enable the following instructions:") and level >= 1


def installed() -> bool:
    """Whether TensorFlow can be imported here (the JAX backend's machines may lack it)."""
    import importlib.util

    return "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is not None


def import_tensorflow(verbose: bool) -> None:
    """Imports TensorFlow once, keeping its C++ start-up lines out of the output.

    If the user set TF_CPP_MIN_LOG_LEVEL it is kept. Otherwise it becomes 3 on a machine without a
    GPU (CUDA's 'failed call to cuInit' is an ERROR line there, and means nothing) and 2 elsewhere.
    The lines TensorFlow writes at import before its logging starts ignore the level; they are
    caught on file descriptor 2 during the import and only the ones the level keeps are shown."""
    if "tensorflow" in sys.modules or verbose:
        import tensorflow

        return
    if _USER_TF_LOG_LEVEL is None:
        from wide_tf.schema import hardware

        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2" if hardware.gpu_devices_present() else "3"
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        level = 0
    if level <= 0:
        import tensorflow

        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
            kept = [ln for ln in text.splitlines() if not tf_noise(ln, level)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)
