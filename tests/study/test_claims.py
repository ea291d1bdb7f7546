"""One owner per group (issue 25): claims are created whole (a reader never sees half a claim and
takes it over), a heartbeat stamped in the future cannot hold a group for ever and is named, a
garbled claim file is named in one line, and two `--workers=1` commands on one workdir train every
trial once."""

import json
import os
import socket
import threading
import time

from helpers import start_main

from wide_tf.config.loader import load_config
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
    assert "elsewhere:4242" in note and "3600s in the future" in note, note
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


def _trial_starts(stderr: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in stderr.splitlines():
        if "budget, eval every" in line and "] [" in line:
            tid = line.split("] [", 1)[1].split("]", 1)[0]
            counts[tid] = counts.get(tid, 0) + 1
    return counts


def test_two_one_worker_commands_on_one_workdir_train_every_trial_once(tmp_path):
    procs = [start_main(*SMOKE, f"--workdir={tmp_path}", "--workers=1") for _ in range(2)]
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        errs.append(err)
    starts: dict[str, int] = {}
    for err in errs:
        for tid, n in _trial_starts(err).items():
            starts[tid] = starts.get(tid, 0) + n
    expected = {t.trial_id for t in trials_lib.list_trials(load_config("configs/mlp.py:smoke"))}
    assert set(starts) == expected and set(starts.values()) == {1}, starts
    c = claims.Claims(str(tmp_path), "x").current()
    assert len(c) == 4 and all(v.body["state"] == "done" for v in c.values())
    assert {v.body["host"] for v in c.values()} == {socket.gethostname()}
