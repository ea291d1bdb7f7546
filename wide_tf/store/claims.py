"""Owns the claims through which worker processes (on one machine or several) share a study's
(member, batch size) groups: a claim is a file WORKDIR/claims/<group>.<epoch>.json that exactly one
worker can create, kept alive by a heartbeat and taken over when its owner has died.

Why epochs: taking over a dead owner's claim must itself be atomic. Deleting or renaming the old
file and then creating a new one lets two workers that both judged it dead each remove the other's
fresh claim. Instead the claim of a group is the file with the highest epoch, and a takeover
creates epoch k + 1 with the same create-if-absent as the first claim: of two workers that race,
exactly one creates it. An owner that finds a higher epoch than its own has lost the group.

Create-if-absent per store, always with the whole body (a reader never sees a claim half written):
  * local paths: the body goes to a temporary sibling, which `os.link` then names (link fails if
    the name exists: atomic on POSIX file systems, NFS >= v3 too); a file system without hard
    links falls back to `O_CREAT | O_EXCL` and a write, where the grace below covers the gap.
  * gs://: `tf.io.gfile` has no create-if-absent on GCS (it writes unconditionally), so claims go
    through google-cloud-storage with the generation precondition `if_generation_match=0` ("create
    only if no live object has this name"), which GCS evaluates atomically. Without that library a
    gs:// study with several workers is refused in one line rather than left to race.
    Without that library one process (`--workers=1`, `--trial`, a shard per machine) still
    takes claims, through tf.io.gfile: a temporary object renamed without overwrite after an
    existence check, the best gfile offers (two creators racing in the same instant could both
    win, which is why several workers are refused there, and a process that finds another's
    claims moving is refused too: `pip install 'wide_tf[gcs]'` installs the library).
  * any other scheme: refused (no atomic create is known for it).

Every way of running a study takes its claims here (one process as well as each of N workers), so
two commands on one workdir share its groups instead of each training all of them.

A claim's body (JSON): owner (a unique id per worker process), run (the id of the parent that
started the worker, so siblings recognise each other), host, pid, boot and pidns (this kernel's boot
id and this PID namespace's inode: `machine_identity`), epoch, state ("running", "done", "stopped"
(its owner left after SIGTERM: free at once) or "failed"), updated (time.time() of the last
heartbeat, on the writer's clock).

When a claim is stale, and may be taken over (docs/design.md, "Workers and claims"):
  * always: when the observer has seen its body unchanged for `stale_s` on its own monotonic
    clock (a lease: a heartbeat moves the body every HEARTBEAT_S). This holds across hosts in both
    directions: a host whose clock runs behind (its heartbeat looks old) keeps its groups while
    its heartbeat moves, and one whose clock runs ahead cannot hold a group for ever.
  * only when the claim carries this boot's identity (the same kernel, so the same clock): when
    `updated` is older than `stale_s` by this clock; and, with this PID namespace's identity too,
    when its pid is gone. A remote `updated` is never compared to this host's clock, and a pid is
    never tested across PID namespaces (containers sharing a hostname cannot see each other's pids).
A heartbeat stamped more than MAX_SKEW_S away from its claim file's time (the store's clock: the
file system's or GCS's) names the writer's clock skew once per host (`Claims.notes`); a claim file
that is not a claim (not UTF-8, not a JSON object, unreadable) is named in one line too. A garbled
file counts as a broken claim: stale once its file is older than `stale_s` or it stayed unchanged
that long. A "failed" claim (the owner's trial raised) is not retried by the owner's siblings, who
would fail the same way; a later run (another run id) does.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import socket
import sys
import threading
import time
import uuid

from wide_tf.schema.problems import RuntimeProblem

CLAIMS_DIR = "claims"
RUNNING, DONE, FAILED, STOPPED = "running", "done", "failed", "stopped"
# Heartbeat period and staleness timeout. A heartbeat comes from a background thread, so a long
# trial does not delay it; the timeout allows for a heavily loaded machine or a slow bucket.
HEARTBEAT_S, STALE_S = 10.0, 120.0
# A heartbeat further than this in the future is named (clocks of hosts sharing a workdir differ).
MAX_SKEW_S = 30.0


class ClaimError(RuntimeProblem):
    """Claims cannot be made on this workdir; the message says what to do."""


def group_key(group: tuple[str, int]) -> str:
    """A file-name-safe name of a (member, batch size) group."""
    member, batch = group
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', member)}_b{int(batch)}"


def _read_boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _read_pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


@functools.cache
def machine_identity() -> dict:
    """{"boot": this kernel's boot id, "pidns": this PID namespace's inode} (None where the system
    does not tell them, e.g. not Linux): a claim carrying both was written where this process can
    read its writer's clock and test its pid."""
    return {"boot": _read_boot_id(), "pidns": _read_pid_namespace()}


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
        """Stale by what this process can judge without watching: a broken file, and for a claim
        of this boot a heartbeat older than `stale_s` or (this PID namespace too) a dead pid. Any
        other claim is judged by the lease alone (`Claims.available`)."""
        b = self.body
        if b.get("state") == DONE:
            return False
        if b.get("state") == "broken":  # a garbled file older than stale_s
            return True
        here = machine_identity()
        if here["boot"] is None or b.get("boot") != here["boot"]:
            return False  # another kernel, another clock: only the lease can tell
        if b.get("pidns") == here["pidns"] is not None and isinstance(b.get("pid"), int):
            if not pid_alive(b["pid"]):
                return True
        updated = b.get("updated")
        if not isinstance(updated, (int, float)):
            return False  # unreadable: judged by how long it stays unchanged (the lease)
        return (time.time() if now is None else now) - updated > stale_s


class _LocalStore:
    """Claims in a local folder."""

    atomic_create = True  # os.link (or O_EXCL): of two creators exactly one wins

    def __init__(self, folder: str):
        self.folder = folder

    def create(self, name: str, text: str) -> bool:
        """Creates `name` holding `text` unless it exists; the file appears whole or not at all."""
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, name)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here: create-if-absent, then the body (see the docstring)
            return self._create_excl(path, text)
        finally:
            os.unlink(tmp)
        return True

    @staticmethod
    def _create_excl(path: str, text: str) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
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

    def read(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.folder, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def age(self, name: str) -> float:
        """Seconds since `name` was last written (0 when it cannot be told)."""
        t = self.mtime(name)
        return 0.0 if t is None else time.time() - t

    def mtime(self, name: str) -> float | None:
        """When `name` was last written, by the file system's clock (None: it cannot be told)."""
        try:
            return os.stat(os.path.join(self.folder, name)).st_mtime
        except OSError:
            return None

    def where(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def list(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.folder) if ".tmp-" not in n]
        except FileNotFoundError:
            return []


class _GcsStore:
    """Claims in a gs:// folder through google-cloud-storage (tf.io.gfile cannot create an object
    only if it is absent): creation uses the precondition if_generation_match=0."""

    atomic_create = True

    def __init__(self, folder: str):
        try:
            from google.api_core import exceptions as gexc
            from google.cloud import storage
        except ImportError:
            raise ClaimError(
                "several workers on a gs:// workdir need google-cloud-storage for atomic claims "
                "(tf.io.gfile cannot create a file only if it is absent on GCS); "
                "pip install 'wide_tf[gcs]' (google-cloud-storage), or use --workers=1 (one "
                "process per workdir)"
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

    def read(self, name: str) -> bytes | None:
        try:
            return self.bucket.blob(self.prefix + name).download_as_bytes()
        except self._missing:
            return None

    def age(self, name: str) -> float:
        t = self.mtime(name)
        return 0.0 if t is None else time.time() - t

    def mtime(self, name: str) -> float | None:
        """When `name` was last written, on GCS's clock."""
        blob = self.bucket.get_blob(self.prefix + name)
        return None if blob is None or blob.updated is None else blob.updated.timestamp()

    def where(self, name: str) -> str:
        return f"gs://{self.bucket.name}/{self.prefix}{name}"

    def list(self) -> list[str]:
        return [b.name[len(self.prefix) :] for b in self.bucket.list_blobs(prefix=self.prefix)]


class _GfileStore:
    """Claims in a gs:// folder through tf.io.gfile, for one process when google-cloud-storage is
    absent: an existence check, then a whole temporary object renamed without overwrite (not
    atomic against a creator racing in the same instant; see the module's docstring)."""

    atomic_create = False

    def __init__(self, folder: str):
        import tensorflow as tf  # only here: the rest of this module is TensorFlow-free

        self.folder, self.gfile = folder, tf.io.gfile

    def create(self, name: str, text: str) -> bool:
        path = os.path.join(self.folder, name)
        if self.gfile.exists(path):
            return False
        self.gfile.makedirs(self.folder)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with self.gfile.GFile(tmp, "w") as f:
            f.write(text)
        try:
            self.gfile.rename(tmp, path, overwrite=False)
        except Exception:  # it exists now: another process won
            self.gfile.remove(tmp)
            return False
        return True

    def overwrite(self, name: str, text: str) -> None:
        path = os.path.join(self.folder, name)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with self.gfile.GFile(tmp, "w") as f:
            f.write(text)
        self.gfile.rename(tmp, path, overwrite=True)

    def read(self, name: str) -> bytes | None:
        path = os.path.join(self.folder, name)
        if not self.gfile.exists(path):
            return None
        with self.gfile.GFile(path, "rb") as f:
            return f.read()

    def age(self, name: str) -> float:
        t = self.mtime(name)
        return 0.0 if t is None else time.time() - t

    def mtime(self, name: str) -> float | None:
        try:
            return self.gfile.stat(os.path.join(self.folder, name)).mtime_nsec / 1e9
        except Exception:
            return None

    def where(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def list(self) -> list[str]:
        if not self.gfile.isdir(self.folder):
            return []
        return [n for n in self.gfile.listdir(self.folder) if ".tmp-" not in n]


def open_store(workdir: str, one_process: bool = False):
    """The claims store of `workdir`. `one_process`: the only process of this command (a gs://
    workdir without google-cloud-storage then falls back to tf.io.gfile)."""
    folder = os.path.join(workdir, CLAIMS_DIR)
    if workdir.startswith("gs://"):
        try:
            return _GcsStore(folder)
        except ClaimError:
            if one_process:
                return _GfileStore(folder)
            raise
    if "://" in workdir:
        scheme = workdir.split("://", 1)[0]
        raise ClaimError(
            f"claims need an atomic create, which {scheme}:// does not offer here; "
            "use a local folder or gs://"
        )
    return _LocalStore(folder)


def check_store(workdir: str) -> None:
    """Raises ClaimError (one line) when claims cannot be made on `workdir`."""
    open_store(workdir)


_NAME = re.compile(r"^(?P<key>.+)\.(?P<epoch>\d+)\.json$")


def _parse(raw: bytes | None) -> tuple[dict, str]:
    """(a claim file's body, why it is not a claim: empty when it is one)."""
    if not raw:
        return {}, "is empty"
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "is not UTF-8 text"
    except json.JSONDecodeError as e:
        return {}, f"is not JSON ({e.msg})"
    if not isinstance(body, dict):
        return {}, f"holds {type(body).__name__}, not a claim (a JSON object)"
    return body, ""


class Claims:
    """One worker's view of the claims of a study's workdir."""

    def __init__(
        self, workdir: str, run_id: str, stale_s: float = STALE_S, store=None, one_process=False
    ):
        self.store = store if store is not None else open_store(workdir, one_process)
        self.run_id = run_id
        self.owner = uuid.uuid4().hex[:12]
        self.stale_s = stale_s
        self._held: dict[str, Claim] = {}
        self._lock = threading.Lock()
        # (key, epoch) -> (the body's bytes, when this process first saw them): the lease.
        self._seen: dict[tuple[str, int], tuple[bytes, float]] = {}
        self._broken: dict[str, str] = {}  # key -> why its claim file is not a claim
        self._skew: dict[str, float] = {}  # host -> its heartbeat minus its claim file's time
        self._skew_named: set[str] = set()  # hosts whose skew notes() has already returned
        if not getattr(self.store, "atomic_create", True):
            self._refuse_a_second_process()

    def _refuse_a_second_process(self, poll_s: float = 1.0) -> None:
        """On a store without an atomic create (gs:// without google-cloud-storage): raises
        ClaimError (one line) when another process holds a live claim, i.e. one whose body moves
        while this process watches; returns once every running claim of another owner has stayed
        unchanged for `stale_s` (its holder is gone, e.g. a preempted VM). Two processes starting
        in the same instant can still both pass: the library closes that gap."""
        first = {k: c.body for k, c in self.current().items() if c.body.get("state") == RUNNING}
        if first:
            print(
                f"Claims of {len(first)} groups are held on a store without an atomic create: "
                f"watching them for up to {self.stale_s:g}s for a live holder.",
                file=sys.stderr,
                flush=True,
            )
        while first:
            time.sleep(poll_s)
            current = self.current()
            for key in list(first):
                c = current.get(key)
                if c is None or c.body.get("state") != RUNNING or self.available(c):
                    first.pop(key)  # released, or its holder is gone
                elif c.body != first[key]:
                    raise ClaimError(
                        f"another process ({c.body.get('host')}:{c.body.get('pid')}) is running "
                        f"this study in {self.store.where('')} and this machine lacks "
                        "google-cloud-storage, without which two processes can both win a group; "
                        "pip install 'wide_tf[gcs]' (google-cloud-storage) on every machine, or "
                        "run one process at a time"
                    )

    def _body(self, key: str, epoch: int, state: str) -> dict:
        return {
            "group": key,
            "owner": self.owner,
            "run": self.run_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **machine_identity(),
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
            name = f"{key}.{epoch}.json"
            try:
                raw = self.store.read(name)
            except OSError as e:  # unreadable (no permission, a folder): one broken claim
                raw, why = None, f"cannot be read ({e.strerror or e})"
                body = {}
            else:
                body, why = _parse(raw)
            if why:
                self._broken[key] = f"{self.store.where(name)} {why}"
                # A broken claim written long ago has nobody behind it: stale at once.
                if self.store.age(name) > self.stale_s:
                    body = {"state": "broken"}
            else:
                self._broken.pop(key, None)
            if self._observe(key, epoch, raw or b"") and not why:
                self._measure_skew(name, body)
            out[key] = Claim(key, epoch, body)
        return out

    def _observe(self, key: str, epoch: int, raw: bytes) -> bool:
        """Starts the lease of a body not seen before; True when it is new."""
        seen = self._seen.get((key, epoch))
        if seen is None or seen[0] != raw:
            self._seen[(key, epoch)] = (raw, time.monotonic())
            return True
        return False

    def _measure_skew(self, name: str, body: dict) -> None:
        """The writer's clock against the store's, from a new body: its `updated` minus its file's
        time (both taken when it was written), once per host until it is far off."""
        host, updated = str(body.get("host")), body.get("updated")
        if host in self._skew or not isinstance(updated, int | float):
            return
        written = getattr(self.store, "mtime", lambda _: None)(name)
        if written is not None and abs(updated - written) > MAX_SKEW_S:
            self._skew[host] = updated - written

    def unchanged_for(self, claim: Claim) -> float:
        """Seconds (this process's clock) for which `claim`'s body has not changed."""
        seen = self._seen.get((claim.key, claim.epoch))
        return 0.0 if seen is None else time.monotonic() - seen[1]

    def notes(self, current: dict[str, Claim]) -> list[str]:
        """One line per claim a reader should know about: a claim file that is not a claim (each
        time), and a host whose clock is far off the store's (once: its heartbeats are judged by
        how long they stay unchanged here, so the skew costs nothing but is worth knowing)."""
        out = []
        for key in sorted(current):
            if key in self._broken:
                out.append(
                    f"claim {self._broken[key]}: treated as a broken claim, taken over once "
                    f"{self.stale_s:g}s old or unchanged"
                )
        for host, skew in sorted(self._skew.items()):
            if host in self._skew_named:
                continue
            self._skew_named.add(host)
            way = "ahead of" if skew > 0 else "behind"
            mine = " (this host)" if host == socket.gethostname() else ""
            out.append(
                f"clock skew: host {host}{mine} stamps its claims' heartbeats {abs(skew):.0f}s "
                f"{way} the workdir's clock (more than {MAX_SKEW_S:g}s; within about 1s); claims "
                f"are judged by how long they stay unchanged on each observer's own clock (taken "
                f"over after {self.stale_s:g}s unchanged), so no group is lost or held by it"
            )
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
        return claim.stale(stale_s=self.stale_s) or self.unchanged_for(claim) > self.stale_s

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


_OBSERVERS: dict[str, Claims] = {}


def observer(workdir: str) -> Claims:
    """A Claims of `workdir` that only reads, kept for this process (the parent's progress line):
    its leases and its once-only notes last across calls."""
    if workdir not in _OBSERVERS:
        _OBSERVERS[workdir] = Claims(workdir, "observer")
    return _OBSERVERS[workdir]
