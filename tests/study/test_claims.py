"""One owner per group: claims are created whole (a reader never sees half a claim and takes it
over), a garbled or unreadable claim file is named in one line, staleness is judged on the boot
clock (a wall-clock step frees no live claim), and a worker stopped past its lease loses its group
and writes nothing more: the record is its new owner's, written once."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

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
    names = [n for n in os.listdir(tmp_path / "claims") if not n.endswith(".lock")]
    assert len(names) == 400 and not [n for n in names if ".tmp-" in n]


def test_a_torn_claim_is_held_until_its_file_is_older_than_the_timeout(tmp_path):
    folder = tmp_path / "claims"
    _write(folder, "torn.0.json", b"")  # as if read between create and write
    _write(folder, "old_torn.0.json", b'{"owner": ', age_s=3600)
    me = claims.Claims(str(tmp_path), "run", stale_s=60)
    current = me.current()
    assert not me.available(current["torn"])  # its writer may be writing it
    assert me.available(current["old_torn"])  # nobody has written it for an hour


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


def _body(**over) -> dict:
    body = {"owner": "o", "run": "r", "host": socket.gethostname(), "epoch": 0}
    body.update(claims.machine_identity(), pid=os.getpid(), state="running")
    body.update(beat=claims.boot_clock(), updated=time.time())
    body.update(over)
    return body


def test_staleness_is_judged_on_the_boot_clock_not_the_wall_clock():
    """A live holder's claim whose wall-clock stamp is an hour off either way is held (a forward
    clock step used to free every live claim on the host); one that stopped beating for the
    lease on the boot clock is free; a claim of another boot is free (its kernel is gone); in
    another PID namespace of this boot a dead-looking pid is not tested, the beat decides."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    now = claims.boot_clock()

    def stale(**over):
        return claims.Claim("g", 0, _body(**over)).stale(stale_s=120, now=now)

    assert not stale(updated=time.time() - 3600) and not stale(updated=time.time() + 3600)
    assert stale(beat=now - 121) and not stale(beat=now - 100)
    assert stale(boot="another-boot")
    assert stale(pid=dead.pid)
    assert not stale(pid=dead.pid, pidns=-1) and stale(pid=dead.pid, pidns=-1, beat=now - 121)


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


def _stepped(*flags, offset_s=0.0, lease_s=None):
    """main in its own process as tests/slow_clock.py runs it: its wall clock stepped, its lease
    shortened."""
    e = dict(env(), WIDE_TF_CLOCK_OFFSET_S=str(offset_s))
    if lease_s is not None:
        e["WIDE_TF_LEASE_S"] = str(lease_s)
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "slow_clock.py"), *flags],
        cwd=REPO, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_a_forward_clock_step_frees_no_live_claim(tmp_path):
    """Two `--workers=1` commands on one workdir share its groups; one runs with its wall clock
    stepped 3 minutes forward (more than the 120 s lease). Its view of the other's heartbeats is
    that they are 3 minutes old: judged on the wall clock it took their live groups over and
    trained them twice. On the boot clock every trial is trained once."""
    ahead = _stepped(*SMOKE, f"--workdir={tmp_path}", "--workers=1", offset_s=180)
    normal = start_main(*SMOKE, f"--workdir={tmp_path}", "--workers=1")
    starts: dict[str, int] = {}
    for p in (ahead, normal):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        for tid, n in _trial_starts(err).items():
            starts[tid] = starts.get(tid, 0) + n
    expected = {t.trial_id for t in trials_lib.list_trials(load_config("configs/mlp.py:smoke"))}
    assert set(starts) == expected and set(starts.values()) == {1}, starts
    c = claims.Claims(str(tmp_path), "x").current()
    assert len(c) == 4 and all(v.body["state"] == "done" for v in c.values())


ONE_GROUP = [
    "--config=configs/mlp.py:smoke",
    "--config.sweep.family.depths=(1,)",
    "--config.sweep.batch_sizes=(32,)",
    "--config.sweep.seeds=(0,)",
    "--config.sweep.confirm_seeds=()",
    "--config.train.max_epochs=10.0",
    "--config.train.checkpoint_every_steps=20",
    "--workers=1",
    "--no_report",
]


def _files(folder) -> dict[str, tuple[int, int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_worker_stopped_past_its_lease_writes_nothing_more(tmp_path):
    """A worker stopped (SIGSTOP) mid-trial past its lease loses its group to a second command,
    which resumes the trial and records it. Continued (SIGCONT), the first stops its run before
    its next write, in one line, and exits: one start's record, and nothing of the trial's folder
    (checkpoints, event files, result) written by the stopped worker after the takeover."""
    workdir = tmp_path / "study"
    first = _stepped(*ONE_GROUP, f"--workdir={workdir}", lease_s=3)
    lines = []
    for line in first.stderr:
        lines.append(line)
        if "budget, eval every" in line:
            break
    else:
        raise AssertionError("".join(lines[-30:]))
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = _stepped(*ONE_GROUP, f"--workdir={workdir}", lease_s=3)
        _, err2 = second.communicate(timeout=300)
        assert second.returncode == 0, err2[-3000:]
        assert "taken over from" in err2, err2[-3000:]
        before = _files(workdir / "trials") | _files(workdir / "results")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1[-3000:]
    taken = [ln for ln in err1.splitlines() if "was taken over by another worker" in ln]
    assert len(taken) == 1 and "reached:" not in err1, err1[-3000:]
    assert _files(workdir / "trials") | _files(workdir / "results") == before
    (record,) = (workdir / "results").iterdir()
    (trial,) = (workdir / "trials").iterdir()
    assert json.loads(record.read_text()) == json.loads((trial / "result.json").read_text())
