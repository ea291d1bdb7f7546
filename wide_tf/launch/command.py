"""Owns `python -m wide_tf.launch` (launch_tpu.sh is a shim over it): the actions (a launch,
--status, --logs, --delete, --report, --list_slices) and the launch's one try/finally, which
deletes what the launch owns under --delete_when_done however it ends (done, a failure, a step
past its limit, Ctrl-C, SIGTERM) and names the bill of what it leaves."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable

from wide_tf.launch import cluster, gcloud, local, options, remote, software
from wide_tf.launch import launch_plan as plan
from wide_tf.launch.gcloud import Cloud, show
from wide_tf.launch.machine import Limits
from wide_tf.launch.options import PROG, USAGE, Options, Stop
from wide_tf.schema import memory

REPO = pathlib.Path(__file__).resolve().parents[2]


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the launch's finally runs (exit 143)."""


@dataclasses.dataclass(frozen=True)
class Outside:
    """What the launcher does beyond its own process: every command it runs (gcloud, and the
    config's checks here), the wait between polls, the checkout's archive. The defaults are the
    real ones; another Outside drives the whole state machine in one process (a fake Cloud CLI,
    waits that take no time), which is how its tests run in seconds."""

    execute: Callable = gcloud.call
    sleep: Callable = time.sleep
    archive: Callable = local.make_archive


def main(argv=None, env=None, out=None, err=None, outside: Outside | None = None) -> int:
    env = dict(os.environ if env is None else env)
    out, err = out or sys.stdout, err or sys.stderr
    outside = outside or Outside()
    argv = list(sys.argv[1:] if argv is None else argv)
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        o = options.parse(argv)
        if o.action == "help":
            print(USAGE, file=out)
            return 0
        if o.action == "list_slices":
            for name in memory.DOCUMENTED_SLICES:
                s = memory.parse_slice(name)
                print(f"{s.name} {s.replicas} {s.hosts}", file=out)
            return 0
        if o.action == "report":
            return report(o, _cloud(o, env, out, err, outside))
        if o.action != "launch":
            return follow(o, env, out, err, outside)
        return launch(o, env, out, err, outside)
    except Stop as s:
        print(s.line, file=err)
        if s.usage:
            print(USAGE, file=err)
        return s.code
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 143
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)


def _raise_terminated(signum, frame):
    raise Terminated()


def _cloud(o: Options, env, out, err, outside: Outside) -> Cloud:
    return Cloud(
        env.get("WIDE_TF_GCLOUD") or "gcloud", o.zone, o.project, o.dry_run, out=out, err=err,
        env=env, execute=outside.execute, sleep=outside.sleep,
    )  # fmt: skip


def report(o: Options, c: Cloud) -> int:
    """The report on this machine, read from the bucket (TensorFlow reads gs:// with the
    application-default credentials: `gcloud auth application-default login`)."""
    options.check_workdir(o.workdir)
    cmd = [c.env.get("PYTHON") or "python3", "-m", "wide_tf.report", f"--workdir={o.workdir}"]
    code, _, _ = c.run(cmd)
    if not o.dry_run:
        print(f"# the report: {o.workdir.rstrip('/')}/report/report.md", file=c.err)
    return code


def follow(o: Options, env, out, err, outside: Outside) -> int:
    """--status, --logs, --delete of one VM."""
    options.check_name(o.name)
    o.zone = o.zone or "us-central2-b"
    options.check_where(o.zone, o.project)
    c = _cloud(o, env, out, err, outside)
    c.need()
    if o.action == "logs":
        if not o.lines.isdigit():
            raise options.usage_error(f"--lines={o.lines}: give a number")
        tail = f"tail -n {o.lines}" + (" -F" if o.follow else "")
        return c.run(c.ssh(o.name, "0", f"{tail} {remote.LOGS}/latest.log"))[0]
    if o.action == "delete":
        queued = o.queued or (not o.dry_run and c.read_vm(o.name).from_queue)
        return c.delete(o.name, queued)
    if o.dry_run:
        describe = c.tpu("describe", o.name, *c.where, "--format=value(state)")
        c.print(f"# the VM's state: {show(describe)}")
        c.print(f"# READY: {show(c.ssh(o.name, '0', remote.STATUS))}")
        return 0
    vm = c.read_vm(o.name)
    if not vm.state:
        print(f"TPU VM {o.name}: not found in {o.zone}", file=out)
        return 0
    extra = (" (spot)" if vm.spot else "") + (" (queued resource)" if vm.from_queue else "")
    print(f"TPU VM {o.name}: {vm.state}{extra}", file=out, flush=True)
    if vm.state == "READY":
        c.run(c.ssh(o.name, "0", remote.STATUS))
    return 0


def prepare(o: Options, env, out, err, outside: Outside) -> plan.Plan:
    """Every check on this machine, before any gcloud call."""
    shards, sw = plan.check_arguments(o, REPO)
    cloud = _cloud(o, env, out, err, outside)
    stall_s = int(env.get("WIDE_TF_STALL_S") or int(o.stall_minutes) * 60)
    file = o.config.split(":")[0]
    untracked = "" if local.tracked(REPO, file) else file
    p = plan.Plan(o, sw, cloud, Limits.from_env(env), REPO, shards, stall_s, untracked, [])
    for line in sw.notes + plan.data_notes(o):
        cloud.note(line)
    if untracked:
        cloud.note(
            f"note: {file} is not tracked by git; it is copied to the VM explicitly (commit it to "
            "keep the study reproducible)"
        )
    if o.validate:
        plan.validate_here(p, local.Here(REPO, env, cloud.note, cloud.execute))
    cloud.need()  # after every usage check: a typo is reported before a missing tool
    if sw.multi_host:
        cloud.note(
            f"note: multi-host slice ({sw.slice.hosts} workers): run 'ssh-add "
            "~/.ssh/google_compute_engine' first"
            + (
                "; the run starts on every worker (JAX: one program on every host), worker 0 "
                "writes the workdir"
                if sw.jax
                else ", and give the VM's service account roles/tpu.viewer if the client cannot "
                "resolve the TPU (docs/tpu.md)"
            )
        )
    return p


def launch(o: Options, env, out, err, outside: Outside) -> int:
    p = prepare(o, env, out, err, outside)
    folder: list[str] = []

    def archive() -> str:  # made once, on first use; the finally removes it
        if p.cloud.dry_run:
            return "/tmp/wide_tf_checkout.tar.gz"
        if not folder:
            folder.append(local.temp_folder(env))
            outside.archive(REPO, folder[0], p.untracked)
        return os.path.join(folder[0], "wide_tf.tar.gz")

    p.vms = plan.make_vms(p, local.SpotMemory(env, o.project, o.zone), archive)
    code, done = 1, False
    try:
        code, done = cluster.run(p)
    except Stop as s:
        print(s.line, file=err, flush=True)
        if s.usage:
            print(USAGE, file=err)
        code = s.code
    except KeyboardInterrupt:
        code = 130
    except Terminated:
        code = 143
    finally:
        if folder:
            shutil.rmtree(folder[0], ignore_errors=True)
        code = settle(p, code, done)
    if code == 0 and not (o.watch and not o.dry_run):
        summary(p)
    return code


def settle(p: plan.Plan, code: int, done: bool) -> int:
    """Whatever ended the launch: under --delete_when_done every VM it owns is deleted (not after
    a failure with --keep_on_failure); any VM left behind by a failure, or by a watch that saw
    the study done, is named with the command that deletes it."""
    o, c = p.o, p.cloud
    if o.dry_run:
        return code
    if o.delete_when_done and (code == 0 or not o.keep_on_failure):
        for v in p.vms:
            if v.owned:
                c.note(f"deleting {v.name} (--delete_when_done; the launch ended with exit {code})")
                if c.delete(v.name, v.queued):
                    c.note(f"warning: deleting {v.name} failed")
                    billing(p, v.name)
        return code
    for v in p.vms:
        if v.owned and (code or done):
            if o.delete_when_done:
                c.note(f"{v.name} is kept for debugging (--keep_on_failure)")
            billing(p, v.name)
    return code


def billing(p: plan.Plan, name: str) -> None:
    project = f" --project={p.o.project}" if p.o.project else ""
    p.cloud.note(
        f"{name} is still billed while it exists: '{PROG} --name={name} --zone={p.o.zone}"
        f"{project} --delete'"
    )


def summary(p: plan.Plan) -> None:
    o, sw, v = p.o, p.sw, p.vms[0]
    stack = (
        f"jax[tpu] {software.JAX_TPU} with libtpu {software.JAX_LIBTPU}"
        if sw.jax
        else f"tensorflow-tpu {sw.tf_tpu} with libtpu {sw.libtpu}"
    )
    who = (
        "the run on every worker, worker 0 writing"
        if sw.jax and sw.multi_host
        else "the run on worker 0"
    )
    if p.shards:
        who = f"the study on a Ray cluster of {p.shards} VMs, its driver on {v.name}"
    opts = f"--name={v.name} --zone={o.zone}" + (f" --project={o.project}" if o.project else "")
    started = "Would start" if o.dry_run else "Started"
    p.cloud.print(
        f"# {started} on {v.name} ({o.accelerator}, {sw.slice.replicas} replicas, image "
        f"{sw.version}, {stack}, runtime {sw.runtime}, {sw.slice.hosts} host(s); {who}), log "
        f"{v.log or '(on the VM)'}.\n"
        f"#   {PROG} {opts} --status          # VM state, run active or not, last log lines\n"
        f"#   {PROG} {opts} --logs --follow   # the log (Ctrl-C stops following, not the run)\n"
        f"#   tensorboard --logdir={o.workdir} # from any machine with access to the bucket\n"
        f"#   {PROG} --workdir={o.workdir} --report\n"
        f"#   {PROG} {opts} --delete          # the VM is billed while it exists\n"
        "# After a preemption, run this same launch again (or add --watch): it recreates the VM "
        "and resumes the study."
    )


if __name__ == "__main__":
    sys.exit(main())
