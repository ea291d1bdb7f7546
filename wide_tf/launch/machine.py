"""Owns the launch's state machine: what a launch does with the VM it finds (create, delete and
create again, start, reuse, attach, refuse) and what a watch does with what it polls (wait, done,
launch again, failed, stuck) as two pure functions of the state; and the steps that carry them
out on one VM: create (or queue), copy, install, check, start, the run checked alive."""

from __future__ import annotations

import dataclasses
import re

from wide_tf.launch import remote
from wide_tf.launch.gcloud import TIMED_OUT, Cloud, Vm, show
from wide_tf.launch.options import PROG, Options, failed, refused, usage_error
from wide_tf.launch.software import Software

EXIT_PREEMPTED = 143  # wide_tf.main after SIGTERM (wide_tf/engine/preemption.py)
GONE = ("PREEMPTED", "TERMINATED", "STOPPED", "")


def vm_step(state: str, run: str, watch: bool) -> str:
    """What a launch does with a VM in `state` ('' = none) whose run check said `run`:
    create | recreate (delete, then create: a preempted spot TPU cannot be restarted) | start |
    reuse | attach (--watch follows the active run) | refuse_active | refuse_settling."""
    if state == "":
        return "create"
    if state in ("PREEMPTED", "TERMINATED"):
        return "recreate"
    if state == "STOPPED":
        return "start"
    if state == "READY":
        if "wide_tf: running" in run:
            return "attach" if watch else "refuse_active"
        return "reuse"
    return "refuse_settling"  # CREATING, REPAIRING, STOPPING, ...: wait for it to settle


def watch_step(state: str, answer: str, stall_s: int) -> str:
    """What a watch does after a poll: wait | done | relaunch | failed | stuck. READY and running:
    wait, unless its log has not changed for `stall_s` (0: never) and it is not waiting for groups
    held elsewhere; exited 0: done; exited 143 or no run (a maintenance reboot), or the VM
    preempted, stopped or gone: relaunch; exited otherwise: failed (it would fail again)."""
    if state != "READY":
        return "relaunch" if state in GONE else "wait"
    if "wide_tf: running" in answer:
        m = re.search(r"idle ([0-9]+)", answer)
        idle = int(m.group(1)) if m else 0
        stuck = stall_s > 0 and idle >= stall_s and "waiting" not in answer
        return "stuck" if stuck else "wait"
    if "wide_tf: exited 0" in answer:
        return "done"
    if f"wide_tf: exited {EXIT_PREEMPTED}" in answer or "wide_tf: no run active" in answer:
        return "relaunch"
    return "failed"


@dataclasses.dataclass
class Limits:
    """Seconds: between polls, before the after-start check, and the limit of each remote step
    (the install: uv, Python and about 1 GB of wheels; --check: the TPU system and the :check
    study's compiles; every other ssh or scp); WIDE_TF_* in the environment sets each."""

    poll: float = 300
    alive_wait: float = 30
    install: float = 2400
    check: float = 1800
    ssh: float = 300
    max_relaunches: int = 50

    @classmethod
    def from_env(cls, env) -> Limits:
        knobs = {
            "poll": "WIDE_TF_POLL_S",
            "alive_wait": "WIDE_TF_ALIVE_WAIT_S",
            "install": "WIDE_TF_INSTALL_TIMEOUT_S",
            "check": "WIDE_TF_CHECK_TIMEOUT_S",
            "ssh": "WIDE_TF_SSH_TIMEOUT_S",
            "max_relaunches": "WIDE_TF_MAX_RELAUNCHES",
        }
        out = cls()
        for field, knob in knobs.items():
            if env.get(knob):
                try:
                    value = float(env[knob])
                except ValueError:
                    raise usage_error(
                        f"{knob}={env[knob]}: give seconds, e.g. {knob}=600"
                    ) from None
                setattr(out, field, int(value) if field == "max_relaunches" else value)
        return out


@dataclasses.dataclass
class Vmlaunch:
    """One VM's launch: its name, what it installs and runs, and what it has learnt (owned: this
    launch made, started or reused it, so a failure deletes it or names its bill)."""

    o: Options
    sw: Software
    cloud: Cloud
    limits: Limits
    name: str
    install: str
    start_flags: list[str]
    check_line: str = ""
    archive: object = None  # () -> the path of the checkout's archive, made once
    spot_memory: object = None  # a SpotMemory
    queued: bool = False
    owned: bool = False
    attached: bool = False
    log: str = ""

    def ssh(self, worker: str, command: str) -> list[str]:
        return self.cloud.ssh(self.name, worker, command)

    def run_check(self) -> tuple[int, str]:
        code, out, _ = self.cloud.run(self.ssh("0", remote.PID_CHECK), self.limits.ssh, True)
        return code, out


def ensure_vm(v: Vmlaunch) -> None:
    """Step 1: the VM, as vm_step says; sets v.attached when --watch found the run active."""
    vm = v.cloud.read_vm(v.name)
    spot = _spot_choice(v, vm)
    v.queued = v.queued or vm.from_queue
    run = ""
    if vm.state == "READY":
        code, run = v.run_check()
        if code:
            raise refused(
                f"could not reach worker 0 of {v.name} to check for an active run (exit {code})"
            )
    action = vm_step(vm.state, run, v.o.watch)
    where = f"--name={v.name} --zone={v.cloud.zone}"
    if action == "refuse_settling":
        raise refused(
            f"TPU VM {v.name} is {vm.state}; launch again once it is READY, STOPPED or PREEMPTED "
            f"('{PROG} {where} --status')"
        )
    pid = run.rsplit("running ", 1)[-1].split()[0] if "running" in run else ""
    if action == "refuse_active":
        raise refused(
            f"a run is active on {v.name} ({pid}); follow it with '{PROG} {where} --logs' or wait "
            "for it to end: a second launch would replace its checkout and compete for the TPU"
        )
    if action == "attach":
        v.cloud.note(f"a run is active on {v.name} ({pid}); watching it")
        v.attached = v.owned = True
        return
    # From here on the VM is this launch's: a failure deletes it under --delete_when_done.
    v.owned = True
    if action == "reuse":
        v.cloud.note(f"TPU VM {v.name} is READY and idle; reusing it")
    elif action == "start":
        v.cloud.note(f"TPU VM {v.name} is STOPPED; starting it")
        if v.cloud.run(v.cloud.tpu("start", v.name, *v.cloud.where))[0]:
            raise failed(f"starting {v.name} failed; the output is above")
    else:
        if action == "recreate":
            v.cloud.note(
                f"TPU VM {v.name} is {vm.state}; deleting and creating it again (the study "
                f"resumes from {v.o.workdir})"
            )
            if v.cloud.delete(v.name, v.queued):
                raise failed(
                    f"deleting {v.name} before creating it again failed; the output is above"
                )
        else:
            how = "queueing" if v.queued else "creating"
            v.cloud.note(f"no TPU VM {v.name} in {v.cloud.zone}; {how} it")
            check_image_offered(v)
        create(v, spot)


def _spot_choice(v: Vmlaunch, vm: Vm) -> bool:
    """A re-created VM keeps its spot choice unless --spot / --no_spot says otherwise: read from
    the VM, or, once Google has deleted a preempted spot node, from this machine's note of it."""
    was = vm.spot
    if vm.state:
        v.spot_memory.remember(v.name, vm.spot)
    elif v.o.spot is None and v.spot_memory.recall(v.name):
        was = True
        v.cloud.note(
            f"{v.name} was last a spot VM ({v.spot_memory.path(v.name)}); it is made as one "
            "again (--no_spot to change)"
        )
    if vm.state and v.o.spot is None and vm.spot:
        v.cloud.note(f"{v.name} was a spot VM; it stays one (--no_spot to change)")
    return was if v.o.spot is None else v.o.spot


def create(v: Vmlaunch, spot: bool) -> None:
    c = v.cloud
    if v.queued:
        pending = clear_old_request(v)
        if not pending:
            cmd = c.qr("create", v.name, *c.where, f"--node-id={v.name}")
            cmd += [f"--accelerator-type={v.o.accelerator}", f"--runtime-version={v.sw.version}"]
            if c.run(cmd + (["--spot"] if spot else []))[0]:
                raise failed(f"queueing {v.name} failed; the output is above")
        wait_for_queue(v)
    else:
        cmd = c.tpu("create", v.name, *c.where, f"--accelerator-type={v.o.accelerator}")
        if c.run(cmd + [f"--version={v.sw.version}"] + (["--spot"] if spot else []))[0]:
            # A failed create may still leave a node (or a half-made one): the finally deletes
            # it under --delete_when_done, or names its bill.
            raise failed(f"creating {v.name} failed; the output is above")
    if not c.dry_run:
        v.spot_memory.remember(v.name, spot)


def clear_old_request(v: Vmlaunch) -> bool:
    """A queued request outlives its node: after a spot preemption the node is deleted and the
    request SUSPENDED (or FAILED), no longer eligible for allocation, so it is deleted first; one
    still on its way is waited for (True). Google: google.cloud.tpu_v2.types.QueuedResourceState."""
    c = v.cloud
    if c.dry_run:
        cmd = c.qr("describe", v.name, *c.where, "--format=value(state.state)")
        c.print(
            f"# a queued resource {v.name} left SUSPENDED, FAILED or ACTIVE without its node is "
            f"deleted first; one still queued is waited for: {show(cmd)}"
        )
        return False
    qs = c.queue_state(v.name, must_exist=False)
    if qs in ("", "DELETING"):
        if qs:
            raise refused(
                f"the queued resource {v.name} is being deleted; launch again once 'gcloud compute "
                f"tpus queued-resources describe {v.name} --zone={c.zone}' says NOT_FOUND"
            )
        return False
    if qs in ("SUSPENDED", "SUSPENDING", "FAILED", "ACTIVE"):
        c.note(
            f"the queued resource {v.name} is {qs} without its node; deleting it before queueing "
            "again"
        )
        if c.delete(v.name, queued=True):
            raise failed(f"deleting the queued resource {v.name} failed; the output is above")
        return False
    c.note(f"the queued resource {v.name} is {qs}; waiting for it instead of queueing again")
    return True


def wait_for_queue(v: Vmlaunch) -> None:
    """Until ACTIVE; FAILED and SUSPENDED end it (cloud.google.com/tpu/docs/queued-resources)."""
    c = v.cloud
    if c.dry_run:
        cmd = c.qr("describe", v.name, *c.where, "--format=value(state.state)")
        c.print(f"# then until ACTIVE, every {v.limits.poll:g}s: {show(cmd)}")
        return
    last = ""
    while True:
        qs = c.queue_state(v.name, must_exist=True)
        if qs != last:
            c.note(f"queued resource {v.name}: {qs}")
        last = qs
        if qs == "ACTIVE":
            return
        if qs in ("FAILED", "SUSPENDED", "SUSPENDING"):
            v.owned = False  # no node was made: nothing is billed
            raise failed(
                f"the queued resource {v.name} is {qs}; see 'gcloud compute tpus queued-resources "
                f"describe {v.name} --zone={c.zone}', delete it with '{PROG} --name={v.name} "
                f"--zone={c.zone} --queued --delete' and try another zone or time"
            )
        c.sleep(v.limits.poll)


def check_image_offered(v: Vmlaunch) -> None:
    """A pod image must exist in the zone (`versions list` is the source of truth; Google's pages
    lag); one that does not is refused before the create."""
    c, sw = v.cloud, v.sw
    if not sw.tf_pod:
        return
    cmd = c.tpu("versions", "list", *c.where, "--format=value(version)")
    if c.dry_run:
        c.print(f"# the pod image must be offered here: {show(cmd)}")
        return
    code, listed, _ = c.execute(cmd, v.limits.ssh, True, c.env)
    if code:
        c.note(
            f"warning: could not list the TPU software versions in {c.zone}; creating with "
            f"{sw.version} anyway"
        )
        return
    if sw.version in listed.split():
        return
    pods = " ".join(sorted(x for x in listed.split() if x.startswith("tpu-vm-tf-") and "-pod" in x))
    v.owned = False  # nothing was made
    raise usage_error(
        f"--version={sw.version} is not offered in {c.zone}; TensorFlow pod images there: "
        f"{pods or 'none'}; pick one with --version= (the client's tensorflow-tpu follows it)"
    )


def bring_up(v: Vmlaunch) -> None:
    """Steps 2-3 and --check: the checkout copied to every worker, the install, the check."""
    c, lim = v.cloud, v.limits
    what = f"on {v.name}"
    scp = c.tpu("scp", v.archive(), f"{v.name}:/tmp/wide_tf.tar.gz", *c.where, "--worker=all")
    if c.step(scp, lim.ssh, "WIDE_TF_SSH_TIMEOUT_S", f"the copy of the checkout {what}"):
        raise failed(f"copying the checkout to {v.name} failed; the output is above")
    install = v.ssh("all", v.install)
    if c.step(install, lim.install, "WIDE_TF_INSTALL_TIMEOUT_S", f"the install {what}"):
        raise failed(f"the install failed on {v.name}; its output is above")
    if not v.check_line:
        return
    worker = "all" if v.sw.jax and v.sw.multi_host else "0"
    if c.dry_run:
        c.print(f"# --check: {check_words(v.sw)}, before the study")
    code, out, _ = c.run(v.ssh(worker, v.check_line), lim.check, capture=True)
    if c.dry_run:
        return
    print(out, end="", file=c.out, flush=True)
    if code == TIMED_OUT:
        raise failed(
            f"--check on {v.name} did not finish in {lim.check:g}s and was stopped "
            "(WIDE_TF_CHECK_TIMEOUT_S=SECONDS sets the limit); the study was not started"
        )
    if code:
        raise failed(
            f"--check failed on {v.name} (exit {code}; its output is above); the study was not "
            "started"
        )
    came_up = next((x for x in out.splitlines() if x.startswith("wide_tf check: runtime ")), "")
    c.note(f"the TPU came up through: {came_up.removeprefix('wide_tf check: runtime ')}")


def start_run(v: Vmlaunch, stamp: str, flags: list[str]) -> None:
    """Step 4: the run on worker 0 (every worker: JAX on a multi-host slice), checked alive: a
    run that dies at once (a missing data set, a flag only the VM refuses) is reported now."""
    c, lim = v.cloud, v.limits
    dest = f"{v.o.workdir.rstrip('/')}/logs/{v.name}"
    line, v.log = remote.start(v.sw, stamp, dest, flags)
    workers = "all" if v.sw.jax and v.sw.multi_host else "0"
    if c.dry_run and workers == "all":
        c.print(
            "# the same run on every worker (JAX: one program on every host, jax.distributed); "
            "worker 0 writes the workdir and is the one watched"
        )
    if c.step(v.ssh(workers, line), lim.ssh, "WIDE_TF_SSH_TIMEOUT_S", f"the start on {v.name}"):
        raise failed(f"starting the run on {v.name} failed; the output is above")
    if c.dry_run:
        c.print(f"# after {lim.alive_wait:g}s, the run must be alive (or have exited 0):")
        c.run(v.ssh("0", remote.PID_CHECK))
        return
    c.sleep(lim.alive_wait)
    code, alive = v.run_check()
    if code:
        raise failed(
            f"started on {v.name} but could not reach worker 0 to check the run (exit {code}); "
            f"'{PROG} --name={v.name} --zone={c.zone} --status'"
        )
    if "wide_tf: running" in alive or "wide_tf: exited 0" in alive:
        return
    last_lines(v, v.log)
    raise failed(
        f"the run on {v.name} is not running ({alive.strip()}) {lim.alive_wait:g}s after the "
        "start; its last log lines are above"
    )


def last_lines(v: Vmlaunch, log: str) -> None:
    """The log's last 20 lines on stderr, if worker 0 answers in time."""
    _, out, _ = v.cloud.run(v.ssh("0", f"tail -n 20 {log}"), v.limits.ssh, capture=True)
    print(out, end="", file=v.cloud.err, flush=True)


def check_words(sw: Software) -> str:
    if sw.jax and sw.multi_host:
        return (
            "JAX's devices, process count and a psum on every worker (no :check study: a sweep "
            "is refused over several processes)"
        )
    if sw.jax:
        return (
            "JAX's devices and a psum, then a :check run on the JAX backend, on worker 0 (no "
            "study stage: wide_tf/launch/vm/check.py is TensorFlow's)"
        )
    return "the TPU system, a :check run and the study stage on worker 0"
