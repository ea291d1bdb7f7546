"""Owns the calls to the Cloud CLI: every gcloud command as an argument list (never a shell string
here), printed as one shell line by the dry run, run with a time limit otherwise; the VM's state
and a queued request's, read with `describe`."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

from wide_tf.launch.options import PROG, Stop, failed

SAFE = re.compile(r"[-A-Za-z0-9_./:=@,+%]+")
TIMED_OUT = 124
# After a limit, the step gets SIGTERM and this long to end before SIGKILL: gcloud passes TERM on
# to the ssh it runs, where a KILL of gcloud alone would leave that ssh behind.
GRACE_S = 10.0
DESCRIBE_S = 120  # a describe that hangs longer (no network) reads as a failed one


def show(cmd: list[str]) -> str:
    """A command as one shell line (words quoted only where needed)."""
    return " ".join(w if SAFE.fullmatch(w) else "'" + w.replace("'", "'\\''") + "'" for w in cmd)


def call(
    cmd: list[str], limit: float | None, capture: bool = False, env=None, grace=GRACE_S, cwd=None
):
    """Runs `cmd` in this process group (an ssh passphrase prompt still reaches the terminal) and
    returns (status, stdout, stderr); past `limit` seconds it is stopped and the status is 124.
    Ctrl-C reaches it from the terminal too; whatever ends this call, the child is gone after it."""
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=env, cwd=cwd) as proc:
        try:
            out, err = proc.communicate(timeout=limit)
            return proc.returncode, out or "", err or ""
        except subprocess.TimeoutExpired:
            _stop(proc, grace)
            return TIMED_OUT, "", ""
        except BaseException:  # Ctrl-C, TERM: the step goes with the launcher
            _stop(proc, grace)
            raise


def _stop(proc: subprocess.Popen, grace: float) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclasses.dataclass
class Vm:
    """A TPU VM as `describe` shows it; state '' when there is no such VM."""

    state: str = ""
    spot: bool = False
    from_queue: bool = False


@dataclasses.dataclass
class Cloud:
    """The Cloud CLI for one zone and project; under `dry_run` it prints instead of calling."""

    gcloud: str
    zone: str
    project: str = ""
    dry_run: bool = False
    comment: bool = False  # the dry run prints a branch it would not take, commented out
    out: object = sys.stdout
    err: object = sys.stderr
    env: dict | None = None  # the environment of every call (None: this process's)
    # How a command runs (call's signature) and how the polls wait: the real ones unless the
    # launcher was given others (command.Outside), as its state machine's tests give.
    execute: Callable = call
    sleep: Callable = time.sleep

    @property
    def where(self) -> list[str]:
        return [f"--zone={self.zone}"] + ([f"--project={self.project}"] if self.project else [])

    def tpu(self, verb: str, *args: str) -> list[str]:
        return [self.gcloud, "compute", "tpus", "tpu-vm", verb, *args]

    def qr(self, verb: str, *args: str) -> list[str]:
        return [self.gcloud, "compute", "tpus", "queued-resources", verb, *args]

    def ssh(self, name: str, worker: str, command: str) -> list[str]:
        return self.tpu("ssh", name, *self.where, f"--worker={worker}", f"--command={command}")

    def print(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def note(self, line: str) -> None:
        print(f"{PROG}: {line}", file=self.err, flush=True)

    def run(self, cmd: list[str], limit: float | None = None, capture: bool = False):
        """The dry run prints `cmd` (status 0); otherwise '+ cmd' on stderr, then the call."""
        if self.dry_run:
            self.print(("#   " if self.comment else "") + show(cmd))
            return 0, "", ""
        self.note_cmd(cmd)
        return self.execute(cmd, limit, capture, self.env)

    def note_cmd(self, cmd: list[str]) -> None:
        print(f"+ {show(cmd)}", file=self.err, flush=True)

    def step(self, cmd: list[str], limit: float, knob: str, what: str) -> int:
        """A remote step with its limit: past it, one line naming the knob, and exit 1."""
        code, _, _ = self.run(cmd, limit)
        if code == TIMED_OUT:
            raise failed(
                f"{what} did not finish in {limit:g}s and was stopped ({knob}=SECONDS sets the "
                "limit)"
            )
        return code

    def need(self) -> None:
        """One line and exit 1, not a 'command not found' in the middle of a launch."""
        if (
            not self.dry_run
            and shutil.which(self.gcloud, path=(self.env or os.environ).get("PATH")) is None
        ):
            raise Stop(
                1,
                f"{PROG}: error: {self.gcloud} is not on PATH; install the Google Cloud CLI "
                "(https://cloud.google.com/sdk/docs/install) and run 'gcloud auth login', or add "
                "--dry_run to print the commands",
            )

    def describe_args(self, name: str) -> list[str]:
        fields = "state,schedulingConfig.spot,schedulingConfig.preemptible,queuedResource"
        return self.tpu("describe", name, *self.where, f"--format=value({fields})")

    def read_vm(self, name: str) -> Vm:
        """The VM's state; any error but NOT_FOUND is one line and exit 1 (with no project set, a
        missing permission or no network, 'not found' would be a lie and a create would follow)."""
        code, out, err = self.execute(self.describe_args(name), DESCRIBE_S, True, self.env)
        if code:
            if "NOT_FOUND" in err:
                return Vm()
            line = next((x for x in err.splitlines() if x.strip()), "no message")
            raise failed(
                f"'gcloud compute tpus tpu-vm describe {name}' failed (exit {code}): {line}; "
                "check --project (or 'gcloud config set project'), --zone and 'gcloud auth login'"
            )
        words = out.split()
        state = words[0] if words else ""
        spot = any(w.lower() == "true" for w in words[1:])
        return Vm(state, spot, "queuedResources/" in out)

    def queue_state(self, name: str, must_exist: bool) -> str:
        """The queued request's state ('' when there is none and `must_exist` is False)."""
        cmd = self.qr("describe", name, *self.where, "--format=value(state.state)")
        code, out, err = self.execute(cmd, DESCRIBE_S, True, self.env)
        if code and not must_exist and "NOT_FOUND" in err:
            return ""
        if code:
            line = next((x for x in err.splitlines() if x.strip()), "no message")
            raise failed(
                f"'gcloud compute tpus queued-resources describe {name}' failed (exit {code}): "
                f"{line}"
            )
        return out.strip()

    def delete(self, name: str, queued: bool) -> int:
        """The VM, or its queued request with it (--force deletes the request's nodes too)."""
        if queued:
            return self.run(self.qr("delete", name, *self.where, "--force", "--quiet"))[0]
        return self.run(self.tpu("delete", name, *self.where, "--quiet"))[0]

    def head_address(self, name: str) -> str:
        """Worker 0's internal IP address (the Ray head's), or HEAD_IP in the dry run."""
        fmt = "--format=value(networkEndpoints[0].ipAddress)"
        cmd = self.tpu("describe", name, *self.where, fmt)
        if self.dry_run:
            self.print(f"# the Ray head's address (HEAD_IP below): {show(cmd)}")
            return "HEAD_IP"
        code, out, err = self.execute(cmd, DESCRIBE_S, True, self.env)
        if code or not out.strip():
            raise failed(f"could not read {name}'s internal address (exit {code}): {err.strip()}")
        return out.strip()
