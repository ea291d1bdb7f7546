"""Owns a launch's course over its VMs: one VM, or under --shards=N a Ray cluster of N (the head on
the first VM's worker 0, `ray start --address=HEAD:6379` on the others, the study submitted on the
head with `wide_tf.main ... --cluster=HEAD:6379`); the dry run's printed plan; --watch, which
polls, launches again what was preempted and stops a run that made no progress."""

from __future__ import annotations

import time

from wide_tf.launch import machine, remote
from wide_tf.launch.gcloud import show
from wide_tf.launch.machine import Vmlaunch
from wide_tf.launch.options import failed


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def run(p) -> tuple[int, bool]:
    """The launch, then the watch under --watch; returns (exit status, whether a watch saw the
    study done)."""
    if p.cloud.dry_run:
        dry_run(p)
        return 0, False
    head = launch_all(p)
    if not p.o.watch:
        return 0, False
    return watch(p, head), True


def launch_all(p, only=None) -> str:
    """Every VM (or those in `only`) brought up; under --shards the Ray cluster formed and the
    study submitted on the head. Returns the head's address ('' without --shards)."""
    head_vm = p.vms[0]
    for v in p.vms if only is None else only:
        machine.ensure_vm(v)
        if not v.attached:
            machine.bring_up(v)
    if not p.shards:
        if not head_vm.attached:
            machine.start_run(head_vm, _stamp(), head_vm.start_flags)
        return ""
    return form_cluster(p, None if only is None else only)


def form_cluster(p, only) -> str:
    """Ray's head on the first VM, the others joined to it, the study submitted on the head. A
    re-formed head (a new address) takes every VM again and submits again."""
    head_vm, c = p.vms[0], p.cloud
    if head_vm.attached:
        return c.head_address(head_vm.name)
    new_head = only is None or head_vm in only
    address = c.head_address(head_vm.name)
    joining = p.vms[1:] if new_head else [v for v in only if v is not head_vm]
    lim = p.limits
    if new_head and c.step(
        head_vm.ssh("0", remote.ray_start(p.sw, None)), lim.ssh, "WIDE_TF_SSH_TIMEOUT_S",
        f"Ray's head on {head_vm.name}",
    ):  # fmt: skip
        raise failed(f"starting Ray's head on {head_vm.name} failed; the output is above")
    for v in joining:
        line = remote.ray_start(p.sw, address)
        if c.step(v.ssh("0", line), lim.ssh, "WIDE_TF_SSH_TIMEOUT_S", f"Ray on {v.name}"):
            raise failed(f"{v.name} could not join Ray's head at {address}; the output is above")
    if new_head:
        flags = [*head_vm.start_flags, f"--cluster={address}:{remote.RAY_PORT}"]
        machine.start_run(head_vm, _stamp(), flags)
    return address


def watch(p, head: str) -> int:
    """Every poll: each VM's state and the run's on the head. A VM preempted, stopped or gone is
    launched again (under --shards a worker rejoins the head; a new head takes every VM again and
    resubmits: the study resumes from the workdir); exited 0: done; failed or stuck: exit 1."""
    c, lim, head_vm = p.cloud, p.limits, p.vms[0]
    relaunches = errors = 0
    while True:
        c.sleep(lim.poll)
        states = {v.name: c.read_vm(v.name).state for v in p.vms}
        answer = ""
        if states[head_vm.name] == "READY":
            code, answer = head_vm.run_check()
            if code:
                errors += 1
                if errors >= 5:
                    raise failed(
                        f"could not reach worker 0 of {head_vm.name} 5 times in a row; stopped "
                        "watching"
                    )
                continue
            errors = 0
        step = machine.watch_step(states[head_vm.name], answer, p.stall_s)
        lost = [v for v in p.vms[1:] if states[v.name] in machine.GONE]
        if step == "stuck":
            machine.last_lines(head_vm, f"{remote.LOGS}/latest.log")
            idle = answer.split("idle ")[1].split()[0]
            raise failed(
                f"no progress on {head_vm.name}: the run's log has not changed for {idle}s "
                f"(--stall_minutes={p.o.stall_minutes}); the study is treated as stuck (its last "
                "log lines are above)"
            )
        if step == "done":
            c.note(
                f"the study is done on {head_vm.name}; the results are in {p.o.workdir} (logs in "
                f"{p.o.workdir.rstrip('/')}/logs/{head_vm.name})"
            )
            return 0
        if step == "failed":
            c.note(
                f"the study failed on {head_vm.name} ({answer.strip().split('wide_tf: ')[-1]}); "
                f"its log: {p.o.workdir.rstrip('/')}/logs/{head_vm.name}/"
            )
            return 1
        again = ([head_vm] if step == "relaunch" else []) + lost
        if not again:
            continue
        _say_why(p, again, states, answer)
        relaunches += 1
        if relaunches > lim.max_relaunches:
            raise failed(
                f"{head_vm.name} was launched again {lim.max_relaunches} times; stopped watching"
            )
        launch_all(p, only=again)


def _say_why(p, again, states, answer) -> None:
    for v in again:
        state = states[v.name]
        if state == "READY":
            why = f"the run on {v.name} stopped ({answer.strip().split('wide_tf: ')[-1]})"
        else:
            why = f"TPU VM {v.name} is {state or 'gone'}"
        p.cloud.note(f"{why}; launching again")
        v.attached = False


def dry_run(p) -> None:
    """The plan as commands: a fresh launch live, the other states' branches commented out (a
    pasted block must not create a VM and then delete it), nothing called."""
    from wide_tf.launch import software

    c, o = p.cloud, p.o
    c.print(software.runtime_line(p.sw))
    for i, v in enumerate(p.vms):
        if p.shards:
            c.print(f"# ---- VM {v.name}: {i + 1} of {p.shards}, one node of the Ray cluster")
        dry_run_vm(p, v)
    if p.shards:
        form_cluster(p, None)
    else:
        machine.start_run(p.vms[0], _stamp(), p.vms[0].start_flags)
    if o.watch:
        whose = "VMs'" if p.shards else "VM's"
        words = (
            f"# --watch: every {p.limits.poll:g}s the {whose} state and the run's (above); "
            "preempted, gone or\n#   stopped: launch again as above (at most "
            f"{p.limits.max_relaunches} times); exited 0: done;\n#   exited otherwise, or no "
            f"new log line for {p.stall_s} s (--stall_minutes): failed (exit 1)"
        )
        if o.delete_when_done:
            keep = ", kept after a failure: --keep_on_failure" if o.keep_on_failure else ""
            words += f"; then, however the launch ends (--delete_when_done{keep}):"
        c.print(words)
        if o.delete_when_done:
            c.comment = True
            for v in p.vms:
                c.delete(v.name, o.queued)
            c.comment = False


def dry_run_vm(p, v: Vmlaunch) -> None:
    c, o, lim = p.cloud, p.o, p.limits
    c.print(f"# the VM's state: {show(c.describe_args(v.name))}")
    c.print("# (any describe error but NOT_FOUND stops here, exit 1)")
    machine.check_image_offered(v)
    c.print("# no such VM (the branch printed as commands; the other states' are commented out):")
    machine.create(v, bool(o.spot))
    c.comment = True
    c.print(
        "# PREEMPTED or TERMINATED: delete it, then create it as above (spot or not as it was):"
    )
    c.delete(v.name, o.queued)
    c.print("# STOPPED:")
    c.run(c.tpu("start", v.name, *c.where))
    follows = "; --watch follows it" if o.watch else ""
    c.print(f"# READY: refuse if a run is active (pid file on worker 0){follows}:")
    c.run(v.ssh("0", remote.PID_CHECK))
    c.comment = False
    extra = f"; printf '%s\\0' {p.untracked}" if p.untracked else ""
    c.print(
        f"# (cd {p.repo} && {{ git ls-files -z{extra}; }} | tar --null -T - -czf "
        "/tmp/wide_tf_checkout.tar.gz)"
    )
    check = f", --check {lim.check:g}s" if o.check else ""
    deleted = ", the VM deleted" if o.delete_when_done and not o.keep_on_failure else ""
    c.print(
        f"# each remote step is stopped past its limit (copy, start and checks {lim.ssh:g}s, "
        f"install {lim.install:g}s{check}): exit 1{deleted}"
    )
    machine.bring_up(v)
