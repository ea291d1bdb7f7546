"""Owns the study-cost part of the benchmark: a fixed slice of a study's trials run with the
settings of before the evaluation economy (every pass whole, the test set at every evaluation,
the gradient probe along training in every run, evaluation batches of 1,024) and with the
study's own, group by group in turn, in one process; the ratio of their CPU and wall seconds,
where the seconds went (result.json's "time_s"), and whether every target's record is identical.

    python -m tools.bench.speed --only=study_cost                # the local study, 42 trials
    python -m tools.bench.speed --only=study_cost --groups=3     # fewer groups (minutes)
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

from tools.bench.common import REPO
from tools.bench.compare_records import record_key
from wide_tf.checks import loader
from wide_tf.schema import result_fields
from wide_tf.study import trials as trials_lib

DEFAULT_CONFIG = "configs/mlp.py:local"
# One (member, batch) group per member, its batch spread over the sweep's, every tuning trial of
# each (rates x tuning seeds): 7 groups of 6 = 42 trials of the local study.
DEFAULT_GROUPS = 7


# The settings of before the evaluation economy, as (section, field, value) of a study config.
BEFORE = (
    ("train", "eval_economy", False),  # every evaluation pass whole, the test set at every one
    ("train", "eval_batch", 1024),
    ("sweep", "probe_batches", "all"),  # the probe along training in every run
)


def before(config):
    """The study `config` with the settings of before the economy: the records must match."""
    cfg = config.copy_and_resolve_references()
    for section, field, value in BEFORE:
        setattr(cfg[section], field, value)
    return cfg


def slice_groups(config, groups: int) -> list[list]:
    """`groups` (member, batch) groups of the study's initial grid: member k at batch k (each
    cycling), so every member and every batch appear (the smallest batch, whose runs keep the
    probe, about as often as in the study): every tuning trial of each."""
    from wide_tf.engine.tf import data as data_lib

    info = data_lib.dataset_info(config.data)
    trials = trials_lib.expand(config, info.num_classes, info.input_shape)
    members = list(dict.fromkeys(t.member.name for t in trials))
    batches = sorted({t.batch_size for t in trials})
    out = []
    for k in range(groups):
        member, batch = members[k % len(members)], batches[k % len(batches)]
        out.append([t for t in trials if t.member.name == member and t.batch_size == batch])
    return out


def _run_group(group, workdir: str, runtime) -> tuple[float, float, list[dict]]:
    from wide_tf.engine import train

    cpu0, wall0 = time.process_time(), time.perf_counter()
    records = []
    for t in group:
        records.append(
            train.train_and_evaluate(t.config, os.path.join(workdir, t.trial_id), runtime, t.meta())
        )
    return time.process_time() - cpu0, time.perf_counter() - wall0, records


@dataclasses.dataclass
class Side:
    cpu_s: float = 0.0
    wall_s: float = 0.0
    time_s: dict = dataclasses.field(default_factory=dict)
    records: list = dataclasses.field(default_factory=list)

    def add(self, cpu: float, wall: float, records: list[dict]) -> None:
        self.cpu_s += cpu
        self.wall_s += wall
        self.records += records
        for r in records:
            for k, v in (r.get("time_s") or {}).items():
                self.time_s[k] = self.time_s.get(k, 0.0) + v


def bench_study_cost(config_spec: str = DEFAULT_CONFIG, groups: int = DEFAULT_GROUPS) -> list[dict]:
    """Rows for the bench's table and JSON: one per side, then the comparison."""
    from wide_tf.engine import train
    from wide_tf.engine.tf.strategy import setup_runtime

    config = loader.load_config(
        os.path.join(REPO, config_spec) if ":" in config_spec else config_spec
    )
    runtime = setup_runtime(config.runtime)
    old_groups = slice_groups(before(config), groups)
    new_groups = slice_groups(config, groups)
    old, new = Side(), Side()
    with tempfile.TemporaryDirectory() as tmp:
        for k, (g_old, g_new) in enumerate(zip(old_groups, new_groups)):
            # Alternate which side goes first: a machine that slows down mid-bench hurts both.
            order = [(g_old, old, True), (g_new, new, False)]
            for group, side, is_old in order if k % 2 == 0 else order[::-1]:
                train.clear_cache()
                side.add(*_run_group(group, os.path.join(tmp, "old" if is_old else "new"), runtime))
    same = [record_key(a) == record_key(b) for a, b in zip(old.records, new.records)]
    return [
        _side_row("before the economy", old),
        _side_row("with the economy", new),
        {
            "kind": "study_cost",
            "name": "ratio",
            "config": config_spec,
            "trials": len(same),
            "cpu_ratio": old.cpu_s / new.cpu_s if new.cpu_s else None,
            "wall_ratio": old.wall_s / new.wall_s if new.wall_s else None,
            "identical_records": sum(same),
            "all_identical": all(same),
        },
    ]


def _side_row(name: str, side: Side) -> dict:
    return {
        "kind": "study_cost",
        "name": name,
        "cpu_s": round(side.cpu_s, 2),
        "wall_s": round(side.wall_s, 2),
        "time_s": {k: round(side.time_s.get(k, 0.0), 2) for k in result_fields.TIME_KINDS},
        "trials": len(side.records),
    }


def format_study_cost(rows: list[dict]) -> str:
    kinds = result_fields.TIME_KINDS
    lines = [
        f"{'study cost':<20} {'cpu s':>8} {'wall s':>8} " + " ".join(f"{k:>10}" for k in kinds)
    ]
    ratio = None
    for r in rows:
        if r["name"] == "ratio":
            ratio = r
            continue
        lines.append(
            f"{r['name']:<20} {r['cpu_s']:>8.1f} {r['wall_s']:>8.1f} "
            + " ".join(f"{r['time_s'][k]:>10.1f}" for k in kinds)
        )
    if ratio:
        lines.append(
            f"before / with: CPU {ratio['cpu_ratio']:.2f}x, wall {ratio['wall_ratio']:.2f}x over "
            f"{ratio['trials']} trials of {ratio['config']}; records identical (every target's "
            f"status, steps and interpolated steps): {ratio['identical_records']}/{ratio['trials']}"
        )
    return "\n".join(lines)
