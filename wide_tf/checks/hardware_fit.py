"""Owns the question "does this config fit this accelerator at N replicas?": every member at every
batch size against the memory model of wide_tf.schema.memory, before TensorFlow starts; and, when it
does not fit, the largest `train.max_device_batch` that does.

  python -m wide_tf.checks.hardware_fit --config=configs/wrn.py --replicas=4 --accelerator=v4
  python -m wide_tf.checks.hardware_fit --config=configs/wrn.py --table    # every accelerator

Exit status: 0 fits (as given or with the config's own max_device_batch), 3 does not fit (the
line names the max_device_batch that would), 2 a usage error. launch_tpu.sh runs it after the
config's dry run; main's --dry_run can call `check(...).line()` the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import sys

from wide_tf.checks import loader, validate
from wide_tf.schema import families, memory

EXIT_DOES_NOT_FIT = 3


@dataclasses.dataclass(frozen=True)
class Row:
    member: str
    elements: int  # per example (wide_tf.schema.memory.activation_elements)
    params: int
    batch: int  # global
    micro_batch: int  # per replica, after the config's max_device_batch
    bytes: int  # one replica's step

    def fits(self, dev: memory.Device) -> bool:
        return self.bytes <= dev.usable


@dataclasses.dataclass(frozen=True)
class Fit:
    device: memory.Device
    replicas: int
    policy: str
    cap: int  # the config's train.max_device_batch (0: none)
    rows: tuple[Row, ...]
    suggested_cap: int  # the largest max_device_batch that fits every row (0: none does)

    @property
    def fits(self) -> bool:
        return all(r.fits(self.device) for r in self.rows)

    def line(self) -> str:
        d = self.device
        worst = max(self.rows, key=lambda r: r.bytes)
        where = f"{d.name} ({d.stated}; {d.usable / memory.GB:.1f} GB usable per replica)"
        peak = (
            f"peak {worst.bytes / memory.GB:.1f} GB per replica ({worst.member} at batch "
            f"{worst.batch}: {worst.micro_batch} per replica, {self.policy})"
        )
        if self.fits:
            return f"memory: the config fits {self.replicas} x {where}: {peak}"
        fix = (
            f"add --config.train.max_device_batch={self.suggested_cap} (micro-batches)"
            if self.suggested_cap
            else "no micro-batch size fits; use a device with more memory"
        )
        return f"memory: the config does not fit {self.replicas} x {where}: {peak}; {fix}"


def members(config) -> list[families.Member]:
    """The config's members (the sweep's family, or its one model)."""
    _, classes, shape, _ = validate.dataset_facts(config)
    m = config.model
    if validate.is_sweep(config):
        return families.from_config(
            m.arch, config.sweep.family, num_classes=classes, input_shape=shape, norm=m.norm
        )
    params = families.param_count(m.arch, m.depth, m.width, classes, shape, norm=m.norm)
    return [families.Member(arch=m.arch, depth=m.depth, width=m.width, params=params)]


def _batches(config) -> list[int]:
    if validate.is_sweep(config):
        return [int(b) for b in config.sweep.batch_sizes]
    return [int(config.train.global_batch)]


def rows(config, replicas: int, policy: str, cap: int) -> list[Row]:
    """Every (member, batch size) row of `config` at `replicas`, `policy` and micro-batch `cap`
    (wide_tf/launch/vm/check.py steps the worst one)."""
    return _rows(config, replicas, policy, cap)


def _rows(config, replicas: int, policy: str, cap: int) -> list[Row]:
    _, classes, shape, _ = validate.dataset_facts(config)
    rows = []
    for mem in members(config):
        el = memory.activation_elements(
            mem.arch, mem.depth, mem.width, classes, shape, config.model.norm
        )
        for b in _batches(config):
            per_replica = b // replicas
            micro = per_replica // memory.micro_batches(per_replica, cap)
            step = memory.step_bytes(el, mem.params, micro, policy)
            rows.append(Row(mem.name, el, mem.params, b, micro, step))
    return rows


def _ghost(config) -> int:
    return int(config.model.ghost_batch_size) if config.model.norm == "ghost" else 1


def suggest_cap(config, replicas: int, dev: memory.Device, policy: str) -> int:
    """The largest max_device_batch under which every member's micro-batch at every batch fits
    `dev` and is a whole number of virtual batches (0: none)."""
    ghost = _ghost(config)
    rows = _rows(config, replicas, policy, 0)
    top = min(memory.largest_batch(r.elements, r.params, dev, policy, ghost) for r in rows)
    return memory.cap_for(sorted({b // replicas for b in _batches(config)}), top, ghost)


def check(config, replicas: int, accelerator: str) -> Fit:
    """Whether `config` fits `replicas` replicas of `accelerator` (a wide_tf.schema.memory.DEVICES
    key or a launch_tpu.sh slice family)."""
    dev = memory.device(accelerator)
    policy = memory.policy_for(dev.platform, config.runtime.mixed_precision)
    cap = int(config.train.max_device_batch or 0)
    rows = tuple(_rows(config, replicas, policy, cap))
    fit = Fit(dev, replicas, policy, cap, rows, 0)
    if fit.fits:
        return fit
    return dataclasses.replace(fit, suggested_cap=suggest_cap(config, replicas, dev, policy))


def table(config, devices=None) -> str:
    """Markdown: per member, bytes per example and, per accelerator, the largest per-replica
    (micro-)batch that fits one replica at that platform's default policy."""
    devices = list(devices or memory.DEVICES.values())
    _, classes, shape, _ = validate.dataset_facts(config)
    head = ["member", "params", "MB/example f32"] + [d.name for d in devices]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for mem in members(config):
        el = memory.activation_elements(
            mem.arch, mem.depth, mem.width, classes, shape, config.model.norm
        )
        cells = [mem.name, f"{mem.params:,}", f"{el * 4 / 1e6:.2f}"]
        for d in devices:
            policy = memory.policy_for(d.platform, config.runtime.mixed_precision)
            cells.append(f"{memory.largest_batch(el, mem.params, d, policy, _ghost(config)):,}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def apply_override(config, arg: str) -> None:
    """--config.a.b=value applied to `config` (the tools' own argument parsing)."""
    _override(config, arg)


def _override(config, arg: str) -> None:
    """--config.a.b=value, as the launcher passes them after '--'."""
    path, _, text = arg[len("--config.") :].partition("=")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    *parents, leaf = path.split(".")
    node = config
    for p in parents:
        node = node[p]
    node[leaf] = value


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = {"replicas": "1", "accelerator": ""}
    spec, overrides, show_table = None, [], False
    for a in args:
        if a.startswith("--config.") and "=" in a:
            overrides.append(a)
        elif a.startswith("--config="):
            spec = a.split("=", 1)[1]
        elif a == "--table":
            show_table = True
        elif a.startswith(("--replicas=", "--accelerator=")):
            key, _, value = a[2:].partition("=")
            opts[key] = value
        # anything else (--shard=..., main's own flags) does not change the memory
    usage = "--config=FILE[:VARIANT] (--accelerator=NAME [--replicas=N] | --table)"
    if any(a in ("-h", "--help") for a in args):
        print(f"usage: python -m wide_tf.checks.hardware_fit {usage}")
        return 0
    if spec is None or not (show_table or opts["accelerator"]):
        print(
            f"error: give a config and an accelerator or --table; usage: {usage}", file=sys.stderr
        )
        return 2
    try:
        config = loader.load_config(spec)
        for o in overrides:
            _override(config, o)
        if show_table:
            print(table(config))
            return 0
        fit = check(config, int(opts["replicas"]), opts["accelerator"])
    except (ValueError, KeyError, AttributeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(fit.line())
    return 0 if fit.fits else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    sys.exit(main())
