"""Owns a study's trials: the sweep expanded into trials with stable ids, the one filter for
`--trial` and `--shard`, the (member, batch size) groups, and the rounds each group's learning-rate
protocol adds (`wide_tf.study.lr_grid` decides them). TensorFlow-free: the parent of --workers=N
reads it to supervise."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import ml_collections

from wide_tf.checks import preflight
from wide_tf.schema import datasets, families, identity, provenance
from wide_tf.schema.problems import UsageError
from wide_tf.store import workdir as wd
from wide_tf.study import lr_grid


class StudyError(UsageError):
    """The study cannot run as asked; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Trial:
    trial_id: str
    member: families.Member
    batch_size: int
    lr_multiplier: float
    seed: int
    config: ml_collections.ConfigDict
    role: str = (
        lr_grid.TUNE
    )  # 'tune' (the learning-rate grid) or 'confirm' (the chosen rate, more seeds)

    @property
    def group(self) -> tuple[str, int]:
        """Trials that share a member and batch size compete for the best learning rate."""
        return (self.member.name, self.batch_size)

    def meta(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "member": self.member.name,
            "arch": self.member.arch,
            "depth": self.member.depth,
            "width": self.member.width,
            "params": self.member.params,
            "batch_size": self.batch_size,
            "lr_multiplier": self.lr_multiplier,
            "seed": self.seed,
            "role": self.role,
        }


def resolve_members(config, num_classes: int, input_shape) -> list[families.Member]:
    """The family's members (families.from_config dispatches on sweep.family.kind)."""
    return families.from_config(
        config.model.arch,
        config.sweep.family,
        num_classes=num_classes,
        input_shape=input_shape,
        norm=config.model.norm,
    )


def trial_id(member: families.Member, batch: int, lr_multiplier: float, seed: int, cfg) -> str:
    """Readable and stable: the settings in the name, plus a hash of the whole trial config, so two
    trials with the same name but another protocol never share a folder."""
    text = json.dumps(identity.id_part(cfg), sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{member.name}_b{batch}_lr{lr_multiplier:g}_s{seed}_{digest}"


def trial_name(trial_id_: str) -> str:
    """A trial id less its config hash ('mlp-d1-w667_b8_lr1_s0_cc483cdc' ->
    'mlp-d1-w667_b8_lr1_s0'): the same trial across code versions whose configs gained a field.
    An id without a hash is kept."""
    head, _, tail = trial_id_.rpartition("_")
    hashed = len(tail) == 8 and all(c in "0123456789abcdef" for c in tail)
    return head if head and hashed else trial_id_


def make_trial(
    config,
    member: families.Member,
    batch: int,
    lr_multiplier: float,
    seed: int,
    role: str = lr_grid.TUNE,
) -> Trial:
    cfg = ml_collections.ConfigDict(config.to_dict())  # an unlocked copy
    cfg.model.arch, cfg.model.depth, cfg.model.width = member.arch, member.depth, member.width
    cfg.train.global_batch = int(batch)
    cfg.optim.lr_multiplier = float(lr_multiplier)
    cfg.train.seed = int(seed)
    if _probe_off(config.sweep, batch):
        cfg.train.gradient_every_examples = 0  # the initial probe (gradient_at_init) stays
    del cfg.sweep
    return Trial(
        trial_id(member, batch, lr_multiplier, seed, cfg),
        member,
        int(batch),
        float(lr_multiplier),
        int(seed),
        cfg,
        role,
    )


def _probe_off(sweep, batch: int) -> bool:
    """sweep.probe_batches='smallest': only the runs at the smallest batch measure the gradient
    probe along training; the report reads it nowhere else (the noise-scale prediction reads
    each member's smallest batch at the chosen rate, analysis/prediction.py)."""
    return sweep.get("probe_batches", "smallest") == "smallest" and int(batch) != min(
        int(b) for b in sweep.batch_sizes
    )


def expand(config, num_classes: int, input_shape) -> list[Trial]:
    """Every (member, batch size, learning-rate multiplier, tuning seed) of the initial grid."""
    s = config.sweep
    if not s.batch_sizes:
        raise StudyError("sweep.batch_sizes is empty; list the batch sizes to study")
    members = resolve_members(config, num_classes, input_shape)
    return [
        make_trial(config, m, b, lr, seed)
        for m in members
        for b in s.batch_sizes
        for lr in s.lr_multipliers
        for seed in s.seeds
    ]


def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return 0, 1
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise StudyError(f"--shard={text!r} is not of the form i/n (e.g. 0/2)") from None
    if not 0 <= i < n:
        raise StudyError(f"--shard={text!r}: need 0 <= i < n")
    return i, n


def _stable_index(key: tuple) -> int:
    return int(hashlib.sha1(repr(key).encode()).hexdigest()[:8], 16)


def in_shard(trials: list[Trial], shard: str | None) -> list[Trial]:
    """The trials of shard i of n (`--shard=i/n`; all of them without one). A (member, batch size)
    group stays on one shard, so its learning-rate protocol is decided there."""
    shard_i, shard_n = parse_shard(shard)
    return [t for t in trials if _stable_index(t.group) % shard_n == shard_i]


def pick_trial(trials: list[Trial], only_trial: str | None) -> list[Trial]:
    """All trials, or the one `--trial` names (by id or by its index in --list_trials)."""
    if only_trial is None:
        return trials
    picked = [t for i, t in enumerate(trials) if only_trial in (t.trial_id, str(i))]
    if not picked:
        raise StudyError(f"--trial={only_trial!r} matches no trial; --list_trials shows them")
    return picked


def next_trials(config, trials: list[Trial], results: dict[str, dict]) -> list[Trial]:
    """The trials each (member, batch size) group needs next once all of its trials have finished:
    one more learning rate past the edge of the grid, or the chosen rate on the confirmation
    seeds (`wide_tf.study.lr_grid` decides, from the same code the simulator calibrates)."""
    s = config.sweep
    new = []
    for ts in group_trials(trials).values():
        if any(t.trial_id not in results for t in ts):
            continue
        done = [results[t.trial_id] for t in ts]
        for mult, seed, role in lr_grid.next_runs(
            done,
            s.lr_multipliers,
            s.seeds,
            s.confirm_seeds,
            s.max_lr_extensions,
            extend=s.extend_lr_grid,
        ):
            new.append(make_trial(config, ts[0].member, ts[0].batch_size, mult, seed, role))
    return new


def group_trials(trials: list[Trial]) -> dict[tuple[str, int], list[Trial]]:
    """The initial trials of each (member, batch size) group, in the order of `trials`."""
    groups: dict[tuple[str, int], list[Trial]] = {}
    for t in trials:
        groups.setdefault(t.group, []).append(t)
    return groups


def claim_order(trials: list[Trial]) -> list[tuple[str, int]]:
    """The groups of `trials` in the order processes claim them (or a driver hands them out):
    longest first (smallest batch: the most steps; then the deepest member: the slowest step), so
    that no long group starts last and the processes finish together."""
    members = {t.member.name: t.member for t in trials}
    return sorted(group_trials(trials), key=lambda g: (g[1], -members[g[0]].depth, g[0]))


def expand_group(
    config, initial: list[Trial], results: dict[str, dict]
) -> tuple[list[Trial], list[Trial]]:
    """(every trial of the group known so far, those of them not yet recorded): the initial grid
    plus each round that `lr_grid` asks for once the previous round is recorded. The group is
    finished when nothing is pending."""
    known = list(initial)
    for _ in range(1000):  # lr_grid's extensions and confirmations are finite; a guard only
        pending = [t for t in known if t.trial_id not in results]
        if pending:
            return known, pending
        new = next_trials(config, known, results)
        if not new:
            return known, []
        known += new
    raise StudyError("the learning-rate protocol never finished a group; report it")


def list_trials(config) -> list[Trial]:
    """Every trial of the study, from the config alone (the data set's classes and input shape
    come from its spec, so the parent of --workers=N lists them without TensorFlow)."""
    info = datasets.of(config.data)
    return expand(config, info.num_classes, info.input_shape)


def check_workdir(config, workdir: str) -> None:
    """Opens the workdir's study: refuses a workdir whose config.json holds a different study
    (checks/preflight.check_same_study, the one such check), else writes config.json when there
    is none, with its provenance. Once per study command, before TensorFlow and before any worker
    starts (study/processes.py; without TensorFlow for a local workdir)."""
    if preflight.check_same_study(config, workdir):
        return
    wd.makedirs(workdir)
    saved = json.loads(config.to_json_best_effort())
    saved["provenance"] = provenance.collect()  # who wrote it: code, command, versions, machine
    wd.write_text_atomic(
        wd.join(workdir, wd.CONFIG), json.dumps(saved, indent=2, sort_keys=True) + "\n"
    )
