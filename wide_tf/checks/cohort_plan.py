"""Owns the dry run's cohort plan on an accelerator (`--dry_run --accelerator=...` on a study):
how many runs of each (member, batch) cell one program could train together there, from the
memory model (wide_tf.schema.memory: one run's step bytes per replica, K runs K times that), set
against the runs a cell has ready at once (its first round: the rate grid on the tuning seeds);
and the protocol's arithmetic (wide_tf.schema.arithmetic) at the accelerator's peak rate."""

from __future__ import annotations

import dataclasses

from wide_tf.checks import hardware_fit, validate
from wide_tf.schema import arithmetic, memory, plan


@dataclasses.dataclass(frozen=True)
class Cell:
    member: str
    batch: int
    run_bytes: int  # one run's step on one replica (hardware_fit.Row.bytes)
    fits: int  # runs whose steps fit one replica together: usable // run_bytes
    flop_per_run: float  # a run's whole budget, every replica together


@dataclasses.dataclass(frozen=True)
class CohortPlan:
    device: memory.Device
    replicas: int
    ready: int  # runs of a cell ready at once: the first round (rates x tuning seeds)
    most_runs: int  # a cell's runs at the protocol's largest extent
    cells: tuple[Cell, ...]
    peak: arithmetic.PeakRate | None

    @property
    def tightest(self) -> Cell:
        return min(self.cells, key=lambda c: c.fits)

    def lines(self) -> list[str]:
        d, worst = self.device, self.tightest
        packed = sum(min(c.fits, self.ready) for c in self.cells)
        whole = sum(c.fits >= self.ready for c in self.cells)
        small = min(self.cells, key=lambda c: c.batch)
        each = small.batch / self.replicas
        tightest = (
            f"fewest together {worst.fits:,}" if worst.fits else "in one cell not even one run"
        )
        out = [
            f"cohorts: on {self.replicas} x {d.name} a cell's first round is {self.ready} runs; "
            f"{whole} of {len(self.cells)} cells fit it in one program ({packed} runs in the "
            f"cells' first programs), {tightest} ({worst.member} at batch {worst.batch}: "
            f"{worst.run_bytes / memory.GB:.2g} GB a run per replica); one run at a time, batch "
            f"{small.batch} puts {each:g} example{'' if each == 1 else 's'} on each replica"
        ]
        flop = self.most_runs * sum(c.flop_per_run for c in self.cells)
        extent = (
            f"arithmetic: the protocol's largest extent ({self.most_runs} runs a cell, each to its "
            f"budget) is {flop:.2g} FLOP"
        )
        if self.peak is None:
            return out + [f"{extent}; no peak rate recorded for {d.name}"]
        seconds = flop / (self.peak.flop_per_s * self.replicas)
        return out + [
            f"{extent}: {_duration(seconds)} at {self.replicas} x {self.peak.stated} "
            f"({self.peak.source}), which models this small stay far below; most runs stop at "
            "their target long before their budget"
        ]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.2g} s"
    if seconds < 7200:
        return f"{seconds / 60:.2g} min"
    return f"{seconds / 3600:.3g} h"


def plan_for(config, replicas: int, accelerator: str) -> CohortPlan | None:
    """The cohort plan of a study `config` on `replicas` x `accelerator` (a memory.DEVICES key or
    slice family); None for a single run or the theory check."""
    if config.get("kind", "study") == "theory" or not validate.is_sweep(config):
        return None
    fit = hardware_fit.check(config, replicas, accelerator)
    s, t = config.sweep, config.train
    num_train, classes, shape, _ = validate.dataset_facts(config)
    members = {m.name: m for m in hardware_fit.members(config)}
    cells = []
    for row in fit.rows:
        m = members[row.member]
        steps = plan.budget_steps(
            max_steps=int(t.max_steps or 0),
            max_epochs=float(t.max_epochs),
            min_steps=int(t.min_steps or 0),
            num_train=num_train,
            batch=row.batch,
        )
        per_example = arithmetic.training_flop(
            arithmetic.forward_multiply_adds(m.arch, m.depth, m.width, classes, shape)
        )
        fits = fit.device.usable // row.bytes if row.bytes else 0
        cells.append(Cell(row.member, row.batch, row.bytes, fits, per_example * steps * row.batch))
    tuning = len(s.seeds)
    ready = len(s.lr_multipliers) * tuning
    most = (len(s.lr_multipliers) + int(s.max_lr_extensions)) * tuning + len(s.confirm_seeds or ())
    return CohortPlan(
        fit.device, replicas, ready, most, tuple(cells), arithmetic.peak_rate(fit.device.name)
    )
