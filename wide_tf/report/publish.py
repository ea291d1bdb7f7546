"""Owns how a report lands in WORKDIR/report/: one writer at a time, never torn.

Each writer builds its whole report in its own temporary sibling folder
(WORKDIR/.report.tmp-<host>-<pid>-<random>), so two writers at once (the shards of the
several-machines mode, or `python -m wide_tf.report` during a study) never write into one folder:
before, they left every HParams entry twice, or "Directory not empty" and 17 of 42 files. The
finished folder is then swapped into place under WORKDIR/report.lock: the old report is renamed
aside, the new one renamed to report/, the old one deleted. The lock is held for the swap only
(milliseconds on a local disk), so a second writer waits for the first one's swap, not its whole
report; the last writer's report stays, whole.

What holds where:
  * local paths: the lock is created with its content at once (written to a temporary file, then
    `os.link`ed to its name, which fails if the name exists), and folder renames are atomic: a
    reader sees the old report or the new one (or, for the microseconds between the two renames,
    none), and a writer killed at any point leaves the previous report whole.
  * gs://: tf.io.gfile has no create-if-absent, so the lock is best effort (written only when
    absent, then read back after a pause to check that it is still this writer's): two writers
    whose swaps start within that pause of each other could still both swap. A rename of a folder
    is a copy of each object and a delete, not atomic: while it runs (seconds) a reader may see
    part of the new report, and a writer killed during it leaves a partial report/ that the next
    report replaces. Two writers' files are never mixed in one folder either way.

A lock is stale, and taken over, when its holder is on this host and its process is gone, or when
it was taken more than LOCK_STALE_S ago or that far in the future (a clock skew between hosts
sharing a gs:// workdir must not make it last forever); a writer that waits LOCK_WAIT_S for a live
holder stops with one line naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid

import tensorflow as tf

from wide_tf.report.protocol import ReportError
from wide_tf.store import claims, remove
from wide_tf.store import workdir as wd

LOCK = "report.lock"
TMP_PREFIX = ".report.tmp-"  # + <host>-<pid>-<random>: a writer's folder while it writes
OLD_PREFIX = ".report.old-"  # the previous report while the new one is renamed into place
# The theory check (wide_tf/theory/runner.py) writes theory.{md,csv,png} into WORKDIR/report/ as
# well; a report written over its workdir keeps them, as it did before the swap.
KEEP_PREFIXES = ("theory.",)
LOCK_STALE_S = 300.0  # a swap takes milliseconds locally, seconds to a minute on GCS
LOCK_WAIT_S = 900.0
POLL_S = 0.2
GCS_SETTLE_S = 1.0  # gs://: the pause before reading the lock back


def new_tmpdir(workdir: str) -> str:
    """A fresh, empty folder for one writer's report, beside WORKDIR/report/."""
    name = f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = wd.join(workdir, name)
    tf.io.gfile.makedirs(path)
    return path


def publish(workdir: str, tmpdir: str, wait_s: float = LOCK_WAIT_S) -> str:
    """Swaps the finished report in `tmpdir` into WORKDIR/report/ under the lock; returns it."""
    outdir = wd.join(workdir, wd.REPORT)
    refuse_link(outdir)
    with report_lock(workdir, wait_s):
        refuse_link(outdir)  # checked again under the lock: it may have been planted meanwhile
        old = None
        if tf.io.gfile.isdir(outdir):
            _keep_foreign(outdir, tmpdir)
            old = wd.join(workdir, f"{OLD_PREFIX}{uuid.uuid4().hex[:8]}")
            tf.io.gfile.rename(outdir, old)
        tf.io.gfile.rename(tmpdir, outdir)
        _clean(workdir)
    return outdir


def refuse_link(outdir: str) -> None:
    """Raises ReportError when WORKDIR/report is a symbolic link: the swap would rename the link
    aside and the clean-up after it delete the link only, but a report is not written into a
    folder elsewhere that a link in the workdir names."""
    if remove.is_link(outdir):
        raise ReportError(
            f"{outdir} is a symbolic link (to {os.readlink(outdir)}), not a folder of this "
            f"workdir; nothing was written or deleted: remove the link (its target stays) and run "
            f"the report again"
        )


def discard(tmpdir: str) -> None:
    """Removes a writer's unfinished folder (the writer failed), or a folder set aside, never
    through a link (store/remove.py); the report stays as it was."""
    with contextlib.suppress(tf.errors.OpError, OSError):
        remove.remove_tree(tmpdir)


def _keep_foreign(outdir: str, tmpdir: str) -> None:
    for name in tf.io.gfile.listdir(outdir):
        name = name.rstrip("/")
        src, dst = wd.join(outdir, name), wd.join(tmpdir, name)
        if name.startswith(KEEP_PREFIXES) and not tf.io.gfile.exists(dst):
            tf.io.gfile.copy(src, dst)


def _clean(workdir: str) -> None:
    """Under the lock: the previous reports set aside (this writer's, or a swap killed between
    its two renames), and the folders of writers on this host that died while writing. A link of
    such a name is unlinked, its target untouched (store/remove.py)."""
    host = socket.gethostname()
    for name in tf.io.gfile.listdir(workdir):
        name = name.rstrip("/")
        dead = False
        if name.startswith(f"{TMP_PREFIX}{host}-"):
            pid = name[len(TMP_PREFIX) + len(host) + 1 :].split("-", 1)[0]
            dead = pid.isdigit() and not claims.pid_alive(int(pid))
        if name.startswith(OLD_PREFIX) or dead:
            discard(wd.join(workdir, name))


@contextlib.contextmanager
def report_lock(workdir: str, wait_s: float = LOCK_WAIT_S, stale_s: float = LOCK_STALE_S):
    """Holds WORKDIR/report.lock for the body of the `with`; raises ReportError after `wait_s`
    seconds of a live holder."""
    path = wd.join(workdir, LOCK)
    body = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "token": uuid.uuid4().hex,
        "time": time.time(),
    }
    deadline = time.monotonic() + wait_s
    while not _try_create(path, body):
        held = _read(path)
        if held is not None and _stale(held, stale_s):
            _remove_stale(path, held)
            continue
        if time.monotonic() > deadline:
            who = f"pid {held.get('pid')} on {held.get('host')}" if held else "unknown"
            raise ReportError(
                f"another report writer ({who}) has held {path} for over {wait_s:.0f} s; wait for "
                f"it to finish, or delete {path} if that process is gone"
            )
        time.sleep(POLL_S)
    try:
        yield
    finally:
        if (_read(path) or {}).get("token") == body["token"]:
            with contextlib.suppress(tf.errors.NotFoundError, FileNotFoundError):
                tf.io.gfile.remove(path)


def _local(path: str) -> bool:
    return "://" not in path


def _try_create(path: str, body: dict) -> bool:
    """Creates the lock with its whole content, only if absent; True when this writer has it."""
    text = json.dumps(body, sort_keys=True)
    if _local(path):
        tmp = f"{path}.tmp-{body['token'][:8]}"
        with open(tmp, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)  # fails if the lock exists: create-if-absent, content and all
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(tmp)
    if tf.io.gfile.exists(path):
        return False
    with tf.io.gfile.GFile(path, "w") as f:  # a GCS object appears whole, on close
        f.write(text)
    time.sleep(GCS_SETTLE_S)  # a writer that raced us has overwritten it by now
    return (_read(path) or {}).get("token") == body["token"]


def _read(path: str) -> dict | None:
    """The lock's body; {} when it exists but cannot be read as one; None when absent."""
    try:
        text = wd.read_checked(path)  # a FIFO or a huge file planted as the lock is not waited on
    except (tf.errors.NotFoundError, FileNotFoundError):
        return None
    except wd.NotARegularFile:
        return {}
    try:
        body = wd.loads_checked(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


def _stale(held: dict, stale_s: float) -> bool:
    if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int):
        if not claims.pid_alive(held["pid"]):
            return True
    taken = held.get("time")
    if not isinstance(taken, (int, float)):
        return True  # not a lock this code wrote (it writes whole ones): nobody relies on it
    return abs(time.time() - taken) > stale_s


def _remove_stale(path: str, held: dict) -> None:
    """Removes the stale lock `held`, and only it: a writer that took the lock since it was read
    keeps its own (locally the lock is renamed aside first, and put back if it is not `held`)."""
    if not _local(path):
        if _read(path) == held:
            with contextlib.suppress(tf.errors.NotFoundError):
                tf.io.gfile.remove(path)
        return
    aside = f"{path}.stale-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another writer removed it first
    if _read(aside) != held:  # a fresh lock taken in between: give it back
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    os.remove(aside)
