"""--workers=N: claims (atomic creation, races, takeover of a dead owner's claim), the worker
processes (every trial once, the same report as one process), a killed worker, SIGTERM to the
parent, and bad --workers values."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO, comparable, env, run_main, start_main

from wide_tf.checks import validate
from wide_tf.checks.loader import load_config
from wide_tf.store import claims
from wide_tf.store import workdir as wd
from wide_tf.study import scheduler as study
from wide_tf.study import trials as trials_lib
from wide_tf.study import workers

SMOKE = ["--config=configs/mlp.py:smoke"]
# Longer trials (a harder target, more epochs), so a worker can be stopped in the middle of one.
SLOW = [
    *SMOKE,
    "--config.train.target_value=0.97",
    "--config.train.max_epochs=12.0",
    "--config.train.steps_per_loop=5",
    "--config.train.checkpoint_every_steps=10",
]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write_claim(folder, key, epoch, **body):
    os.makedirs(folder, exist_ok=True)
    base = {"owner": "someone", "run": "old", "host": socket.gethostname(), "pid": os.getpid()}
    base.update(claims.machine_identity())  # written on this machine, in this PID namespace
    base.update(epoch=epoch, state="running", beat=claims.boot_clock(), updated=time.time())
    base.update(body)
    with open(os.path.join(folder, f"{key}.{epoch}.json"), "w") as f:
        json.dump(base, f)


# ------------------------------------------------------------------------------------------------
# Claims, in-process


def _race(cs, key, current=None) -> list[str]:
    """Every Claims in `cs` tries to create `key`'s claim at the same moment; the winners."""
    barrier, won = threading.Barrier(len(cs)), []

    def go(c):
        barrier.wait()
        if c.try_claim(key, current):
            won.append(c.owner)

    threads = [threading.Thread(target=go, args=(c,)) for c in cs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_racing_workers_win_a_claim_once(tmp_path):
    """Eight workers (threads: O_EXCL is decided by the kernel, as between processes) claim the
    same group at once, twenty times over; then race to take over a dead owner's claim."""
    for round_ in range(20):
        cs = [claims.Claims(str(tmp_path), "run") for _ in range(8)]
        won = _race(cs, f"g{round_}")
        assert len(won) == 1
        assert [c.owner for c in cs if f"g{round_}" in c._held] == won
    # Takeover: all eight see the same stale claim (its owner's pid is gone) and race for epoch 1.
    _write_claim(tmp_path / "claims", "dead", 0, pid=_dead_pid())
    cs = [claims.Claims(str(tmp_path), "run") for _ in range(8)]
    current = cs[0].current()["dead"]
    assert all(c.available(current) for c in cs)
    assert len(_race(cs, "dead", current)) == 1
    assert cs[0].current()["dead"].epoch == 1


def test_claim_staleness_and_takeover_rules(tmp_path):
    folder = tmp_path / "claims"
    me = claims.Claims(str(tmp_path), "run-a", stale_s=60)
    now = claims.boot_clock()
    _write_claim(folder, "live", 0)  # this test's own pid, fresh heartbeat
    _write_claim(folder, "dead_pid", 0, pid=_dead_pid())
    _write_claim(folder, "old_beat", 0, beat=now - 61)  # the boot clock: 61 s without a beat
    # A wall-clock stamp an hour off (a clock step) is not age: the boot clock decides.
    _write_claim(folder, "stepped", 0, updated=time.time() - 3600)
    # A claim of another boot: its holder's kernel is gone (claims are this machine's files).
    _write_claim(folder, "other_boot", 0, boot="b2")
    _write_claim(folder, "failed_here", 0, state="failed", run="run-a")
    _write_claim(folder, "failed_before", 0, state="failed", run="run-0")
    _write_claim(folder, "stopped", 0, state="stopped")
    _write_claim(folder, "taken", 0, pid=_dead_pid())
    _write_claim(folder, "taken", 1)  # the highest epoch is the claim
    (folder / "torn.0.json").write_text('{"owner": ')
    current = me.current()
    available = {k for k, c in current.items() if me.available(c)}
    # A torn (fresh) file is not a claim anyone may take: its writer may be writing it.
    assert available == {"dead_pid", "old_beat", "other_boot", "failed_before", "stopped"}
    assert me.available(None)
    assert me.failed_here(current["failed_here"]) and not me.failed_here(current["failed_before"])
    # Taking over writes the next epoch; the old owner then sees that it lost the group.
    assert me.try_claim("dead_pid", current["dead_pid"])
    assert me.current()["dead_pid"].epoch == 1 and me.current()["dead_pid"].body["run"] == "run-a"
    assert not me.try_claim("dead_pid", current["dead_pid"])  # epoch 1 exists: nobody else wins
    other = claims.Claims(str(tmp_path), "run-b")
    other._held["dead_pid"] = current["dead_pid"]  # as if it still thought epoch 0 its own
    assert me.still_mine("dead_pid") and not other.still_mine("dead_pid")
    # Heartbeat and release rewrite the held claim; a released one is not held any more.
    before = me.current()["dead_pid"].body["beat"]
    time.sleep(0.01)
    me.heartbeat()
    assert me.current()["dead_pid"].body["beat"] > before
    me.release("dead_pid")
    assert me.current()["dead_pid"].body["state"] == "done" and not me.still_mine("dead_pid")


def test_a_gs_workdirs_claims_are_files_of_this_machine():
    """Several workers on a gs:// workdir claim through a local folder (every holder is a process
    of this machine: several machines are a Ray cluster's), so no store library is needed."""
    folder = claims.claims_folder("gs://bucket/study")
    assert "://" not in folder and folder == claims.claims_folder("gs://bucket/study")
    assert folder != claims.claims_folder("gs://bucket/other")
    validate.check_workers("2", None, None)


def test_a_worker_takes_over_a_dead_owners_group(tmp_path):
    """In-process: one group's claim belongs to a worker that died; run_worker takes it over and
    runs the whole study."""
    config = load_config("configs/mlp.py:smoke")
    config.runtime.strategy = "cpu"
    trials = trials_lib.list_trials(config)
    trials_lib.check_workdir(config, str(tmp_path))
    dead = claims.group_key(trials[0].group)
    _write_claim(tmp_path / "claims", dead, 0, pid=_dead_pid())
    ran = study.run_worker(config, str(tmp_path), "run", poll_s=0.05)
    assert ran == len(trials) == 4
    assert {r["trial_id"] for r in wd.read_results(str(tmp_path))} == {t.trial_id for t in trials}
    c = claims.Claims(str(tmp_path), "x").current()
    assert c[dead].epoch == 1 and all(v.body["state"] == "done" for v in c.values())


# ------------------------------------------------------------------------------------------------
# Worker processes


def test_plan_pins_each_worker_to_its_cores(monkeypatch):
    config = load_config("configs/mlp.py:smoke")
    monkeypatch.setattr(workers, "cpu_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(workers, "gpu_ids", lambda: [])
    assert [s.cpus for s in workers.plan(2, "r", config)] == [(0, 1), (2, 3)]
    assert [s.cpus for s in workers.plan(6, "r", config)] == [(0,), (1,), (2,), (3,), (0,), (1,)]
    assert workers.default_workers(config, n_groups=4) == 4
    assert workers.default_workers(config, n_groups=3) == 3
    monkeypatch.setattr(workers, "gpu_ids", lambda: [0, 1, 2, 3, 4, 5, 6, 7])
    config.runtime.strategy = "auto"
    assert workers.default_workers(config, n_groups=28) == 8
    assert [s.gpu for s in workers.plan(8, "r", config)] == list(range(8))
    config.runtime.strategy = "multi_worker"
    assert workers.default_workers(config, n_groups=28) == 1


def _trial_starts(workdir) -> dict[str, int]:
    """How many times each trial started training, from the worker logs."""
    counts: dict[str, int] = {}
    for name in os.listdir(os.path.join(workdir, "logs")):
        with open(os.path.join(workdir, "logs", name)) as f:
            for line in f:
                if "budget, eval every" in line and "] [" in line:
                    tid = line.split("] [", 1)[1].split("]", 1)[0]
                    counts[tid] = counts.get(tid, 0) + 1
    return counts


def _without_section(rows: list[str], heading: str) -> list[str]:
    """`rows` without the section under `heading` (its heading kept, up to the next one)."""
    if heading not in rows:
        return rows
    start = rows.index(heading) + 1
    end = next((i for i in range(start, len(rows)) if rows[i].startswith("## ")), len(rows))
    return rows[:start] + rows[end:]


def _report_without_timings(workdir) -> dict[str, str]:
    out = {}
    folder = os.path.join(workdir, "report")
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".md", ".csv")):
            continue
        with open(os.path.join(folder, name)) as f:
            rows = f.read().splitlines()
        if name == "all_trials.csv":  # the last two columns are wall time and examples per second
            header = rows[0].split(",")
            assert header[-2:] == ["wall_time_s", "examples_per_s"]
            rows = [",".join(r.split(",")[:-2]) for r in rows]
        if name == "report.md":  # 'Where the time went' is seconds measured: its rows differ
            rows = _without_section(rows, "## Where the time went")
            # The provenance rows name each command (--workers=1 or 2, the workdir), the cores
            # each worker is pinned to and its thread settings: where the reports came from,
            # not what they found.
            rows = [
                r
                for r in rows
                if not r.startswith(("| Command |", "| Environment |", "| Machine |"))
            ]
        out[name] = "\n".join(rows)
    return out


def test_two_workers_run_every_trial_once_and_report_as_one_process(tmp_path, smoke_study):
    """Also: the parent supervises without TensorFlow. tests/tf_import_spy.py notes its first
    import of TensorFlow: for the report alone, in the thread that imports it once the study's
    end is near (a worker found nothing left to claim), at a few tens of MB (it was 760 MB, and
    7 s of CPU taken from the workers, when it imported it to supervise).
    And each check runs once per process (tests/call_spy counts the calls in every process)."""
    (one, one_err), two = smoke_study, tmp_path / "two"
    spy, calls = tmp_path / "tf_spy.json", tmp_path / "calls.log"
    e = env()
    e["PYTHONPATH"] = str(REPO / "tests" / "call_spy") + os.pathsep + e["PYTHONPATH"]
    e.update(WIDE_TF_TF_SPY=str(spy), WIDE_TF_CALL_LOG=str(calls), WIDE_TF_CALL_SPY=_SPIED)
    two.mkdir()  # the same study's config.json: the "same study" check compares, once
    (two / "config.json").write_text((one / "config.json").read_text())
    same = "--config.data.name=digits_embedded"  # an override (its value unchanged): checked once
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "tf_import_spy.py"), *SMOKE, f"--workdir={two}"]
        + ["--workers=2", same],
        cwd=REPO,
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    seen = json.loads(spy.read_text())
    # A worker had ended (its groups recorded) before TensorFlow came in, in the report's thread.
    assert len(seen["results"]) >= 1, seen
    assert "main.py:<lambda>" in seen["stack"] and "threading.py:run" in seen["stack"], seen
    assert seen["rss_mb"] < 150 and seen["cpu_s"] < 3, seen
    errs = [one_err, err]
    expected = {t.trial_id for t in trials_lib.list_trials(load_config("configs/mlp.py:smoke"))}
    starts = _trial_starts(two)
    assert set(starts) == expected and set(starts.values()) == {1}, starts
    assert len(list((two / "logs").glob("worker-*.log"))) == 2
    assert not list((one / "logs").glob("worker-*.log"))  # one process: its own log only
    _assert_once_per_process(calls.read_text(), parent=proc.pid, trials=len(expected))
    # One process takes its claims in the workdir too, like each worker of --workers=2.
    assert (two / "claims").is_dir() and (one / "claims").is_dir()
    assert _report_without_timings(one) == _report_without_timings(two)
    # Both progress lines count the whole study: the parent's, and one process's per trial.
    assert "progress: 4/4 trials (expected), 4/4 groups done" in errs[1]
    assert "; study 3/4 trials (expected), 3/4 groups done, about" in errs[0]


# The checks (each must run once, in the parent), and what shows that a worker ran.
_CHECKS = (
    "wide_tf.checks.validate:check_command",
    "wide_tf.checks.validate:check_config",
    "wide_tf.checks.overrides:check_overrides",
    "wide_tf.checks.overrides:check_override_path",
    "wide_tf.checks.preflight:check_workdir",
    "wide_tf.checks.preflight:check_same_study",
    "wide_tf.schema.identity:differing_fields",
    "wide_tf.schema.rules:check",
)
_SPIED = ",".join(_CHECKS + ("wide_tf.study.scheduler:run_worker",))


def _assert_once_per_process(log: str, parent: int, trials: int) -> None:
    """The parent checks once; a worker reads its parent's config and checks nothing, and its
    training runs do not run schema/rules.py's check again (engine/train.py's `checked=True`:
    the cross-field rules run once per study)."""
    by_pid: dict[int, list[str]] = {}
    for line in log.splitlines():
        pid, name = line.split()
        by_pid.setdefault(int(pid), []).append(name)
    assert sorted(by_pid.pop(parent)) == sorted(_CHECKS)
    assert len(by_pid) == 2, by_pid  # the two workers
    assert all(c.count("wide_tf.study.scheduler:run_worker") == 1 for c in by_pid.values()), by_pid
    rules = [n for c in by_pid.values() for n in c if n != "wide_tf.study.scheduler:run_worker"]
    assert rules == [], (trials, by_pid)


def _wait_for(condition, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def _running_claims(workdir):
    return [
        c
        for c in claims.Claims(str(workdir), "x").current().values()
        if c.body["state"] == "running"
    ]


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory):
    ref = tmp_path_factory.mktemp("ref")
    run_main(*SLOW, f"--workdir={ref}", "--workers=1", "--no_report")
    return {r["trial_id"]: comparable(r) for r in wd.read_results(str(ref))}


def test_a_killed_worker_is_reported_and_its_group_taken_over(tmp_path, slow_reference):
    proc = start_main(*SLOW, f"--workdir={tmp_path}", "--workers=2")
    # Kill the owner of the first claim while it trains (its trial has a checkpoint, no result).
    _wait_for(lambda: any(tmp_path.glob("trials/*/checkpoints/*")))
    victim = _running_claims(tmp_path)[0].body["pid"]
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    # Its group was taken over and finished: the study is complete, so the command succeeds.
    assert proc.returncode == 0, err[-3000:]
    (line,) = [ln for ln in err.splitlines() if "exited with status -9, but every group" in ln]
    assert "the study is complete" in line, line
    records = {r["trial_id"]: comparable(r) for r in wd.read_results(str(tmp_path))}
    assert records == slow_reference  # every trial, once, with the same results
    assert any(c.epoch == 1 for c in claims.Claims(str(tmp_path), "x").current().values())
    assert (tmp_path / "report" / "report.md").exists()  # complete: the report was written


def test_sigterm_to_the_parent_stops_every_worker_and_a_rerun_resumes(tmp_path, slow_reference):
    proc = start_main(*SLOW, f"--workdir={tmp_path}", "--workers=2")
    _wait_for(lambda: len(_running_claims(tmp_path)) == 2)
    pids = [c.body["pid"] for c in _running_claims(tmp_path)]
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    for pid in pids:  # the workers are gone too, their claims left free at once
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    logs = "".join((tmp_path / "logs" / n).read_text() for n in os.listdir(tmp_path / "logs"))
    assert logs.count("stopped by SIGTERM") + logs.count("Worker done") >= 2
    run_main(*SLOW, f"--workdir={tmp_path}", "--workers=2", "--no_report")
    records = {r["trial_id"]: comparable(r) for r in wd.read_results(str(tmp_path))}
    assert records == slow_reference


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "two"])
def test_bad_workers_values_are_one_line_and_exit_2(tmp_path, value):
    proc = run_main(*SMOKE, f"--workdir={tmp_path}", f"--workers={value}", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --workers=") and "; " in lines[0]
    assert not tmp_path.joinpath("config.json").exists()  # nothing written


def test_workers_with_trial_or_a_single_run_are_refused():
    config = load_config("configs/mlp.py:smoke")
    with pytest.raises(validate.UsageError, match="--trial"):
        validate.check_workers("2", config, "0")
    with pytest.raises(validate.UsageError, match="needs a study"):
        validate.check_workers("2", load_config("configs/mlp.py:single"), None)
    assert validate.parse_workers(None) is None and validate.parse_workers("3") == 3
