"""The launcher against the VM states it finds (READY, PREEMPTED, STOPPED, in transition, a
describe error), queued requests (waiting, FAILED, left SUSPENDED by a preempted spot node) and
--watch (relaunches, failures, --delete_when_done however the launch ends, the first one
included), the limits on remote steps, the watchdog, Ctrl-C, SIGTERM and the kept spot choice,
with the fake `gcloud` of tests/fake_gcloud.py; the state machine's two functions from a table.
The launcher runs in this process (tests/launch_harness.py); the Ctrl-C and SIGTERM cases start it
as a process with the fake on PATH, and gcloud.call stops a real step past its limit."""

import contextlib
import os
import pathlib
import subprocess
import sys
import time

import pytest
from helpers import REPO
from launch_harness import REQUIRED, _verbs, calls_of, fake_env, make_fake

from wide_tf.launch import gcloud, machine, remote


@pytest.fixture
def fake(tmp_path):
    """The launcher against the fake gcloud: (result, the recorded calls); see make_fake."""
    return make_fake(tmp_path)


def test_relaunch_onto_a_running_study_is_refused_before_touching_anything(fake):
    p, calls = fake(*REQUIRED, state="READY", running=True)
    assert p.returncode == 3
    assert "a run is active on wide-v4 (4242)" in p.stderr
    assert _verbs(calls) == [("describe", None), ("check", "--worker=0")]


def test_relaunch_onto_an_idle_ready_vm_reuses_it(fake):
    p, calls = fake(*REQUIRED, state="READY")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "check",
        "scp",
        "install",
        "start",
        "check",
    ]


def test_relaunch_onto_a_preempted_vm_recreates_it_and_remembers_spot(fake):
    # No --spot this time: the VM was a spot VM, so it stays one.
    p, calls = fake(*REQUIRED, state="PREEMPTED", spot=True)
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "delete",
        "create",
        "scp",
        "install",
        "start",
        "check",
    ]
    assert calls[1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]
    assert calls[2][-1] == "--spot"
    assert "resumes from gs://bucket/wrn" in p.stderr and "it stays one" in p.stderr
    p, calls = fake(*REQUIRED, "--no_spot", state="PREEMPTED", spot=True)
    assert p.returncode == 0 and "--spot" not in calls[2]


def test_a_stopped_vm_is_started(fake):
    p, calls = fake(*REQUIRED, state="STOPPED")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "start",
        "scp",
        "install",
        "start",
        "check",
    ]
    assert calls[1] == ["start", "wide-v4", "--zone=us-central2-b"]


@pytest.mark.parametrize("state", ["CREATING", "REPAIRING", "STOPPING"])
def test_a_vm_in_transition_is_refused(fake, state):
    p, calls = fake(*REQUIRED, state=state)
    assert p.returncode == 3 and f"is {state}" in p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe"]


def test_a_run_that_dies_at_once_is_reported(fake):
    p, calls = fake(*REQUIRED, checks=["exited 2"])
    assert p.returncode == 1
    assert "is not running (wide_tf: exited 2)" in p.stderr.splitlines()[-2]
    assert "wide-v4 is still billed while it exists" in p.stderr.splitlines()[-1]
    assert _verbs(calls)[-1] == ("tail", "--worker=0")


def test_describe_errors_other_than_not_found_are_reported(fake):
    err = "ERROR: (gcloud.compute.tpus.tpu-vm.describe) The required property [project] is not set"
    env = {"FAKE_DESCRIBE_ERROR": err}
    for args in (REQUIRED, ["--name=wide-v4", "--status"]):
        p, calls = fake(*args, env=env)
        assert p.returncode == 1, p.stderr
        line = p.stderr.strip().splitlines()[-1]
        assert "describe wide-v4' failed (exit 1)" in line and "[project] is not set" in line
        assert "--project" in line and [v for v, _ in _verbs(calls)] == ["describe"]
    p, calls = fake("--name=wide-v4", "--status")  # NOT_FOUND: there is no such VM
    assert p.returncode == 0 and "not found" in p.stdout


def test_queued_spot_launch_waits_for_active(fake):
    (fake.tmp_path / "qr_states").write_text('["WAITING_FOR_RESOURCES", "PROVISIONING"]')
    p, calls = fake(
        *REQUIRED, "--accelerator=v5litepod-8", "--zone=us-west4-a", "--spot", "--queued"
    )
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)][:6] == [
        "describe",
        "qr-describe",  # no request of that name left over (NOT_FOUND)
        "qr-create",
        "qr-describe",
        "qr-describe",
        "qr-describe",
    ]
    assert calls[2] == [
        "qr-create",
        "wide-v4",
        "--zone=us-west4-a",
        "--node-id=wide-v4",
        "--accelerator-type=v5litepod-8",
        "--runtime-version=v2-alpha-tpuv5-lite",
        "--spot",
    ]
    assert "queued resource wide-v4: PROVISIONING" in p.stderr
    # The request polled every 300 s (WIDE_TF_POLL_S) until ACTIVE; the run checked alive 30 s
    # after its start (WIDE_TF_ALIVE_WAIT_S).
    assert p.waits == [300, 300, 30]


def test_a_failed_queued_request_is_an_error(fake):
    (fake.tmp_path / "qr_states").write_text('["FAILED"]')
    p, calls = fake(*REQUIRED, "--queued")
    assert p.returncode == 1 and "is FAILED" in p.stderr.splitlines()[-1]
    assert [v for v, _ in _verbs(calls)] == ["describe", "qr-describe", "qr-create", "qr-describe"]


def test_watch_relaunches_after_a_preemption_and_deletes_when_done(fake):
    # Launch; the first poll finds the VM preempted (a queued spot one): delete the request,
    # queue it again as spot, start; the next poll finds the run exited 0: delete it.
    p, calls = fake(
        *REQUIRED,
        "--spot",
        "--queued",
        "--watch",
        "--delete_when_done",
        states=["", "PREEMPTED"],
        checks=["running 1", "running 2", "exited 0"],
    )
    assert p.returncode == 0, p.stderr
    relaunch = ["qr-describe", "qr-create", "qr-describe", "scp", "install", "start", "check"]
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        *relaunch,
        "describe",  # poll 1: PREEMPTED
        "describe",  # the launch again reads it too
        "qr-delete",
        *relaunch,
        "describe",  # poll 2: READY
        "check",  # exited 0
        "qr-delete",  # on exit (--delete_when_done)
    ]
    creates = [c for c in calls if c[0] == "qr-create"]
    assert len(creates) == 2 and all(c[-1] == "--spot" for c in creates)
    assert calls[-1] == ["qr-delete", "wide-v4", "--zone=us-central2-b", "--force", "--quiet"]
    assert "the study is done on wide-v4" in p.stderr
    assert p.waits == [30, 300, 30, 300]  # alive check after each start; a poll every 5 minutes


def test_a_spot_node_gone_with_its_request_suspended_is_requeued_after_a_delete(fake):
    # The first poll finds the node gone (Google deleted the preempted spot node); its queued
    # request is left SUSPENDED, which is not eligible for allocation. Before: a new request was
    # queued under the old name beside it. Now the old one is deleted first.
    p, calls = fake(
        *REQUIRED,
        "--spot",
        "--queued",
        "--watch",
        states=["", ""],
        checks=["running 1", "running 2", "exited 0"],
    )
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    second = verbs.index("qr-create", verbs.index("qr-create") + 1)
    assert verbs[second - 3 : second + 1] == ["describe", "qr-describe", "qr-delete", "qr-create"]
    assert calls[second - 1] == [
        "qr-delete",
        "wide-v4",
        "--zone=us-central2-b",
        "--force",
        "--quiet",
    ]
    assert "is SUSPENDED without its node; deleting it before queueing again" in p.stderr


def test_a_request_still_queued_is_waited_for_not_queued_twice(fake):
    # A launch stopped while its request waited (Ctrl-C), then run again: no second request.
    (fake.tmp_path / "qr_states").write_text('["WAITING_FOR_RESOURCES", "ACTIVE"]')
    p, calls = fake(*REQUIRED, "--queued", request="WAITING_FOR_RESOURCES")
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs[:4] == ["describe", "qr-describe", "qr-describe", "scp"]
    assert "qr-create" not in verbs and "qr-delete" not in verbs
    assert "is WAITING_FOR_RESOURCES; waiting for it instead of queueing again" in p.stderr


def test_watch_deletes_when_done_even_when_a_relaunch_fails(fake):
    # The first poll finds the VM preempted; the relaunch's run dies at once (exit 2): the launch
    # fails. Before, that exit came before the delete and the VM kept billing.
    p, calls = fake(
        *REQUIRED,
        "--watch",
        "--delete_when_done",
        states=["", "PREEMPTED"],
        checks=["running 1", "exited 2"],
    )
    assert p.returncode == 1, p.stderr
    assert "is not running (wide_tf: exited 2)" in p.stderr
    assert calls[-1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]
    assert "deleting wide-v4 (--delete_when_done; the launch ended with exit 1)" in p.stderr
    # Without --delete_when_done the VM stays (and the launcher says it is billed).
    p, calls = fake(
        *REQUIRED, "--watch", states=["", "PREEMPTED"], checks=["running 1", "exited 2"]
    )
    assert p.returncode == 1 and _verbs(calls)[-1] != ("delete", None)


def test_watch_stops_on_a_failed_study_and_attaches_to_a_running_one(fake):
    p, calls = fake(
        *REQUIRED, "--watch", state="READY", running=True, checks=["running 7", "exited 1"]
    )
    # Attached to the active run (no new start); the poll then finds it exited 1: failed.
    assert p.returncode == 1, p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe", "check", "describe", "check"]
    assert "watching it" in p.stderr and "the study failed on wide-v4" in p.stderr
    assert "still billed" in p.stderr.splitlines()[-1]


def test_watch_launches_again_after_a_run_exits_143(fake):
    p, calls = fake(
        *REQUIRED,
        "--watch",
        checks=["running 1", "exited 143", "exited 143", "running 2", "exited 0"],
    )
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)].count("start") == 2
    assert "stopped (exited 143); launching again" in p.stderr


# A failed or hung first launch kept billing.


def test_a_failed_first_launch_deletes_the_vm(fake):
    # Before: the delete was armed only once the watch began; a run that died at once on the first
    # launch exited 1 with the VM up.
    p, calls = fake(*REQUIRED, "--watch", "--delete_when_done", checks=["exited 2"])
    assert p.returncode == 1
    assert "is not running (wide_tf: exited 2)" in p.stderr
    assert calls[-1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]
    assert "deleting wide-v4 (--delete_when_done; the launch ended with exit 1)" in p.stderr
    # --keep_on_failure keeps it for debugging, and says it is billed.
    p, calls = fake(
        *REQUIRED, "--watch", "--delete_when_done", "--keep_on_failure", checks=["exited 2"]
    )
    assert p.returncode == 1 and "delete" not in [v for v, _ in _verbs(calls)]
    assert "kept for debugging (--keep_on_failure)" in p.stderr
    assert "wide-v4 is still billed while it exists" in p.stderr.splitlines()[-1]


def test_a_failed_create_is_deleted_or_named_with_its_bill(fake):
    """gcloud create can fail after a node was made: the launch stops (exit 1) and the node is
    deleted under --delete_when_done, or named with the command that deletes it."""
    env = {"FAKE_CREATE_EXIT": "1"}
    p, calls = fake(*REQUIRED, "--watch", "--delete_when_done", env=env)
    assert p.returncode == 1 and "creating wide-v4 failed" in p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe", "create", "delete"]
    p, calls = fake(*REQUIRED, env=env)
    assert p.returncode == 1 and [v for v, _ in _verbs(calls)] == ["describe", "create"]
    assert "wide-v4 is still billed while it exists" in p.stderr.splitlines()[-1]


def test_a_refused_launch_leaves_someone_elses_vm_alone(fake):
    p, calls = fake(*REQUIRED, "--watch", "--delete_when_done", state="CREATING")
    assert p.returncode == 3 and [v for v, _ in _verbs(calls)] == ["describe"]
    assert "billed" not in p.stderr


@pytest.mark.parametrize(
    "hang, knob, what",
    [
        ("tpucheck", "WIDE_TF_CHECK_TIMEOUT_S", "--check on wide-v4 did not finish in 0.5s"),
        ("install", "WIDE_TF_INSTALL_TIMEOUT_S", "the install on wide-v4 did not finish in 0.5s"),
        ("start", "WIDE_TF_SSH_TIMEOUT_S", "the start on wide-v4 did not finish in 0.5s"),
    ],
)
def test_a_hung_step_times_out_and_deletes(fake, hang, knob, what):
    # Before: no ssh step had a limit; a hung --check kept the launcher (and the VM) forever. The
    # fake's step never answers; gcloud.call's stop past the limit is
    # test_a_step_past_its_limit_is_stopped's.
    p, calls = fake(
        *REQUIRED,
        "--check",
        "--watch",
        "--delete_when_done",
        env={"FAKE_HANG": hang, knob: "0.5"},
    )
    assert p.stopped == [0.5]  # the hung step was given the knob's limit
    assert p.returncode == 1, p.stderr
    assert what in p.stderr and f"({knob}=SECONDS sets the limit)" in p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs[-1] == "delete" and "start" not in verbs[verbs.index(hang) + 1 :]


def test_a_step_past_its_limit_is_stopped(tmp_path):
    """gcloud.call, which runs every step: the fake gcloud on PATH with its install hung is stopped
    at the limit (status 124) and gone; a step that ignores SIGTERM is killed once the grace after
    it has passed (gcloud passes TERM on to its ssh, so TERM comes first)."""
    make_fake(tmp_path)
    env = fake_env(tmp_path, {"FAKE_HANG": "install"})
    ssh = ["compute", "tpus", "tpu-vm", "ssh", "wide-v4", "--worker=all"]
    cmd = [str(tmp_path / "bin" / "gcloud"), *ssh, "--command=bash ~/wide_tf/vm_setup.sh"]
    t = time.monotonic()
    assert gcloud.call(cmd, 0.3, env=env) == (gcloud.TIMED_OUT, "", "")
    assert 0.3 <= time.monotonic() - t < 10
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
    name = f"wide_tf_ignores_term_{os.getpid()}"
    t = time.monotonic()
    stubborn = ["bash", "-c", f"trap '' TERM; exec -a {name} sleep 30"]
    assert gcloud.call(stubborn, 0.2, capture=True, grace=0.1)[0] == gcloud.TIMED_OUT
    assert 0.3 <= time.monotonic() - t < 10
    left = subprocess.run(["pgrep", "-f", name], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def test_a_stuck_study_is_caught_by_the_watchdog(fake):
    # The run is alive, but its log has not changed for 7 s with a 5 s limit: stuck, so the watch
    # fails and the VM is deleted. Before, --watch checked only that the pid lived.
    p, calls = fake(
        *REQUIRED,
        "--watch",
        "--delete_when_done",
        checks=["running 1 idle 0", "running 1 idle 3", "running 1 idle 7"],
        env={"WIDE_TF_STALL_S": "5"},
    )
    assert p.returncode == 1, p.stderr
    assert "no progress on wide-v4: the run's log has not changed for 7s" in p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs[-2:] == ["tail", "delete"] and verbs.count("check") == 3


def test_a_run_waiting_for_groups_held_elsewhere_is_not_stuck(fake):
    p, calls = fake(
        *REQUIRED,
        "--watch",
        checks=["running 1 idle 0", "running 1 idle 900 waiting", "exited 0"],
        env={"WIDE_TF_STALL_S": "5"},
    )
    assert p.returncode == 0, p.stderr
    assert "the study is done on wide-v4" in p.stderr


def test_the_pid_check_reports_the_logs_idle_seconds(tmp_path):
    """The remote check itself (run here by sh on a fake home): a live wide_tf.main process, its
    log 40 s old, the last line 'No group free: waiting' -> 'running PID idle 40 waiting'."""
    import re

    check = remote.PID_CHECK.replace("~/", f"{tmp_path}/")
    logs = tmp_path / "wide_tf_logs"
    logs.mkdir()
    (logs / "run.log").write_text("x\nNo group free: waiting for 3 held by others.\n")
    (logs / "latest.log").symlink_to(logs / "run.log")
    old = time.time() - 40
    os.utime(logs / "run.log", (old, old))
    proc = subprocess.Popen(
        ["bash", "-c", "exec -a wide_tf.main sleep 30"], stdout=subprocess.DEVNULL
    )
    try:
        (tmp_path / "wide_tf.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 30
        cmdline = pathlib.Path(f"/proc/{proc.pid}/cmdline")
        while not cmdline.read_bytes().startswith(b"wide_tf.main\0"):
            assert time.monotonic() < deadline  # bash has not yet exec'd the named sleep
            time.sleep(0.005)
        out = subprocess.run(["sh", "-c", check], capture_output=True, text=True).stdout
    finally:
        proc.kill()
        proc.wait()
    m = re.fullmatch(rf"wide_tf: running {proc.pid} idle (\d+) waiting\n", out)
    assert m and 39 <= int(m.group(1)) <= 45, out
    (tmp_path / "wide_tf.exit").write_text("143\n")
    out = subprocess.run(["sh", "-c", check], capture_output=True, text=True).stdout
    assert out == "wide_tf: exited 143\n"


def test_a_relaunch_after_google_deleted_a_preempted_spot_node_stays_spot(fake):
    # Google deletes a preempted spot node; `describe` then says NOT_FOUND and a manual
    # relaunch without --spot created an on-demand VM, although docs/tpu.md said the choice is
    # kept. Now this machine keeps the choice it made (or last saw) per project, zone and name.
    p, calls = fake(*REQUIRED, "--spot")
    assert p.returncode == 0 and calls[1][-1] == "--spot"
    p, calls = fake(*REQUIRED)  # the node is gone: no such VM
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)][:2] == ["describe", "create"] and calls[1][-1] == "--spot"
    assert "wide-v4 was last a spot VM" in p.stderr and "--no_spot to change" in p.stderr
    p, calls = fake(*REQUIRED, "--no_spot")  # says otherwise, and is remembered in turn
    assert p.returncode == 0 and "--spot" not in calls[1]
    assert (fake.tmp_path / "state" / "spot-default-us-central2-b-wide-v4").read_text() == "0\n"


# The fake's hung steps (FAKE_HANG) and what their gcloud call's command line contains.
_HUNG_STEP_CALL = {"install": "vm_setup.sh", "tpucheck": "vm.tpu_check"}


def _signal_during_a_hung_step(tmp_path, *flags, step="install", sig=None):
    """Runs `python -m wide_tf.launch` with the fake's `step` hung, sends `sig` (SIGINT to the
    launcher's process group, as Ctrl-C in a terminal does, by default) once that step has
    started, and returns (exit status, stderr, the calls) once every process of it has ended. The
    config is not checked here (--no_validate): test_the_shim_runs_the_python_launcher runs that
    check as a process."""
    import signal

    make_fake(tmp_path)  # writes the fake gcloud
    env = fake_env(tmp_path, {"FAKE_HANG": step, "PYTHONPATH": str(REPO)})
    # A signal mask is inherited: a test process that left SIGINT blocked would start a launcher
    # that never sees the Ctrl-C. The launcher starts as from a terminal: nothing blocked.
    as_from_a_terminal = (
        "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
        "signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "signal.signal(signal.SIGTERM, signal.SIG_DFL); "
        "os.execv(sys.executable, [sys.executable, '-m', 'wide_tf.launch', *sys.argv[1:]])"
    )
    (tmp_path / "calls.jsonl").write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-c", as_from_a_terminal, *flags, "--watch", "--delete_when_done"]
        + ["--no_validate"],
        env=env,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while _HUNG_STEP_CALL[step] not in (tmp_path / "calls.jsonl").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    time.sleep(0.05)  # the call is on record: the launcher is waiting on its step
    try:
        if sig is None:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=30)
        alive = subprocess.run(["pgrep", "-a", "-s", str(proc.pid)], capture_output=True, text=True)
        assert alive.stdout.strip() == "", alive.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err + out, calls_of(tmp_path / "calls.jsonl")


def test_ctrl_c_during_a_hung_step_stops_it_and_deletes(tmp_path):
    """Ctrl-C reaches the launcher and its step (one process group): the step is stopped, and
    --delete_when_done deletes the VM in the launcher's finally."""
    code, err, calls = _signal_during_a_hung_step(tmp_path, *REQUIRED)
    assert code == 130, err
    assert "deleting wide-v4 (--delete_when_done; the launch ended with exit 130)" in err
    assert calls[-1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]


def test_ctrl_c_during_the_tpu_check_stops_it_and_deletes(tmp_path):
    code, err, calls = _signal_during_a_hung_step(tmp_path, *REQUIRED, "--check", step="tpucheck")
    assert code == 130, err
    assert calls[-1][0] == "delete" and "the launch ended with exit 130" in err


def test_sigterm_stops_the_step_and_deletes(tmp_path):
    """SIGTERM to the launcher alone (a batch system ending it): its step is stopped (TERM, then
    KILL after a grace) and the VM deleted; exit 143."""
    import signal

    code, err, calls = _signal_during_a_hung_step(tmp_path, *REQUIRED, sig=signal.SIGTERM)
    assert code == 143, err
    assert calls[-1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]


def test_ctrl_c_during_a_sharded_launch_deletes_every_vm_it_made(tmp_path):
    """--shards=2: Ctrl-C while the first VM installs deletes it; the second was never made."""
    code, err, calls = _signal_during_a_hung_step(tmp_path, *REQUIRED, "--shards=2")
    assert code == 130, err
    assert ["delete", "wide-v4-0", "--zone=us-central2-b", "--quiet"] in calls
    assert not any(c[1] == "wide-v4-1" for c in calls if c[0] in ("create", "delete"))


# The state machine: (the VM's state, its run check, --watch) -> what the launch does.
VM_TABLE = [
    ("", "", False, "create"),
    ("PREEMPTED", "", False, "recreate"),
    ("TERMINATED", "", True, "recreate"),
    ("STOPPED", "", False, "start"),
    ("READY", "wide_tf: no run active", False, "reuse"),
    ("READY", "wide_tf: exited 0", False, "reuse"),
    ("READY", "wide_tf: running 42 idle 3", False, "refuse_active"),
    ("READY", "wide_tf: running 42 idle 3", True, "attach"),
    ("CREATING", "", True, "refuse_settling"),
    ("REPAIRING", "", False, "refuse_settling"),
    ("STOPPING", "", False, "refuse_settling"),
]


@pytest.mark.parametrize("state, run, watch, action", VM_TABLE)
def test_what_a_launch_does_with_the_vm_it_finds(state, run, watch, action):
    assert machine.vm_step(state, run, watch) == action


# (the VM's state, the run check, the stall limit) -> what a watch does after a poll.
WATCH_TABLE = [
    ("READY", "wide_tf: running 7 idle 0", 5, "wait"),
    ("READY", "wide_tf: running 7 idle 7", 5, "stuck"),
    ("READY", "wide_tf: running 7 idle 7", 0, "wait"),  # --stall_minutes=0: no watchdog
    ("READY", "wide_tf: running 7 idle 900 waiting", 5, "wait"),  # groups held elsewhere
    ("READY", "wide_tf: exited 0", 5, "done"),
    ("READY", "wide_tf: exited 143", 5, "relaunch"),
    ("READY", "wide_tf: no run active", 5, "relaunch"),  # a maintenance reboot
    ("READY", "wide_tf: exited 1", 5, "failed"),
    ("PREEMPTED", "", 5, "relaunch"),
    ("TERMINATED", "", 5, "relaunch"),
    ("STOPPED", "", 5, "relaunch"),
    ("", "", 5, "relaunch"),
    ("REPAIRING", "", 5, "wait"),
    ("CREATING", "", 5, "wait"),
]


@pytest.mark.parametrize("state, answer, stall, step", WATCH_TABLE)
def test_what_a_watch_does_after_a_poll(state, answer, stall, step):
    assert machine.watch_step(state, answer, stall) == step


def _ssh_steps(calls):
    """(verb, VM) of every call but the describes, the Ray starts named head or join."""
    out = []
    for c, (verb, _) in zip(calls, _verbs(calls)):
        if verb == "ray":
            verb = "ray-head" if "--head" in c[-1] else "ray-join"
        if verb != "describe":
            out.append((verb, c[2].split(":")[0] if verb == "scp" else c[1]))
    return out


def test_watch_brings_a_preempted_ray_worker_back_into_the_cluster(fake):
    p, calls = fake(
        "--name=wide", *REQUIRED[1:], "--shards=2", "--watch", "--delete_when_done",
        states=["", "", "READY", "PREEMPTED"],
        checks=["running 1", "running 1", "exited 0"],
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    steps = _ssh_steps(calls)
    poll = steps.index(("check", "wide-0"), steps.index(("start", "wide-0")) + 2)
    # the worker alone: deleted, created, installed, joined to the same head; no second start
    assert steps[poll + 1 :] == [
        ("delete", "wide-1"), ("create", "wide-1"), ("scp", "wide-1"), ("install", "wide-1"),
        ("ray-join", "wide-1"), ("check", "wide-0"), ("delete", "wide-0"), ("delete", "wide-1"),
    ]  # fmt: skip
    assert "TPU VM wide-1 is PREEMPTED; launching again" in p.stderr


def test_watch_rebuilds_the_cluster_around_a_new_head_and_resubmits(fake):
    p, calls = fake(
        "--name=wide", *REQUIRED[1:], "--shards=2", "--watch",
        states=["", "", "PREEMPTED", "READY"],
        checks=["running 1", "running 2", "exited 0"],
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    steps = _ssh_steps(calls)
    again = steps.index(("delete", "wide-0"))
    assert steps[again:] == [
        ("delete", "wide-0"), ("create", "wide-0"), ("scp", "wide-0"), ("install", "wide-0"),
        ("ray-head", "wide-0"), ("ray-join", "wide-1"), ("start", "wide-0"), ("check", "wide-0"),
        ("check", "wide-0"),
    ]  # fmt: skip
    assert "TPU VM wide-0 is PREEMPTED; launching again" in p.stderr
    # done without --delete_when_done: both VMs named with their bill
    assert p.stderr.count("is still billed while it exists") == 2
