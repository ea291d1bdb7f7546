"""Owns the claims through which the worker processes of one machine share a study's (member,
batch size) groups: a claim is a file CLAIMS/<group>.<epoch>.json that exactly one worker can
create, kept alive by a heartbeat and taken over when its owner has died or stopped beating.

Why epochs: taking over a dead owner's claim must itself be atomic. Deleting or renaming the old
file and then creating a new one lets two workers that both judged it dead each remove the other's
fresh claim. Instead the claim of a group is the file with the highest epoch, and a takeover
creates epoch k + 1 with the same create-if-absent as the first claim: of two workers that race,
exactly one creates it. An owner that finds a higher epoch than its own has lost the group.

Claims are local files, created whole: the body goes to a temporary sibling, which `os.link` then
names (link fails if the name exists: atomic on POSIX file systems); a file system without hard
links falls back to `O_CREAT | O_EXCL` and a write. They live in WORKDIR/claims for a local
workdir and in a folder of this machine's temporary directory for a gs:// one: every holder is a
process of this machine. Several machines on one study are a Ray cluster's to coordinate
(wide_tf/cluster/: one driver per workdir), not this module's.

Fenced owners: an owner checks its claim before every side effect of a run (study/scheduler.py's
fence: after each host loop, evaluation pass and probe, before the checkpoint, summaries and
record that follow) and stops with `LostClaim` once another worker has taken the group; the record
of a trial is written by the current owner only, a compare-and-swap on the epoch under the group's
lock file (`record`), which a takeover holds too.

A claim's body (JSON): owner (a unique id per worker process), run (the id of the parent that
started the worker, so siblings recognise each other), host, pid, boot and pidns (this kernel's boot
id and this PID namespace's inode: `machine_identity`), epoch, state ("running", "done", "stopped"
(its owner left after SIGTERM: free at once) or "failed"), beat (`boot_clock()` at the last
heartbeat) and updated (time.time() then, for people reading the file).

When a claim is stale, and may be taken over (docs/design.md, "Workers and claims"):
  * its boot is not this one: the kernel its holder ran on is gone (a rebooted VM);
  * in this PID namespace, its pid is gone;
  * its heartbeat `beat` is older than `stale_s` on the boot clock: CLOCK_BOOTTIME, one clock
    for every process of a boot, which no wall-clock step moves (NTP, a VM's clock set after a
    migration) and which counts a suspend, so a stopped or frozen holder is judged by how long it
    really stopped beating;
  * a garbled file (not UTF-8, not a JSON object, unreadable: named in one line by `notes`) once
    its file is older than `stale_s`.
A "failed" claim (the owner's trial raised) is not retried by the owner's siblings, who would fail
the same way; a later run (another run id) does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator

from wide_tf.store import workdir as wd

CLAIMS_DIR = "claims"
RUNNING, DONE, FAILED, STOPPED = "running", "done", "failed", "stopped"
# Heartbeat period and staleness timeout. A heartbeat comes from a background thread, so a long
# trial does not delay it; the timeout allows for a heavily loaded machine.
HEARTBEAT_S = 10.0
STALE_S = 120.0


class LostClaim(Exception):
    """Another worker took this worker's group over: its run stops before its next write."""


def group_key(group: tuple[str, int]) -> str:
    """A file-name-safe name of a (member, batch size) group."""
    member, batch = group
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', member)}_b{int(batch)}"


def boot_clock() -> float:
    """Seconds on this boot's clock, the same in every process of the boot and never stepped:
    CLOCK_BOOTTIME on Linux; elsewhere time.monotonic (system-wide since boot on macOS)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


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
    read its writer's boot clock and test its pid."""
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

    def stale(self, stale_s: float = STALE_S, now: float | None = None) -> bool:
        """Whether its holder is gone or has stopped beating (the module's docstring); `now` is
        a reading of `boot_clock()`."""
        b = self.body
        if b.get("state") == DONE:
            return False
        if b.get("state") == "broken":  # a garbled file older than stale_s
            return True
        here = machine_identity()
        if here["boot"] is not None and b.get("boot") != here["boot"]:
            return True  # written under another kernel: its holder died with it
        if b.get("pidns") == here["pidns"] and isinstance(b.get("pid"), int):
            if not pid_alive(b["pid"]):
                return True
        beat = b.get("beat")
        if not isinstance(beat, (int, float)):
            return True  # not a claim of this module's: nothing keeps it alive
        return (boot_clock() if now is None else now) - beat > stale_s


class _LocalStore:
    """Claims in a local folder."""

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
        try:  # a FIFO or a huge file raises NotARegularFile (an OSError): a broken claim
            return wd.read_checked(os.path.join(self.folder, name))
        except FileNotFoundError:
            return None

    def age(self, name: str) -> float:
        """Seconds since `name` was last written (0 when it cannot be told)."""
        try:
            return time.time() - os.stat(os.path.join(self.folder, name)).st_mtime
        except OSError:
            return 0.0

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Holds `key`'s lock file (flock: released by the kernel when its holder dies): a
        takeover and the owner's compare-and-swap of a record never interleave."""
        os.makedirs(self.folder, exist_ok=True)
        with open(os.path.join(self.folder, f"{key}.lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def where(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def list(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.folder) if n.endswith(".json")]
        except FileNotFoundError:
            return []


def claims_folder(workdir: str) -> str:
    """Where `workdir`'s claims live: WORKDIR/claims, or for a gs:// workdir a folder of this
    machine's (its holders are this machine's processes)."""
    if "://" not in workdir:
        return os.path.join(workdir, CLAIMS_DIR)
    name = uuid.uuid5(uuid.NAMESPACE_URL, workdir).hex[:12]
    return os.path.join(tempfile.gettempdir(), f"wide_tf-claims-{name}")


_NAME = re.compile(r"^(?P<key>.+)\.(?P<epoch>\d+)\.json$")


def _parse(raw: bytes | None) -> tuple[dict, str]:
    """(a claim file's body, why it is not a claim: empty when it is one)."""
    if not raw:
        return {}, "is empty"
    try:
        body = wd.loads_checked(raw)  # depth-checked: a deep file is "not JSON", not a crash
    except UnicodeDecodeError:
        return {}, "is not UTF-8 text"
    except json.JSONDecodeError as e:
        return {}, f"is not JSON ({e.msg})"
    if not isinstance(body, dict):
        return {}, f"holds {type(body).__name__}, not a claim (a JSON object)"
    return body, ""


class Claims:
    """One worker's view of the claims of a study's workdir."""

    def __init__(self, workdir: str, run_id: str, stale_s: float | None = None, store=None):
        self.store = store if store is not None else _LocalStore(claims_folder(workdir))
        self.run_id = run_id
        self.owner = uuid.uuid4().hex[:12]
        self.stale_s = STALE_S if stale_s is None else stale_s  # read now: a test may shorten it
        self._held: dict[str, Claim] = {}
        self._lock = threading.Lock()
        self._broken: dict[str, str] = {}  # key -> why its claim file is not a claim

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
            "beat": boot_clock(),
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
                body, why = {}, f"cannot be read ({e.strerror or e})"
            else:
                body, why = _parse(raw)
            if why:
                self._broken[key] = f"{self.store.where(name)} {why}"
                # A broken claim written long ago has nobody behind it: stale at once.
                body = {"state": "broken"} if self.store.age(name) > self.stale_s else {}
            else:
                self._broken.pop(key, None)
            out[key] = Claim(key, epoch, body)
        return out

    def notes(self, current: dict[str, Claim]) -> list[str]:
        """One line per claim file that is not a claim (a reader should know about it)."""
        return [
            f"claim {self._broken[key]}: treated as a broken claim, taken over once "
            f"{self.stale_s:g}s old"
            for key in sorted(current)
            if key in self._broken
        ]

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
        if not claim.body:  # a garbled file not yet old enough to be taken over
            return False
        return claim.stale(self.stale_s)

    def failed_here(self, claim: Claim | None) -> bool:
        """Whether `claim` failed in a worker of this run (so this run does not retry it)."""
        return (
            claim is not None
            and claim.body.get("state") == FAILED
            and claim.body.get("run") == self.run_id
        )

    def try_claim(self, key: str, current: Claim | None) -> bool:
        """Creates the next epoch of `key`'s claim; True if this worker won it. Under the group's
        lock: an owner recording a trial (`record`) finishes before the group changes hands."""
        epoch = 0 if current is None else current.epoch + 1
        body = self._body(key, epoch, RUNNING)
        with self.store.locked(key):
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
        return not any(
            (m := _NAME.match(n)) and m["key"] == key and int(m["epoch"]) > held.epoch
            for n in self.store.list()
        )

    def record(self, workdir: str, key: str, result: dict) -> None:
        """Records `result` if this worker still owns `key`'s group (a compare-and-swap on the
        epoch, under the lock a takeover takes too); raises LostClaim otherwise."""
        with self.store.locked(key):
            if not self.still_mine(key):
                raise LostClaim(key)
            wd.record_result(workdir, result)

    def release(self, key: str, state: str = DONE) -> None:
        # Under the lock, as the heartbeat writes: a beat must never turn "done" back into
        # "running". A lost claim is left to its new owner.
        with self._lock:
            mine = self.still_mine(key)
            held = self._held.pop(key, None)
            if held is not None and mine:
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
    its once-only notes last across calls."""
    if workdir not in _OBSERVERS:
        _OBSERVERS[workdir] = Claims(workdir, "observer")
    return _OBSERVERS[workdir]
