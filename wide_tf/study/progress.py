"""Owns what a study says about itself while it runs: its plan, the whole study's progress (trials
recorded of those expected, groups finished), the one time-left estimate, the log line of each
trial and of each new round, the console's one line per finished run (the same whatever the
worker count), and the coordinator's own log file in WORKDIR/logs/."""

from __future__ import annotations

import dataclasses
import logging as py_logging
import os
import statistics
import time

from absl import logging

from wide_tf.schema import families
from wide_tf.study import lr_grid
from wide_tf.study.trials import Trial, expand_group, in_shard


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

    @property
    def complete(self) -> bool:
        return self.groups_done == self.groups_total


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


def time_left(elapsed_s: float, ran: int, p: Progress) -> float | None:
    """Seconds until every expected trial is recorded, at the pace of the `ran` trials recorded in
    the last `elapsed_s` seconds; None before the first."""
    return elapsed_s / ran * (p.expected - p.done) if ran > 0 else None


def fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def log_plan(config, trials: list[Trial], shard_i: int, shard_n: int) -> None:
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
    if shard_n > 1 and not in_shard(trials, f"{shard_i}/{shard_n}"):
        logging.warning(
            "Shard %d/%d holds none of this study's %d groups (a group's shard is a hash of its "
            "member and batch size): this command runs nothing; the other shards run them.",
            shard_i,
            shard_n,
            len({t.group for t in trials}),
        )


def log_trial_start(
    t: Trial, k: int, n: int, todo: int, eta_s: float | None, p: Progress | None = None
) -> None:
    """The progress line: trial k of n of its group's round (and how many were done before), what
    it runs, the whole study's trials done of those expected, and the time left for all of
    them."""
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
        "" if eta_s is None else f", about {fmt_time(eta_s)} left",
    )


def log_next(queue: list[Trial]) -> None:
    if queue:
        n_conf = sum(t.role == lr_grid.CONFIRM for t in queue)
        logging.info(
            "Next: %d learning-rate grid extension(s), %d confirmation run(s), %d group(s).",
            len(queue) - n_conf,
            n_conf,
            len({t.group for t in queue}),
        )


def workers_running(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'} running"


def run_line(r: dict) -> str:
    """One finished run on the console: member, batch, rate (and its multiplier), seed, outcome,
    steps (to the target, of the budget run) and seconds."""
    to = r.get("steps_to_target")
    run = r.get("steps", "?")
    steps = (
        f"{run} steps"
        if to is None
        else f"{to} steps to the target" + ("" if to == run else f" ({run} run)")
    )
    rate, mult, wall = r.get("learning_rate"), r.get("lr_multiplier", 1.0), r.get("wall_time_s")
    rate = "?" if rate is None else f"{float(rate):.4g}"
    wall = "?" if wall is None else f"{float(wall):.1f}"
    return (
        f"run done: {r.get('member')} batch {r.get('batch_size')} lr {rate} (x{float(mult):g}) "
        f"seed {r.get('seed')}: {r.get('status')}, {steps}, {wall} s"
    )


def log_run(r: dict) -> None:
    logging.info("%s", run_line(r))


def keep_log(workdir: str, logs: str = "logs") -> str | None:
    """The coordinator's own log lines (absl's, every level it prints) also into
    WORKDIR/logs/coordinator.<time>.<pid>.log, beside the workers' logs; returns its path. None on
    a gs:// workdir (the console keeps them there) or a folder that cannot be made."""
    if "://" in workdir:
        return None
    folder = os.path.join(workdir, logs)
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(
            folder, f"coordinator.{time.strftime('%Y%m%d-%H%M%S')}.{os.getpid()}.log"
        )
        handler = py_logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None
    absl_handler = logging.get_absl_handler()
    handler.setFormatter(absl_handler.formatter or logging.PythonFormatter())
    handler.setLevel(py_logging.DEBUG)
    logging.get_absl_logger().addHandler(handler)
    logging.info("This command's log: %s", path)
    return path
