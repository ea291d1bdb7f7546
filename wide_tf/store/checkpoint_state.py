"""Owns which TensorFlow checkpoints finished: the steps tf.train.CheckpointManager's state file
names. Read as text, without TensorFlow, so that the checks before TensorFlow is imported
(checks/preflight.py) and the restore (engine/restore.py) apply one rule."""

from __future__ import annotations

import re

from wide_tf.store import workdir as wd

# tf.train.CheckpointManager's state file: text protobuf, written atomically after a save's own
# files are whole, naming each kept checkpoint as `all_model_checkpoint_paths: "<path>"`. Read
# here as text so that the checks before TensorFlow is imported (checks/preflight.py) apply the
# same rule as the restore.
_STATE_FILE = "checkpoint"
_STATE_ENTRY = re.compile(r'^all_model_checkpoint_paths:\s*"(?:.*/)?ckpt-(\d+)"\s*$', re.M)


def committed_steps(directory: str) -> set[int]:
    """The steps whose TensorFlow checkpoint finished: those the state file names (none where
    there is no state file, or it does not read)."""
    try:
        text = wd.read_checked(wd.join(directory, _STATE_FILE)).decode()
    except (*wd.read_errors(), OSError, ValueError):
        return set()
    return {int(step) for step in _STATE_ENTRY.findall(text)}
