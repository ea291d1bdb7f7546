"""Owns a launch's plan, made on this machine before any gcloud call: the arguments checked, the
software resolved, the flags of wide_tf.main on the VM (one list, checked here with exactly
those), the config checked for the slice, and one Vmlaunch per VM (NAME, or NAME-0 ... NAME-(N-1)
under --shards)."""

from __future__ import annotations

import dataclasses
import pathlib

from wide_tf.launch import local, options, remote, software
from wide_tf.launch.gcloud import Cloud
from wide_tf.launch.machine import Limits, Vmlaunch
from wide_tf.launch.options import Options, usage_error
from wide_tf.launch.software import Software


@dataclasses.dataclass
class Plan:
    """Everything a launch needs; `vms[0]` is the Ray head under --shards."""

    o: Options
    sw: Software
    cloud: Cloud
    limits: Limits
    repo: pathlib.Path
    shards: int
    stall_s: int
    untracked: str
    vms: list[Vmlaunch]

    def flags(self, name: str) -> list[str]:
        return vm_flags(self.o, self.sw, name)


def backend_flags(o: Options) -> list[str]:
    return ["--config.runtime.backend=jax"] if o.backend == "jax" else []


def tpu_arg(sw: Software, name: str) -> str:
    """A TensorFlow pod's client names its TPU; everything else opens the local one."""
    return name if sw.tf_pod else "local"


def vm_flags(o: Options, sw: Software, name: str) -> list[str]:
    """wide_tf.main's flags on the VM: the workstation's check runs with exactly these (plus
    --dry_run, --replicas and --accelerator), so a flag only the VM would refuse is refused here."""
    tpu = ["--config.runtime.strategy=tpu", f"--config.runtime.tpu={tpu_arg(sw, name)}"]
    return [f"--config={o.config}", f"--workdir={o.workdir}", *backend_flags(o), *tpu, *o.extra]


def check_flags(o: Options, sw: Software, name: str) -> list[str]:
    """--check's :check variant (batches that fit every documented slice), in a scratch folder."""
    tpu = ["--config.runtime.strategy=tpu", f"--config.runtime.tpu={tpu_arg(sw, name)}"]
    file = o.config.split(":")[0]
    scratch = ["--workdir=/tmp/wide_tf_check"]
    return [f"--config={file}:check", *scratch, *backend_flags(o), *tpu, "--no_report"]


def study_flags(o: Options, sw: Software, name: str) -> list[str]:
    """--check's study stage (wide_tf/launch/vm/check.py): the study's own worst row, its
    checkpoint on the study's workdir; only --config.* overrides go with it (the study's shapes)."""
    tpu = ["--config.runtime.strategy=tpu", f"--config.runtime.tpu={tpu_arg(sw, name)}"]
    overrides = [a for a in o.extra if a.startswith("--config.")]
    return [f"--config={o.config}", f"--workdir={o.workdir}", *tpu, *overrides]


def check_arguments(o: Options, repo: pathlib.Path) -> tuple[int, Software]:
    """Every input check of a launch, in one pass; returns (shards, the software)."""
    shards = options.check_numbers(o)
    options.check_name(o.name, shards)
    options.check_config(o.config)
    options.check_workdir(o.workdir)
    options.check_where(o.zone, o.project)
    file = o.config.split(":")[0]
    if not (repo / file).is_file():
        raise usage_error(
            f"--config={o.config}: no file {file} in the checkout (give it relative to the "
            "repository)"
        )
    options.check_versions(o)
    s = software.resolve_slice(o)
    options.check_where(o.zone, o.project)
    options.check_extra(o, shards)
    sw = software.resolve(o, s)
    if shards and sw.jax and sw.multi_host:
        raise usage_error(
            "--shards with --backend=jax on a multi-host slice: each VM is already several JAX "
            "processes; use single hosts (--accelerator=v4-8 --shards=N)"
        )
    return shards, sw


def data_notes(o: Options) -> list[str]:
    """TFDS data (configs/wrn.py: CIFAR-10) must be prepared once into the bucket (docs/tpu.md): a
    fresh VM has none, and a preempted one loses its disk."""
    given = [a.split("=", 1)[1] for a in o.extra if a.startswith("--config.data.data_dir=")]
    if not given:
        return [
            "note: no --config.data.data_dir after '--': a TFDS data set (CIFAR-10 in "
            "configs/wrn.py) must then be in the VM's default folder, which a new VM does not "
            "have; pass -- --config.data.data_dir=gs://BUCKET/tfds (the embedded data sets need "
            "none)"
        ]
    if not given[-1].startswith("gs://"):
        return [
            f"note: --config.data.data_dir={given[-1]} is on worker 0's disk: a new or re-created "
            "VM has no data there; a gs:// path survives preemptions"
        ]
    return []


def validate_here(p: Plan, here: local.Here) -> None:
    """The config checked on this machine for the slice's replica count and memory."""
    o, sw = p.o, p.sw
    # JAX on a multi-host slice runs as one of several processes, under which the package refuses
    # a study (checks/preflight.py): the check here runs in that environment too.
    jax_env = {"WIDE_TF_JAX_DISTRIBUTED": "1"} if sw.jax and sw.multi_host else {}
    here.dry_run(o.config, p.flags(o.name), sw.slice, "checked here", jax_env)
    if o.check and not (sw.jax and sw.multi_host):
        what = f"{o.config.split(':')[0]}:check (--check)"
        flags = check_flags(o, sw, o.name)
        here.dry_run(what, flags, sw.slice, "checked here for --check", jax_env)
    if p.shards:
        count = here.groups(p.flags(o.name))
        if count is None:
            here.note(
                f"note: could not count {o.config}'s groups here; --shards={p.shards} is not "
                "checked against them"
            )
        elif p.shards > count:
            raise usage_error(
                f"--shards={p.shards}: {o.config} has {count} (member, batch size) groups and a "
                f"group runs on one VM at a time; VMs beyond {count} would bill with nothing to "
                f"run: give --shards={count} or fewer"
            )
        else:
            here.note(f"checked here: {count} groups for {p.shards} VMs, one Ray cluster")


def make_vms(p: Plan, spot_memory, archive) -> list[Vmlaunch]:
    o, sw = p.o, p.sw
    names = [f"{o.name}-{i}" for i in range(p.shards)] if p.shards else [o.name]
    vms = []
    for name in names:
        line = ""
        if o.check:
            line = remote.tpu_check(
                sw, tpu_arg(sw, name), check_flags(o, sw, name), study_flags(o, sw, name)
            )
        install = remote.install(p.repo, sw, o.python, name, ray=bool(p.shards))
        v = Vmlaunch(o, sw, p.cloud, p.limits, name, install, p.flags(name), line)
        v.archive, v.spot_memory, v.queued = archive, spot_memory, o.queued
        vms.append(v)
    return vms
