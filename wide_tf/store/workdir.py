"""Owns the on-disk layout of a study's workdir and the atomic writes into it: a gs:// (or any
other scheme's) path through tf.io.gfile, so that it works on a TPU VM; a local path through os,
without TensorFlow, so that the parent of --workers=N supervises a local study without importing
it (TensorFlow is imported here only when a path with a scheme is first touched)."""

from __future__ import annotations

import glob
import json
import os
import re
import stat
import sys
import time
import uuid

from wide_tf.schema import result_fields

CONFIG = "config.json"
RESULTS_DIR = "results"  # one <trial_id>.json per finished trial
TRIALS = "trials"
REPORT = "report"
RESULT = "result.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
# What a file read from a workdir may be: a regular file of at most this size (a FIFO blocks the
# reader forever, a device or a huge file exhausts memory), and JSON nested at most this deep
# (Python's parser recurses: a 200k-deep file raised RecursionError).
MAX_JSON_BYTES = 64 << 20  # a result record with its curves is under 1 MB
MAX_FILE_BYTES = 64 << 30  # a checkpoint (.npz): the largest model's weights and optimizer state
MAX_JSON_DEPTH = 100  # a config or record nests under 10 levels
# With --workers=N also claims/ (claims.CLAIMS_DIR) and logs/ (workers.LOGS), named in those
# TensorFlow-free modules: validate reaches claims before TensorFlow starts.


class _LocalFiles:
    """The tf.io.gfile calls this module makes, for a local path, through os."""

    @staticmethod
    def GFile(path: str, mode: str):  # noqa: N802  (tf.io.gfile's name)
        return open(path, mode) if "b" in mode else open(path, mode, encoding="utf-8")

    exists = staticmethod(os.path.exists)
    isdir = staticmethod(os.path.isdir)
    listdir = staticmethod(os.listdir)
    glob = staticmethod(glob.glob)

    @staticmethod
    def makedirs(path: str) -> None:
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def rename(src: str, dst: str, overwrite: bool = False) -> None:
        if not overwrite and os.path.exists(dst):
            raise FileExistsError(dst)
        os.replace(src, dst)


def _fs(path: str):
    """tf.io.gfile for a path with a scheme (gs://), else the os-based stand-in."""
    if "://" not in path:
        return _LocalFiles
    import tensorflow as tf  # only here: a local workdir is read and written without it

    return tf.io.gfile


def _tf_error(name: str) -> tuple[type[BaseException], ...]:
    """TensorFlow's error class `name` once TensorFlow is loaded, else nothing. A module another
    thread is still importing (the parent's import for the report runs beside a study's last
    groups: study/workers.py) lacks its attributes: nothing then, and gfile raised nothing yet."""
    cls = getattr(getattr(sys.modules.get("tensorflow"), "errors", None), name, None)
    return () if cls is None else (cls,)


def _not_found() -> tuple[type[BaseException], ...]:
    """A missing file's exceptions: TensorFlow's as well once it is loaded (gfile raises it)."""
    return (FileNotFoundError, *_tf_error("NotFoundError"))


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a file may raise besides bad JSON: OSError, and gfile's OpError."""
    return (OSError, *_tf_error("OpError"))


def join(*parts: str) -> str:
    return os.path.join(*parts)


def exists(path: str) -> bool:
    return bool(_fs(path).exists(path))


def makedirs(path: str) -> None:
    _fs(path).makedirs(path)


def trial_dir(workdir: str, trial_id: str) -> str:
    return join(workdir, TRIALS, trial_id)


def write_text_atomic(path: str, text: str) -> None:
    """Writes to a temporary sibling and renames it over `path`: readers never see half a file."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    fs = _fs(path)
    with fs.GFile(tmp, "w") as f:
        f.write(text)
    fs.rename(tmp, path, overwrite=True)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """write_text_atomic for bytes (the JAX backend's checkpoints)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    fs = _fs(path)
    with fs.GFile(tmp, "wb") as f:
        f.write(data)
    fs.rename(tmp, path, overwrite=True)


class NotARegularFile(OSError):
    """A workdir file that is a FIFO, a device, a folder or over its size limit: not read. An
    OSError, so that every reader that skips an unreadable file skips this one too; `strerror`
    says what it is (unreadable() shows it)."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path} is {what}; nothing reads it: move it aside")
        self.strerror, self.filename = what, path

    def __str__(self) -> str:
        return self.args[0]


def read_checked(path: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of `path` after checking that it is a regular file of at most `max_bytes`
    (raises NotARegularFile, FileNotFoundError). The one gate for every file read from a workdir.

    Locally the file is opened without blocking (O_NONBLOCK: opening a FIFO does not wait for a
    writer) and checked through that descriptor, so a file swapped after the check is not read
    either; gs:// has no special files, and its size is read from the object's listing."""
    if "://" in path:
        fs = _fs(path)
        if fs.isdir(path):
            raise NotARegularFile(path, "a folder, not a regular file")
        size = fs.stat(path).length
        _check_size(path, size, max_bytes)
        with fs.GFile(path, "rb") as f:
            return f.read()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path, f"{_kind(info.st_mode)}, not a regular file")
        _check_size(path, info.st_size, max_bytes)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1  # closed with f
            return f.read()  # its size was checked on this descriptor
    finally:
        if fd >= 0:
            os.close(fd)


def check_regular(path: str, max_bytes: int = MAX_FILE_BYTES) -> None:
    """Raises NotARegularFile unless `path` is a regular file of at most `max_bytes` (or a gs://
    object): the check before a file is handed to a reader that opens it itself (TensorFlow's
    checkpoint reader)."""
    if "://" in path:
        fs = _fs(path)
        if fs.isdir(path):
            raise NotARegularFile(path, "a folder, not a regular file")
        _check_size(path, fs.stat(path).length, max_bytes)
        return
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(path, f"{_kind(info.st_mode)}, not a regular file")
    _check_size(path, info.st_size, max_bytes)


def _check_size(path: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise NotARegularFile(
            path,
            f"{size / 2**20:.0f} MiB, over the {max_bytes / 2**20:.0f} MiB a file of its kind "
            f"may be",
        )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def loads_checked(text: str | bytes, path: str = "JSON"):
    """json.loads after refusing a document nested deeper than MAX_JSON_DEPTH (raises
    json.JSONDecodeError, which every reader already treats as "not JSON")."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise json.JSONDecodeError(
            f"nested {depth} levels deep, over the {MAX_JSON_DEPTH} a workdir file may be", text, 0
        )
    return json.loads(text)


def json_depth(text: str) -> int:
    """The deepest nesting of [ and { in a JSON text, strings skipped (linear, no recursion)."""
    depth = deepest = 0
    for ch in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def read_bytes(path: str) -> bytes:
    """A checkpoint's bytes (a regular file of at most MAX_FILE_BYTES)."""
    return read_checked(path, MAX_FILE_BYTES)


def listdir(path: str) -> list[str]:
    """The names in a folder ([] when it does not exist)."""
    fs = _fs(path)
    return sorted(fs.listdir(path)) if fs.exists(path) else []


def rename(src: str, dst: str) -> None:
    """Renames `src` to `dst` (refused when `dst` exists)."""
    _fs(src).rename(src, dst, overwrite=False)


def remove(path: str) -> None:
    fs = _fs(path)
    if fs is _LocalFiles:
        os.remove(path)
    else:
        fs.remove(path)


def write_json(path: str, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def read_json(path: str):
    """A workdir's JSON file, checked (read_checked, loads_checked)."""
    return loads_checked(read_checked(path), path)


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


def result_path(workdir: str, trial_id: str) -> str:
    return join(workdir, RESULTS_DIR, f"{trial_id}.json")


def record_result(workdir: str, result: dict) -> None:
    """Records one finished trial as its own file, WORKDIR/results/<trial_id>.json, written
    atomically (a temporary sibling renamed over it).

    No lock and no read-modify-write: two shards finishing together write two different files,
    which needs nothing of the file system but an atomic rename (also on GCS, through gfile).
    A trial recorded twice (two shards, or a re-run) writes the same name: the last one wins."""
    _fs(workdir).makedirs(join(workdir, RESULTS_DIR))
    write_json(result_path(workdir, result["trial_id"]), result)


def record_problem(rec) -> str:
    """Why `rec` is not a whole result record (schema/result_fields.py); empty when it is."""
    if not isinstance(rec, dict):
        return f"holds {type(rec).__name__}, not a result record"
    problems = result_fields.problems(rec)
    if not problems:
        return ""
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "not a whole result (" + "; ".join(problems[:3]) + more + ")"


def _load(path: str):
    return read_json(path)


def unreadable(e: BaseException) -> str:
    """The warning's tail for a results/ entry that cannot be read (a folder named
    <id>.json, or a file without read permission, stopped every worker)."""
    why = getattr(e, "strerror", None) or getattr(e, "message", None) or type(e).__name__
    return (
        f"cannot be read ({why}): skipped, its trial counts as not recorded; move it aside or "
        "fix its permissions"
    )


def set_aside_partial(workdir: str) -> list[str]:
    """Moves every results/<id>.json and trials/<id>/result.json that is not a whole record to
    `<name>.partial-<time>` (kept for a look, no longer read), so that its trial counts as not
    done and runs again (resuming from its checkpoint); returns one line per file moved."""
    paths, fs = [], _fs(workdir)
    folder = join(workdir, RESULTS_DIR)
    if fs.isdir(folder):
        paths += [join(folder, n) for n in fs.listdir(folder) if n.endswith(".json")]
    paths += fs.glob(join(workdir, TRIALS, "*", RESULT))
    lines = []
    for path in sorted(paths):
        try:
            why = record_problem(_load(path))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            why = f"not JSON ({type(e).__name__})"
        except _not_found():
            continue  # moved or replaced meanwhile
        except read_errors() as e:  # a folder, no permission: not a record, and not ours to move
            lines.append(f"{path} {unreadable(e)}")
            continue
        if why:
            aside = f"{path}.partial-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
            try:
                fs.rename(path, aside, overwrite=True)
            except _not_found():  # another process moved it first
                continue
            lines.append(f"{path} is {why}: moved to {aside}; its trial runs again")
    return lines


def read_results_counted(
    workdir: str, whole: bool = False, cache: dict | None = None
) -> tuple[list[dict], int]:
    """(every recorded result, number of unreadable ones skipped). `whole`: also skip (and count)
    a record that is not whole against schema/result_fields.py (the scheduler's view: such a
    trial is not done). `cache` (file name -> record, or None for a bad one; the caller keeps it
    between calls): a results/ file is written once, whole (record_result), so a name seen before
    is not read again; a study's scheduler reads the results after every round of every group,
    and reading all of them each time cost a third of a local study's time.

    Reads WORKDIR/results/*.json. An unreadable or partial file, or a record without a trial_id,
    is skipped and counted, never fatal. Sorted by trial id, so the order does not depend on the
    listing."""
    by_id: dict = {}
    bad, fs = 0, _fs(workdir)
    folder = join(workdir, RESULTS_DIR)
    names = fs.listdir(folder) if fs.isdir(folder) else []
    for name in sorted(names):
        if not name.endswith(".json"):  # a writer's temporary file (`.json.tmp-...`)
            continue
        if cache is not None and name in cache:
            rec = cache[name]
        else:
            rec = _read_record(join(folder, name), whole)
            if cache is not None:
                cache[name] = rec
        if rec is None:
            bad += 1
            continue
        by_id[rec["trial_id"]] = rec
    return [by_id[k] for k in sorted(by_id)], bad


def _read_record(path: str, whole: bool) -> dict | None:
    """One results/ file's record; None when it is unreadable, partial or (`whole`) not whole."""
    try:
        rec = _load(path)
    except (json.JSONDecodeError, UnicodeDecodeError, *read_errors()):
        return None
    if not isinstance(rec, dict) or "trial_id" not in rec or (whole and record_problem(rec)):
        return None
    return rec


def read_results(workdir: str, whole: bool = False) -> list[dict]:
    """Every recorded result of the study in `workdir` (see `read_results_counted`)."""
    return read_results_counted(workdir, whole)[0]
