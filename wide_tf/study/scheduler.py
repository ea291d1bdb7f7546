"""Owns a study: expands a config's sweep into trials with stable ids, runs them (or one shard of
them) in one process, or as one of several worker processes that claim (member, batch size) groups
(`run_worker`; the processes themselves are wide_tf/workers.py's), resumes, tunes the learning
rate per (member, batch size), estimates the whole study's progress, and writes the report at the
end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import time

import ml_collections
import tensorflow as tf
from absl import logging

from wide_tf import report
from wide_tf.engine import data as data_lib
from wide_tf.engine import preemption
from wide_tf.engine import train as train_lib
from wide_tf.engine.strategy import setup_runtime
from wide_tf.spec import families
from wide_tf.store import claims as claims_lib
from wide_tf.store import workdir as wd
from wide_tf.study import lr_grid

# Runs are started as train_lib.train_and_evaluate (not a bound name): the bench and the
# interruption tests wrap that function on its module.


class StudyError(ValueError):
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


# Settings that change how a run is executed, not what it computes: they may differ between the
# machines (or the sessions) that share a study, and do not enter trial ids.
_OPERATIONAL = {
    "runtime": None,
    "train": ("steps_per_loop", "checkpoint_every_steps", "eval_batch"),
}


def _study_part(config) -> dict:
    """The part of a config that defines the study's results."""
    d = (
        json.loads(config.to_json_best_effort())
        if hasattr(config, "to_json_best_effort")
        else dict(config)
    )
    for section, keys in _OPERATIONAL.items():
        if keys is None:
            d.pop(section, None)
        elif isinstance(d.get(section), dict):
            d[section] = {k: v for k, v in d[section].items() if k not in keys}
    return d


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
    digest = hashlib.sha1(json.dumps(_study_part(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return f"{member.name}_b{batch}_lr{lr_multiplier:g}_s{seed}_{digest}"


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


def check_workdir(config, workdir: str) -> None:
    """Writes config.json, or refuses a workdir that holds a different study."""
    path = wd.join(workdir, wd.CONFIG)
    mine = _study_part(config)
    if tf.io.gfile.exists(path):
        theirs = _study_part(wd.read_json(path))
        if theirs != mine:
            diff = sorted(_diff_keys(theirs, mine))
            raise StudyError(
                f"{workdir} holds a different study (config differs in: {', '.join(diff[:6])}"
                f"{' ...' if len(diff) > 6 else ''}); use a new --workdir, or the config that "
                "made it"
            )
        return
    tf.io.gfile.makedirs(workdir)
    wd.write_text_atomic(path, config.to_json_best_effort(indent=2, sort_keys=True) + "\n")


def _diff_keys(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in set(a) | set(b):
            yield from _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


def next_trials(config, trials: list[Trial], results: dict[str, dict]) -> list[Trial]:
    """The trials each (member, batch size) group needs next once all of its trials have finished:
    one more learning rate past the edge of the grid, or the chosen rate on the confirmation
    seeds (`wide_tf.study.lr_grid` decides, from the same code the simulator calibrates)."""
    s = config.sweep
    groups: dict[tuple, list[Trial]] = {}
    for t in trials:
        groups.setdefault(t.group, []).append(t)
    new = []
    for ts in groups.values():
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


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a whole study stands: trials recorded of the trials expected in all (every round:
    grid, extensions, confirmations), and groups finished of all groups."""

    done: int
    expected: int
    groups_done: int
    groups_total: int

    def describe(self) -> str:
        return (
            f"{self.done}/{self.expected} trials (expected), "
            f"{self.groups_done}/{self.groups_total} groups done"
        )


def estimate_progress(
    config, initial: dict[tuple[str, int], list[Trial]], results: dict[str, dict]
) -> Progress:
    """Expected trials per unfinished group: the median size of the finished groups once there are
    any (they show how many extensions and confirmations this study's cells need), else the
    initial grid plus one extension round plus the confirmations; never fewer than the group
    already has. A group in its confirmation round knows its size."""
    s = config.sweep
    tuning_seeds = {int(x) for x in s.seeds}
    n_confirm = len([x for x in s.confirm_seeds if int(x) not in tuning_seeds])
    states = {g: expand_group(config, ts, results) for g, ts in initial.items()}
    finished = [len(known) for known, pending in states.values() if not pending]
    done = expected = 0
    for g, (known, pending) in states.items():
        done += len(known) - len(pending)
        if not pending or any(t.role == lr_grid.CONFIRM for t in known):
            expected += len(known)
            continue
        if finished:
            guess = statistics.median(finished)
        else:
            grid = len(initial[g])
            extension = len(tuning_seeds) if s.extend_lr_grid and s.max_lr_extensions > 0 else 0
            guess = grid + extension + n_confirm
        expected += max(len(known), round(guess))
    return Progress(done, expected, len(finished), len(states))


def _claim_order(groups: list[tuple[str, int]], members: dict[str, families.Member]) -> list:
    """Groups in the order workers claim them: longest first (smallest batch: the most steps;
    then the deepest member: the slowest step), so that no long group starts last and the workers
    finish together."""
    return sorted(groups, key=lambda g: (g[1], -members[g[0]].depth, g[0]))


class WorkerStopped(preemption.Preempted):
    """SIGTERM reached a worker between trials: nothing to checkpoint, same exit (143)."""

    def __init__(self):
        Exception.__init__(
            self, "worker stopped by SIGTERM between trials; run the same command again to resume"
        )
        self.name, self.step = "worker", 0


class LostClaim(Exception):
    """Another worker took this worker's group over (its heartbeat was judged stale)."""


def run_worker(
    config,
    workdir: str,
    run_id: str,
    shard: str | None = None,
    poll_s: float = 2.0,
    stale_s: float = claims_lib.STALE_S,
    heartbeat_s: float = claims_lib.HEARTBEAT_S,
) -> int:
    """One worker of a study: claims the next unclaimed (member, batch size) group, runs its whole
    learning-rate protocol (grid, extensions, confirmations), releases it, and repeats until
    every group of the study (this shard's) is finished; waits meanwhile for groups that other
    workers hold, to take them over if their owner dies. Returns the number of trials run."""
    trials = list_trials(config)
    shard_i, shard_n = parse_shard(shard)
    trials = [t for t in trials if _stable_index(t.group) % shard_n == shard_i]
    # Every worker checks (or writes) config.json: the parent starts them before it could. Two
    # writing it at once write the same text, each atomically.
    check_workdir(config, workdir)
    initial = group_trials(trials)
    members = {t.member.name: t.member for t in trials}
    order = _claim_order(list(initial), members)
    claims = claims_lib.Claims(workdir, run_id, stale_s=stale_s)
    runtime = setup_runtime(config.runtime)
    stop_heartbeat = claims.start_heartbeat(heartbeat_s)
    ran, waited = 0, False
    try:
        while True:
            if preemption.requested():  # SIGTERM between groups (or while waiting for one)
                raise WorkerStopped()
            results = {r["trial_id"]: r for r in wd.read_results(workdir)}
            open_groups = [g for g in order if expand_group(config, initial[g], results)[1]]
            if not open_groups:
                break
            current = claims.current()
            picked = None
            for g in open_groups:
                key = claims_lib.group_key(g)
                if claims.available(current.get(key)) and claims.try_claim(key, current.get(key)):
                    picked = g
                    break
            # A group whose trial raised in a sibling stays for the next run (it would fail here
            # too): nothing to wait for once only such groups are open.
            failed = {
                g for g in open_groups if claims.failed_here(current.get(claims_lib.group_key(g)))
            }
            if picked is None and len(failed) == len(open_groups):
                logging.warning("Only groups that failed in another worker are left: stopping.")
                break
            if picked is None:  # all open groups are held by live workers: wait, to take over
                if not waited:
                    logging.info("No group free: waiting for %d held by others.", len(open_groups))
                    waited = True
                time.sleep(poll_s)
                continue
            waited = False
            key = claims_lib.group_key(picked)
            prior = current.get(key)
            logging.info(
                "Claimed group %s (batch %d)%s.",
                picked[0],
                picked[1],
                f", taken over from {prior.body.get('host')}:{prior.body.get('pid')} "
                f"({prior.body.get('state')})"
                if prior is not None
                else "",
            )
            try:
                ran += _run_group(config, workdir, initial[picked], runtime, claims, key)
            except LostClaim:
                logging.warning("Group %s was taken over by another worker; moving on.", key)
                continue
            except (preemption.Preempted, KeyboardInterrupt):  # free for anyone at once
                claims.release(key, claims_lib.STOPPED)
                raise
            except BaseException:
                claims.release(key, claims_lib.FAILED)
                raise
            claims.release(key, claims_lib.DONE)
    finally:
        stop_heartbeat.set()
    logging.info("Worker done: %d trials run; no group left to claim.", ran)
    return ran


def _run_group(config, workdir, initial, runtime, claims, key) -> int:
    """Runs one claimed group to the end of its learning-rate protocol."""
    ran = 0
    while True:
        results = {r["trial_id"]: r for r in wd.read_results(workdir)}
        _, pending = expand_group(config, initial, results)
        if not pending:
            return ran
        for t in pending:
            if not claims.still_mine(key):
                raise LostClaim(key)
            logging.info(
                "=== %s (batch %d, lr x%g, seed %d, %s) ===",
                t.member.name,
                t.batch_size,
                t.lr_multiplier,
                t.seed,
                t.role,
            )
            result = train_lib.train_and_evaluate(
                t.config, wd.trial_dir(workdir, t.trial_id), runtime, t.meta()
            )
            wd.record_result(workdir, result)
            ran += 1


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def run_study(
    config,
    workdir: str,
    shard: str | None = None,
    only_trial: str | None = None,
    write_report: bool = True,
) -> list[dict]:
    """Runs every trial of the study not yet recorded in WORKDIR/results/ (this shard's share)."""
    trials = _pick_trial(list_trials(config), only_trial)
    shard_i, shard_n = parse_shard(shard)
    check_workdir(config, workdir)
    _log_plan(config, trials, shard_i, shard_n)
    runtime = setup_runtime(config.runtime)  # once: TensorFlow and the strategy serve every trial
    # A (member, batch size) group stays on one shard, so its learning-rate grid is decided there.
    mine = lambda t: _stable_index(t.group) % shard_n == shard_i
    start, ran = time.time(), 0
    queue = [t for t in trials if mine(t)]
    initial = group_trials(queue)
    all_trials = list(trials)
    while queue:
        results = {r["trial_id"]: r for r in wd.read_results(workdir)}
        todo = [t for t in queue if t.trial_id not in results]
        for k, t in enumerate(todo):
            # The estimate covers the whole study (this shard's groups): every round, with the
            # extensions and confirmations still to come, not only this round's trials.
            p = estimate_progress(config, initial, results)
            eta = (time.time() - start) / ran * (p.expected - p.done) if ran else None
            _log_trial_start(t, len(queue) - len(todo) + k + 1, len(queue), len(todo), eta, p)
            result = train_lib.train_and_evaluate(
                t.config, wd.trial_dir(workdir, t.trial_id), runtime, t.meta()
            )
            if runtime.strategy.extended.should_checkpoint:  # the chief records; others only help
                wd.record_result(workdir, result)
            results[t.trial_id] = result
            # No clear_session() here: the next trial of the same member and batch size reuses this
            # one's model and traced step; train.py drops them (and clears the session) when the
            # next trial needs another model.
            ran += 1
        if only_trial is not None:
            break
        results = {r["trial_id"]: r for r in wd.read_results(workdir)}
        queue = next_trials(config, [t for t in all_trials if mine(t)], results)
        _log_next(queue)
        all_trials += queue
    logging.info(
        "Study done in this process: %d trials run in %s.", ran, _fmt_time(time.time() - start)
    )
    records = wd.read_results(workdir)
    if write_report:
        path = report.write_report(workdir)
        logging.info("Report: %s", path)
    return records


def _pick_trial(trials: list[Trial], only_trial: str | None) -> list[Trial]:
    """All trials, or the one `--trial` names (by id or by its index in --list_trials)."""
    if only_trial is None:
        return trials
    picked = [t for i, t in enumerate(trials) if only_trial in (t.trial_id, str(i))]
    if not picked:
        raise StudyError(f"--trial={only_trial!r} matches no trial; --list_trials shows them")
    return picked


def _log_plan(config, trials: list[Trial], shard_i: int, shard_n: int) -> None:
    members = sorted({t.member for t in trials}, key=lambda m: m.depth)
    logging.info(
        "Study: %d trials (%d members x %d batch sizes x %d learning rates x %d seeds)%s",
        len(trials),
        len(members),
        len(config.sweep.batch_sizes),
        len(config.sweep.lr_multipliers),
        len(config.sweep.seeds),
        f", shard {shard_i}/{shard_n}" if shard_n > 1 else "",
    )
    for line in families.format_table(members).splitlines():
        logging.info("  %s", line)


def _log_trial_start(
    t: Trial, k: int, n: int, todo: int, eta_s: float | None, p: Progress | None = None
) -> None:
    """The progress line: trial k of n of this round (and how many were done before), what it
    runs, the whole study's trials done of those expected, and the time left for all of them."""
    logging.info(
        "=== trial %d/%d%s: %s (batch %d, lr x%g, seed %d)%s%s ===",
        k,
        n,
        f" ({n - todo} done before)" if todo < n else "",
        t.member.name,
        t.batch_size,
        t.lr_multiplier,
        t.seed,
        "" if p is None else f"; study {p.describe()}",
        "" if eta_s is None else f", about {_fmt_time(eta_s)} left",
    )


def _log_next(queue: list[Trial]) -> None:
    if queue:
        n_conf = sum(t.role == lr_grid.CONFIRM for t in queue)
        logging.info(
            "Next: %d learning-rate grid extension(s), %d confirmation run(s), %d group(s).",
            len(queue) - n_conf,
            n_conf,
            len({t.group for t in queue}),
        )


def list_trials(config) -> list[Trial]:
    info = data_lib.dataset_info(config.data)
    return expand(config, info.num_classes, info.input_shape)
