"""Owns the on-disk layout of a study's workdir and the atomic writes into it (through tf.io.gfile,
so gs:// paths work on a TPU VM)."""

from __future__ import annotations

import json
import os
import uuid

import tensorflow as tf

CONFIG = "config.json"
RESULTS = "results.jsonl"
TRIALS = "trials"
REPORT = "report"
RESULT = "result.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"


def join(*parts: str) -> str:
    return os.path.join(*parts)


def trial_dir(workdir: str, trial_id: str) -> str:
    return join(workdir, TRIALS, trial_id)


def write_text_atomic(path: str, text: str) -> None:
    """Writes to a temporary sibling and renames it over `path`: readers never see half a file."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_json(path: str, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def read_json(path: str):
    with tf.io.gfile.GFile(path, "r") as f:
        return json.load(f)


def _jsonable(obj):
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps_line(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=_jsonable)


def read_jsonl(path: str) -> list[dict]:
    """Every complete JSON line of `path` (a torn last line, from a crash mid-write, is skipped)."""
    if not tf.io.gfile.exists(path):
        return []
    out = []
    with tf.io.gfile.GFile(path, "r") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def append_result(workdir: str, record: dict) -> None:
    """Appends one line to results.jsonl atomically.

    gfile cannot append on GCS, so the whole file is rewritten through a rename; a lock file on
    local disks keeps two local processes (shards) from losing each other's lines. Results are
    deduplicated by trial id, so a trial that two shards both finished is recorded once."""
    path = join(workdir, RESULTS)
    with _Lock(path + ".lock"):
        records = read_jsonl(path)
        if any(r.get("trial_id") == record["trial_id"] for r in records):
            return
        records.append(record)
        write_text_atomic(path, "".join(dumps_line(r) + "\n" for r in records))


class _Lock:
    """An exclusive lock file (local paths only; on GCS the rename is the only guard)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = None

    def __enter__(self):
        if "://" in self.path:
            return self
        import fcntl

        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
        return False
