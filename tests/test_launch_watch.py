"""launch_tpu.sh against the VM states it finds (READY, PREEMPTED, STOPPED, in transition, a
describe error), queued requests (waiting, FAILED, left SUSPENDED by a preempted spot node) and
--watch (relaunches, failures, --delete_when_done however the launch ends, the first one
included), the limits on remote steps, the watchdog, Ctrl-C and the kept spot choice, with the
fake `gcloud` of tests/fake_gcloud.py."""

import contextlib
import os
import sys
import time

import pytest
from fake_gcloud import REQUIRED, _verbs, make_fake


@pytest.fixture
def fake(tmp_path):
    """The launcher against the fake gcloud: (process, the recorded calls); see make_fake."""
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


def test_a_refused_launch_leaves_someone_elses_vm_alone(fake):
    p, calls = fake(*REQUIRED, "--watch", "--delete_when_done", state="CREATING")
    assert p.returncode == 3 and [v for v, _ in _verbs(calls)] == ["describe"]
    assert "billed" not in p.stderr


@pytest.mark.parametrize(
    "hang, knob, what",
    [
        ("tpucheck", "WIDE_TF_CHECK_TIMEOUT_S", "--check on wide-v4 did not finish in 1s"),
        ("install", "WIDE_TF_INSTALL_TIMEOUT_S", "the install on wide-v4 did not finish in 1s"),
        ("start", "WIDE_TF_SSH_TIMEOUT_S", "the start on wide-v4 did not finish in 1s"),
    ],
)
def test_a_hung_step_times_out_and_deletes(fake, hang, knob, what):
    # Before: no ssh step had a limit; a hung --check kept the launcher (and the VM) forever.
    t = time.monotonic()
    p, calls = fake(
        *REQUIRED,
        "--check",
        "--watch",
        "--delete_when_done",
        env={"FAKE_HANG": hang, knob: "1"},
    )
    assert time.monotonic() - t < 30
    assert p.returncode == 1, p.stderr
    assert what in p.stderr and f"({knob}=SECONDS sets the limit)" in p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs[-1] == "delete" and "start" not in verbs[verbs.index(hang) + 1 :]


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
    """The remote check itself (run here by bash on a fake home): a live wide_tf.main process, its
    log 40 s old, the last line 'No group free: waiting' -> 'running PID idle 40 waiting'."""
    import re
    import subprocess

    from fake_gcloud import SCRIPT

    text = SCRIPT.read_text()
    check = re.search(r'readonly PID_CHECK="(.*)"\n', text).group(1)
    check = check.replace('\\"', '"').replace("\\$", "$")
    for var, name in (
        ("R_PID", "wide_tf.pid"),
        ("R_EXIT", "wide_tf.exit"),
        ("R_LOGS", "wide_tf_logs"),
    ):
        check = check.replace(f"${var}", f"{tmp_path}/{name}")
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
        time.sleep(0.2)
        out = subprocess.run(["bash", "-c", check], capture_output=True, text=True).stdout
    finally:
        proc.kill()
        proc.wait()
    m = re.fullmatch(rf"wide_tf: running {proc.pid} idle (\d+) waiting\n", out)
    assert m and 39 <= int(m.group(1)) <= 45, out


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
_HUNG_STEP_CALL = {"install": "pip install", "tpucheck": "initialize_tpu_system"}


def _ctrl_c_during_a_hung_step(fake, tmp_path, *flags, starts=1, step="install"):
    """Launches with the fake's `step` hung, sends Ctrl-C (SIGINT to the launcher's process
    group) once `starts` such steps have started, and returns (exit status, stderr, the calls)
    once every process of the launch has ended (stderr with stdout after it: --shards prints each
    shard's lines there)."""
    import signal
    import subprocess

    from fake_gcloud import SCRIPT

    fake(*REQUIRED, "--dry_run")  # writes the fake's files; then run it by hand, to interrupt it
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "FAKE_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "WIDE_TF_STATE_DIR": str(tmp_path / "state"),
        "PYTHON": sys.executable,
        "WIDE_TF_POLL_S": "0",
        "WIDE_TF_ALIVE_WAIT_S": "0",
        "FAKE_HANG": step,
    }
    (tmp_path / "calls.jsonl").write_text("")

    # A signal mask is inherited: a test process that an earlier test (or a library) left with
    # SIGINT blocked would start a launcher that never sees the Ctrl-C (a hang of this test, shown
    # with SIGINT blocked on purpose). The launcher starts as a terminal starts it: nothing
    # blocked, SIGINT and SIGTERM at their defaults, set by a small Python that then execs bash
    # (the mask and the defaults survive exec; a preexec_fn is unsafe in a threaded process).
    as_from_a_terminal = (
        "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
        "signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "signal.signal(signal.SIGTERM, signal.SIG_DFL); "
        "os.execvp('bash', ['bash', *sys.argv[1:]])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", as_from_a_terminal, str(SCRIPT), *flags]
        + ["--watch", "--delete_when_done"],
        env=env,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while (tmp_path / "calls.jsonl").read_text().count(_HUNG_STEP_CALL[step]) < starts:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        # The hung step (a minute) holds the launcher's pipes while it lives: stopped, they close.
        out, err = proc.communicate(timeout=30)
        for _ in range(30):  # the limit's watcher notices within a second that its step is gone
            alive = subprocess.run(
                ["pgrep", "-a", "-s", str(proc.pid)], capture_output=True, text=True
            )
            if not alive.stdout.strip():
                break
            time.sleep(0.2)
        assert alive.stdout.strip() == "", alive.stdout
    finally:
        # A launcher that failed this test must not outlive it: on the old script the shards
        # went on watching (a busy loop at WIDE_TF_POLL_S=0) for as long as the machine ran.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err + out, (tmp_path / "calls.jsonl").read_text().splitlines()


def test_ctrl_c_during_a_hung_step_stops_it_and_deletes(fake, tmp_path):
    """A step started in the background ignores SIGINT; Ctrl-C must still stop it, and
    --delete_when_done delete the VM."""
    code, err, calls = _ctrl_c_during_a_hung_step(fake, tmp_path, *REQUIRED)
    assert code == 130, err
    assert "deleting wide-v4 (--delete_when_done; the launch ended with exit 130)" in err
    assert '"delete"' in calls[-1]


def test_ctrl_c_during_a_hung_step_inside_a_command_substitution_stops_it_and_deletes(
    fake, tmp_path
):
    """The TPU check runs in a $(...) subshell, which does not keep the script's traps: its limit
    arms its own, so Ctrl-C stops the check too."""
    code, err, calls = _ctrl_c_during_a_hung_step(
        fake, tmp_path, *REQUIRED, "--check", step="tpucheck"
    )
    assert code == 130, err
    assert "deleting wide-v4 (--delete_when_done; the launch ended with exit 130)" in err
    assert '"delete"' in calls[-1]


def test_ctrl_c_during_a_sharded_launch_stops_every_shard_and_deletes_its_vm(fake, tmp_path):
    """--shards=2 runs a launcher per VM in the background, where bash ignores SIGINT (and their
    own traps on it): Ctrl-C must stop both (TERM from the parent), each deleting its VM."""
    code, err, calls = _ctrl_c_during_a_hung_step(fake, tmp_path, *REQUIRED, "--shards=2", starts=2)
    assert code == 130, err
    for vm in ("wide-v4-0", "wide-v4-1"):
        line = (
            f"[{vm}] launch_tpu.sh: deleting {vm} "
            "(--delete_when_done; the launch ended with exit 143)"
        )
        assert line in err, err
        assert any('"delete"' in c and f'"{vm}"' in c for c in calls), calls
