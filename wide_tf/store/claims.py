"""Owns the claims through which worker processes (on one machine or several) share a study's
(member, batch size) groups: a claim is a file WORKDIR/claims/<group>.<epoch>.json that exactly one
worker can create, kept alive by a heartbeat and taken over when its owner has died.

Why epochs: taking over a dead owner's claim must itself be atomic. Deleting or renaming the old
file and then creating a new one lets two workers that both judged it dead each remove the other's
fresh claim. Instead the claim of a group is the file with the highest epoch, and a takeover
creates epoch k + 1 with the same create-if-absent as the first claim: of two workers that race,
exactly one creates it. An owner that finds a higher epoch than its own has lost the group.

Create-if-absent per store:
  * local paths: `os.open(O_CREAT | O_EXCL)`, atomic on POSIX file systems (NFS >= v3 too).
  * gs://: `tf.io.gfile` has no create-if-absent on GCS (it writes unconditionally), so claims go
    through google-cloud-storage with the generation precondition `if_generation_match=0` ("create
    only if no live object has this name"), which GCS evaluates atomically. Without that library a
    gs:// study with several workers is refused in one line rather than left to race.
  * any other scheme: refused with several workers (no atomic create is known for it).

A claim's body (JSON): owner (a unique id per worker process), run (the id of the parent that
started the worker, so siblings recognise each other), host, pid, epoch, state ("running", "done",
"stopped" (its owner left after SIGTERM: free at once) or "failed"), updated (time.time() of the
last heartbeat). It is stale, and may be taken over, when its owner is on this host and its pid is
gone, or when its heartbeat is older than `stale_s` (any host; clocks of machines sharing a
workdir must agree to well within that). A "failed" claim (the owner's trial raised) is not
retried by the owner's siblings, who would fail the same way; a later run (another run id) does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import threading
import time
import uuid

CLAIMS_DIR = "claims"
RUNNING, DONE, FAILED, STOPPED = "running", "done", "failed", "stopped"
# Heartbeat period and staleness timeout. A heartbeat comes from a background thread, so a long
# trial does not delay it; the timeout allows for a heavily loaded machine or a slow bucket.
HEARTBEAT_S = 10.0
STALE_S = 120.0


class ClaimError(RuntimeError):
    """Claims cannot be made on this workdir; the message says what to do."""


def group_key(group: tuple[str, int]) -> str:
    """A file-name-safe name of a (member, batch size) group."""
    member, batch = group
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', member)}_b{int(batch)}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this machine holds `pid` (a claim's or the report lock's holder)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds the pid: alive
        return True
    return True


@dataclasses.dataclass
class Claim:
    key: str
    epoch: int
    body: dict

    def stale(self, now: float | None = None, stale_s: float = STALE_S) -> bool:
        b = self.body
        if b.get("state") == DONE:
            return False
        if b.get("host") == socket.gethostname() and isinstance(b.get("pid"), int):
            if not pid_alive(b["pid"]):
                return True
        updated = b.get("updated")
        if not isinstance(updated, (int, float)):
            return True  # unreadable (a torn write): nobody can be relying on it
        return (time.time() if now is None else now) - updated > stale_s


class _LocalStore:
    """Claims in a local folder."""

    def __init__(self, folder: str):
        self.folder = folder

    def create(self, name: str, text: str) -> bool:
        os.makedirs(self.folder, exist_ok=True)
        try:
            fd = os.open(os.path.join(self.folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True

    def overwrite(self, name: str, text: str) -> None:
        # Temporary sibling + rename: a reader sees the old body or the new one, never half.
        path = os.path.join(self.folder, name)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def read(self, name: str) -> str | None:
        try:
            with open(os.path.join(self.folder, name)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def list(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.folder) if ".tmp-" not in n]
        except FileNotFoundError:
            return []


class _GcsStore:
    """Claims in a gs:// folder through google-cloud-storage (tf.io.gfile cannot create an object
    only if it is absent): creation uses the precondition if_generation_match=0."""

    def __init__(self, folder: str):
        try:
            from google.api_core import exceptions as gexc
            from google.cloud import storage
        except ImportError:
            raise ClaimError(
                "several workers on a gs:// workdir need google-cloud-storage for atomic claims "
                "(tf.io.gfile cannot create a file only if it is absent on GCS); "
                "pip install google-cloud-storage, or use --workers=1 (with --shard=i/n per "
                "machine)"
            ) from None
        bucket, _, prefix = folder[len("gs://") :].partition("/")
        self.bucket = storage.Client().bucket(bucket)
        self.prefix = prefix.rstrip("/") + "/"
        self._exists = gexc.PreconditionFailed
        self._missing = gexc.NotFound

    def create(self, name: str, text: str) -> bool:
        try:
            self.bucket.blob(self.prefix + name).upload_from_string(text, if_generation_match=0)
        except self._exists:
            return False
        return True

    def overwrite(self, name: str, text: str) -> None:
        self.bucket.blob(self.prefix + name).upload_from_string(text)

    def read(self, name: str) -> str | None:
        try:
            return self.bucket.blob(self.prefix + name).download_as_text()
        except self._missing:
            return None

    def list(self) -> list[str]:
        return [b.name[len(self.prefix) :] for b in self.bucket.list_blobs(prefix=self.prefix)]


def open_store(workdir: str):
    folder = os.path.join(workdir, CLAIMS_DIR)
    if workdir.startswith("gs://"):
        return _GcsStore(folder)
    if "://" in workdir:
        scheme = workdir.split("://", 1)[0]
        raise ClaimError(
            f"several workers need atomic claims, which {scheme}:// does not offer here; "
            "use a local folder or gs://, or --workers=1"
        )
    return _LocalStore(folder)


def check_store(workdir: str) -> None:
    """Raises ClaimError (one line) when claims cannot be made on `workdir`."""
    open_store(workdir)


_NAME = re.compile(r"^(?P<key>.+)\.(?P<epoch>\d+)\.json$")


class Claims:
    """One worker's view of the claims of a study's workdir."""

    def __init__(self, workdir: str, run_id: str, stale_s: float = STALE_S, store=None):
        self.store = store if store is not None else open_store(workdir)
        self.run_id = run_id
        self.owner = uuid.uuid4().hex[:12]
        self.stale_s = stale_s
        self._held: dict[str, Claim] = {}
        self._lock = threading.Lock()

    def _body(self, key: str, epoch: int, state: str) -> dict:
        return {
            "group": key,
            "owner": self.owner,
            "run": self.run_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "epoch": epoch,
            "state": state,
            "updated": time.time(),
        }

    def current(self) -> dict[str, Claim]:
        """The claim of every claimed group: its highest epoch."""
        latest: dict[str, int] = {}
        for name in self.store.list():
            m = _NAME.match(name)
            if m:
                key, epoch = m["key"], int(m["epoch"])
                latest[key] = max(epoch, latest.get(key, -1))
        out = {}
        for key, epoch in latest.items():
            text = self.store.read(f"{key}.{epoch}.json")
            try:
                body = json.loads(text) if text else {}
            except json.JSONDecodeError:
                body = {}
            out[key] = Claim(key, epoch, body if isinstance(body, dict) else {})
        return out

    def available(self, claim: Claim | None) -> bool:
        """Whether this worker may claim a group whose current claim is `claim`."""
        if claim is None:
            return True
        if claim.body.get("owner") == self.owner:
            return False
        if claim.body.get("state") == FAILED:
            return claim.body.get("run") != self.run_id
        if claim.body.get("state") in (DONE, STOPPED):
            # STOPPED: its owner checkpointed and left. DONE with work left: the protocol asked
            # for more runs than when it finished (the rules of lr_grid changed).
            return True
        return claim.stale(stale_s=self.stale_s)

    def failed_here(self, claim: Claim | None) -> bool:
        """Whether `claim` failed in a worker of this run (so this run does not retry it)."""
        return (
            claim is not None
            and claim.body.get("state") == FAILED
            and claim.body.get("run") == self.run_id
        )

    def try_claim(self, key: str, current: Claim | None) -> bool:
        """Creates the next epoch of `key`'s claim; True if this worker won it."""
        epoch = 0 if current is None else current.epoch + 1
        body = self._body(key, epoch, RUNNING)
        if not self.store.create(f"{key}.{epoch}.json", json.dumps(body)):
            return False
        with self._lock:
            self._held[key] = Claim(key, epoch, body)
        return True

    def still_mine(self, key: str) -> bool:
        """False once another worker has taken the group over (a higher epoch exists)."""
        held = self._held.get(key)
        if held is None:
            return False
        names = self.store.list()
        return not any(
            (m := _NAME.match(n)) and m["key"] == key and int(m["epoch"]) > held.epoch
            for n in names
        )

    def release(self, key: str, state: str = DONE) -> None:
        # Under the lock, as the heartbeat writes: a beat must never turn "done" back into
        # "running".
        with self._lock:
            held = self._held.pop(key, None)
            if held is not None:
                body = self._body(key, held.epoch, state)
                self.store.overwrite(f"{key}.{held.epoch}.json", json.dumps(body))

    def heartbeat(self) -> None:
        with self._lock:
            for c in self._held.values():
                body = self._body(c.key, c.epoch, RUNNING)
                self.store.overwrite(f"{c.key}.{c.epoch}.json", json.dumps(body))

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> threading.Event:
        """Refreshes every held claim every `every_s` seconds from a daemon thread (a trial can
        run for far longer than the staleness timeout); set the returned event to stop it."""
        stop = threading.Event()

        def beat():
            while not stop.wait(every_s):
                try:
                    self.heartbeat()
                except Exception:  # a transient store error: the next beat tries again
                    pass

        threading.Thread(target=beat, name="claims-heartbeat", daemon=True).start()
        return stop


class LocalClaims:
    """The claims of a study run by one process (`--workers=1`, `--trial`, a shard): the same
    interface as `Claims`, held in memory, so one process runs the same loop as each of N workers
    and writes no claims/ folder. Nobody else can take a group over or have failed one."""

    def current(self) -> dict[str, Claim]:
        return {}

    def available(self, claim: Claim | None) -> bool:
        return True

    def failed_here(self, claim: Claim | None) -> bool:
        return False

    def try_claim(self, key: str, current: Claim | None) -> bool:
        return True

    def still_mine(self, key: str) -> bool:
        return True

    def release(self, key: str, state: str = DONE) -> None:
        pass

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> threading.Event:
        return threading.Event()  # nothing to keep alive
