"""One owner per group: claims are created whole (a reader never sees half a claim and
takes it over), a heartbeat stamped in the future cannot hold a group for ever and is named, a
garbled claim file is named in one line, and two `--workers=1` commands on one workdir train every
trial once. Across machines: a host whose clock runs behind keeps its groups while its
heartbeat moves, a claim of another boot or PID namespace is never judged by its pid, the skew is
named once, an unreadable claim file is one broken claim."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO, env, start_main

from wide_tf.checks.loader import load_config
from wide_tf.store import claims
from wide_tf.study import trials as trials_lib

SMOKE = ["--config=configs/mlp.py:smoke"]


def _write(folder, name, raw: bytes, age_s: float = 0.0):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(raw)
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))


def test_a_claim_read_while_it_is_created_is_never_taken_over(tmp_path):
    """One thread creates 400 claims (its own live pid, fresh heartbeats) while two others read
    the folder as fast as they can: no reader ever finds one of them available (the old empty
    create-then-write let 1 in 3,000 be stolen)."""
    creator = claims.Claims(str(tmp_path), "run-a", stale_s=60)
    stolen, done = [], threading.Event()

    def read():
        reader = claims.Claims(str(tmp_path), "run-b", stale_s=60)
        while not done.is_set():
            current = reader.current()
            stolen.extend(reader.notes(current))  # a half-written file would be named here
            for key, c in current.items():
                if reader.available(c):
                    stolen.append((key, c.body))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(400):
        assert creator.try_claim(f"g{i}", None)
    done.set()
    for t in readers:
        t.join()
    assert stolen == []
    # Every file is whole, and no temporary file is left behind.
    names = os.listdir(tmp_path / "claims")
    assert len(names) == 400 and not [n for n in names if ".tmp-" in n]


def test_a_torn_claim_is_held_until_it_stays_unchanged_for_the_timeout(tmp_path):
    folder = tmp_path / "claims"
    _write(folder, "torn.0.json", b"")  # as if read between create and write
    _write(folder, "old_torn.0.json", b'{"owner": ', age_s=3600)
    me = claims.Claims(str(tmp_path), "run", stale_s=0.3)
    current = me.current()
    assert not me.available(current["torn"])  # its writer may be writing it
    assert me.available(current["old_torn"])  # nobody has written it for an hour
    time.sleep(0.4)
    assert me.available(me.current()["torn"])  # unchanged for the timeout: nobody behind it


def test_a_heartbeat_in_the_future_is_named_and_cannot_hold_the_group_for_ever(tmp_path):
    """A host whose clock runs an hour ahead stamps its heartbeat in the future: by its stamp the
    claim is never stale. The observer names the holder and the skew, and takes the group over
    once the claim has not changed for the timeout by its own clock."""
    body = {
        "owner": "o",
        "run": "r",
        "host": "elsewhere",
        "pid": 4242,
        "epoch": 0,
        "state": "running",
        "updated": time.time() + 3600,
    }
    _write(tmp_path / "claims", "g.0.json", json.dumps(body).encode())
    me = claims.Claims(str(tmp_path), "run", stale_s=0.3)
    current = me.current()
    assert not me.available(current["g"])
    (note,) = me.notes(current)
    assert "host elsewhere" in note and "3600s ahead of" in note, note
    assert me.notes(me.current()) == []  # named once, not at every look
    time.sleep(0.4)
    current = me.current()
    assert me.available(current["g"]) and me.try_claim("g", current["g"])
    # A live holder whose clock runs ahead keeps rewriting its claim: that is not taken over.
    other = claims.Claims(str(tmp_path), "run2", stale_s=0.3)
    for _ in range(4):
        time.sleep(0.1)
        me.heartbeat()
        assert not other.available(other.current()["g"])


def test_a_claim_file_that_is_not_utf8_or_not_an_object_is_named_in_one_line(tmp_path):
    folder = tmp_path / "claims"
    _write(folder, "bin.0.json", b"\xff\xfe\x00garbage", age_s=3600)
    _write(folder, "list.0.json", b"[1, 2]")
    me = claims.Claims(str(tmp_path), "run", stale_s=60)
    current = me.current()  # no UnicodeDecodeError
    notes = me.notes(current)
    assert len(notes) == 2
    assert any(str(folder / "bin.0.json") in n and "not UTF-8" in n for n in notes), notes
    assert any("list.0.json" in n and "holds list" in n for n in notes), notes
    assert all("\n" not in n for n in notes)
    assert me.available(current["bin"]) and not me.available(current["list"])


def _remote_body(**over) -> dict:
    body = {"owner": "o", "run": "r", "host": "elsewhere", "pid": 4242, "epoch": 0}
    body.update(boot="another-boot", pidns=1, state="running", updated=time.time())
    body.update(over)
    return body


def _beat(folder, name, body_of, stop: threading.Event, every_s=0.05):
    """Rewrites a claim file every `every_s` seconds (a live holder's heartbeat) until `stop`."""

    def run():
        while not stop.is_set():
            tmp = os.path.join(folder, f"{name}.tmp-beat")
            with open(tmp, "w") as f:
                json.dump(body_of(), f)
            os.replace(tmp, os.path.join(folder, name))
            stop.wait(every_s)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_host_whose_clock_runs_behind_keeps_its_group_while_its_heartbeat_moves(tmp_path):
    """Its heartbeat is stamped 180 s in the past by this host's clock: that is not age (main
    took the group over at once, training it twice). The observer's own lease decides, the skew
    is named once, and the group is free once the heartbeat stops for the timeout."""
    folder = tmp_path / "claims"
    folder.mkdir()
    stop = threading.Event()
    beater = _beat(folder, "g.0.json", lambda: _remote_body(updated=time.time() - 180), stop)
    time.sleep(0.1)
    me = claims.Claims(str(tmp_path), "run", stale_s=0.3)
    notes = []
    for _ in range(10):
        current = me.current()
        notes += me.notes(current)
        assert not me.available(current["g"])
        time.sleep(0.1)
    assert len(notes) == 1 and "host elsewhere" in notes[0], notes
    assert "180s behind" in notes[0], notes
    stop.set()
    beater.join()
    me.current()
    time.sleep(0.4)
    assert me.available(me.current()["g"])  # its holder stopped: taken over by the lease


def test_a_claim_of_another_boot_or_pid_namespace_is_not_judged_by_its_pid(tmp_path):
    """Containers sharing a hostname cannot see each other's pids: a claim with this hostname and
    a pid that is not alive here, written under another boot or another PID namespace, is held
    while its heartbeat moves (main took it over at once)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = claims.machine_identity()
    folder = tmp_path / "claims"
    folder.mkdir()
    stop = threading.Event()
    other_boot = {"host": socket.gethostname(), "pid": dead.pid, "boot": "b2"}
    other_ns = {**other_boot, "boot": here["boot"], "pidns": -1}
    for name, ident in (("boot.0.json", other_boot), ("ns.0.json", other_ns)):
        _beat(folder, name, lambda ident=ident: _remote_body(**ident), stop)
    time.sleep(0.1)
    me = claims.Claims(str(tmp_path), "run", stale_s=0.3)
    try:
        for _ in range(8):
            current = me.current()
            assert not me.available(current["boot"]) and not me.available(current["ns"])
            time.sleep(0.1)
    finally:
        stop.set()
    # The same claim with this boot's and this namespace's identity is judged by its pid.
    _write(folder, "mine.0.json", json.dumps(_remote_body(**{**other_boot, **here})).encode())
    assert me.available(me.current()["mine"])


def test_an_unreadable_claim_file_is_one_broken_claim(tmp_path):
    """A claim file that cannot be read (mode 000 for another user; tests run as root, so the
    store's read is stubbed to refuse) is named and judged as a broken claim, not an error that
    stops every worker."""
    me = claims.Claims(str(tmp_path), "run", stale_s=60)
    assert me.try_claim("ok", None)
    _write(tmp_path / "claims", "locked.0.json", b"{}", age_s=3600)
    os.mkdir(tmp_path / "claims" / "folder.0.json")
    read = me.store.read

    def refuse(name):
        if name.startswith("locked"):
            raise PermissionError(13, "Permission denied")
        return read(name)

    me.store.read = refuse
    current = me.current()
    notes = me.notes(current)
    assert any("locked.0.json cannot be read (Permission denied)" in n for n in notes), notes
    assert any("folder.0.json cannot be read" in n for n in notes), notes
    assert me.available(current["locked"]) and not me.available(current["ok"])


def _trial_starts(stderr: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in stderr.splitlines():
        if "budget, eval every" in line and "] [" in line:
            tid = line.split("] [", 1)[1].split("]", 1)[0]
            counts[tid] = counts.get(tid, 0) + 1
    return counts


def test_a_slow_clock_host_sharing_the_workdir_trains_every_trial_once(tmp_path):
    """Two `--workers=1` commands on one workdir share its groups, also when one runs as if on a
    host whose clock runs 3 minutes behind (main: 6 starts for 4 trials, the same trial trained
    twice at once). Each trial is trained once and the skew is named in each console, once."""
    slow_env = dict(env(), WIDE_TF_CLOCK_OFFSET_S="-180")
    slow = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "slow_clock.py"), *SMOKE, f"--workdir={tmp_path}",
         "--workers=1"],
        cwd=REPO, env=slow_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    normal = start_main(*SMOKE, f"--workdir={tmp_path}", "--workers=1")
    starts: dict[str, int] = {}
    errs = []
    for p in (slow, normal):
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        errs.append(err)
        for tid, n in _trial_starts(err).items():
            starts[tid] = starts.get(tid, 0) + n
    expected = {t.trial_id for t in trials_lib.list_trials(load_config("configs/mlp.py:smoke"))}
    assert set(starts) == expected and set(starts.values()) == {1}, starts
    # Named once, never every heartbeat. The slow host names it once it has written a claim (it
    # trained); the other host once it has read one of the slow host's claims, which it must have
    # when both trained. On a loaded machine one command may start after the other has claimed
    # every group: then it trains nothing and has no claim of the slow host to read.
    slow_err, normal_err = errs
    for err in errs:
        assert err.count("clock skew: host") <= 1, err[-3000:]
    if _trial_starts(slow_err):
        for err in [slow_err] + ([normal_err] if _trial_starts(normal_err) else []):
            assert err.count("clock skew: host") == 1 and "180s behind" in err, err[-3000:]
    c = claims.Claims(str(tmp_path), "x").current()
    assert len(c) == 4 and all(v.body["state"] == "done" for v in c.values())
    assert {v.body["host"] for v in c.values()} == {socket.gethostname()}


class _NoAtomicCreate(claims._LocalStore):
    """A store as gs:// is without google-cloud-storage: no atomic create (tf.io.gfile's check,
    then a rename); the claims are local files, so the test needs no bucket."""

    atomic_create = False


def test_a_second_process_on_a_store_without_atomic_create_is_refused(tmp_path):
    """On gs:// without google-cloud-storage two processes could both win a group.
    A process that finds another's claim moving is refused in one line; one that finds only a
    dead holder's claim (unchanged for the timeout) goes on."""
    folder = tmp_path / "claims"
    folder.mkdir()
    stop = threading.Event()
    _beat(folder, "live.0.json", _remote_body, stop, every_s=0.1)
    time.sleep(0.15)
    store = _NoAtomicCreate(str(folder))
    try:
        with pytest.raises(claims.ClaimError) as e:
            claims.Claims(str(tmp_path), "run", stale_s=2.0, store=store, one_process=True)
    finally:
        stop.set()
    line = str(e.value)
    assert "\n" not in line and "elsewhere:4242" in line and "wide_tf[gcs]" in line, line
    t0 = time.monotonic()
    c = claims.Claims(str(tmp_path), "run", stale_s=0.5, store=store, one_process=True)
    assert 0.4 < time.monotonic() - t0 < 5 and c.available(c.current()["live"])
