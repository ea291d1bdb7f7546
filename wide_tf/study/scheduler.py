"""Owns running a study's trials: one loop, in which a process claims the next open (member, batch
size) group, runs its whole learning-rate protocol (grid, extensions, confirmations) and releases
it, until no group is open. Every process runs it with the same claims, files in the workdir
(wide_tf/store/claims.py): one process (`--workers=1`, `--trial`, a shard) as well as each of N
worker processes (wide_tf/study/workers.py starts them), so that a dead worker's group is taken
over and two commands on one workdir share its groups instead of training them twice.
study/processes.py decides which processes run it (`run_study` here, or `run_worker` in each
worker, wide_tf/study/worker.py) and opens the workdir's study once before either starts."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Iterator

from absl import logging

from wide_tf.engine import preemption, timing
from wide_tf.engine import train as train_lib
from wide_tf.store import claims as claims_lib
from wide_tf.store import workdir as wd
from wide_tf.study import progress
from wide_tf.study.trials import (
    Trial,
    claim_order,
    expand_group,
    group_trials,
    in_shard,
    list_trials,
    parse_shard,
    pick_trial,
)

# What a fence checks after (engine/timing.py's events): a host loop, an evaluation pass, a probe.
FENCED = ("train", "eval", "probe")
# Runs are started as train_lib.train_and_evaluate (not a bound name): the bench and the
# interruption tests wrap that function on its module.


class WorkerStopped(preemption.Preempted):
    """SIGTERM reached a worker between trials: nothing to checkpoint, same exit (143)."""

    def __init__(self):
        Exception.__init__(
            self, "worker stopped by SIGTERM between trials; run the same command again to resume"
        )
        self.name, self.step = "worker", 0


def run_study(config, workdir: str, shard: str | None = None, only_trial: str | None = None):
    """Runs every trial of the study not yet recorded in WORKDIR/results/ (this shard's share; the
    one `--trial` names, without the rounds it may lead to) in this process; returns every
    recorded result. The workdir's study was opened by the caller (trials.check_workdir:
    processes.run, once per command)."""
    trials = pick_trial(list_trials(config), only_trial)
    shard_i, shard_n = parse_shard(shard)
    progress.log_plan(config, trials, shard_i, shard_n)
    start = time.time()
    claims = claims_lib.Claims(workdir, uuid.uuid4().hex[:12])
    ran = _run_groups(config, workdir, in_shard(trials, shard), claims, only_trial is None)
    logging.info(
        "Study done in this process: %d trials run in %s.",
        ran,
        progress.fmt_time(time.time() - start),
    )
    return wd.read_results(workdir, whole=True)


def run_worker(
    config,
    workdir: str,
    run_id: str,
    shard: str | None = None,
    poll_s: float = 2.0,
    stale_s: float | None = None,
    heartbeat_s: float | None = None,
) -> int:
    """One worker of a study: runs groups until every group of the study (this shard's) is
    finished, waiting meanwhile for groups that other workers hold, to take them over if their
    owner dies. Returns the number of trials run."""
    trials = in_shard(list_trials(config), shard)
    # config.json was checked (or written) by the parent before it started the workers, and
    # `config` is the one the parent checked (worker.thaw): nothing is checked again.
    claims = claims_lib.Claims(workdir, run_id, stale_s=stale_s)
    ran = _run_groups(config, workdir, trials, claims, True, poll_s, heartbeat_s)
    logging.info("Worker done: %d trials run; no group left to claim.", ran)
    return ran


@dataclasses.dataclass
class _Share:
    """One process's share of a study: its groups in claim order, its claims, its runtime, and the
    results it has produced (a non-chief of a multi-worker strategy records none)."""

    config: object
    workdir: str
    initial: dict[tuple[str, int], list[Trial]]
    order: list[tuple[str, int]]
    claims: object
    follow: bool  # False for --trial: the named trial only, not the rounds that follow it
    runtime: object = None
    start: float = dataclasses.field(default_factory=time.time)
    done_before: int = 0
    ran: int = 0
    mine: dict = dataclasses.field(default_factory=dict)
    last_member: str | None = None  # the member of the group this process ran last
    read_cache: dict = dataclasses.field(default_factory=dict)  # results/ files read so far

    def results(self) -> dict[str, dict]:
        recorded, _ = wd.read_results_counted(self.workdir, whole=True, cache=self.read_cache)
        return {**{r["trial_id"]: r for r in recorded}, **self.mine}

    def state(self, g, results) -> tuple[list[Trial], list[Trial]]:
        """(the group's trials known so far, those not yet recorded)."""
        if not self.follow:
            return self.initial[g], [t for t in self.initial[g] if t.trial_id not in results]
        return expand_group(self.config, self.initial[g], results)


def open_share(config, workdir: str, trials, claims, follow: bool = True) -> _Share:
    """One process's share of a study, ready to run groups: its runtime set up once (TensorFlow
    and the strategy, or JAX's devices, serve every group), partial records set aside."""
    initial = group_trials(trials)
    share = _Share(config, workdir, initial, claim_order(trials), claims, follow)
    share.runtime = train_lib.runtime_for(config)
    for line in wd.set_aside_partial(workdir):  # a partial record is not done: it runs again
        logging.warning("%s", line)
    share.done_before = progress.estimate_progress(config, initial, share.results()).done
    return share


def _run_groups(config, workdir, trials, claims, follow, poll_s=2.0, heartbeat_s=None) -> int:
    """The loop of every process of a study: claim the next open group (waiting while live workers
    hold all of them), run it, release it; returns the number of trials run."""
    share = open_share(config, workdir, trials, claims, follow)
    stop_heartbeat = claims.start_heartbeat(heartbeat_s or claims_lib.HEARTBEAT_S)
    waited, noted = False, set()
    try:
        while True:
            if preemption.requested():  # SIGTERM between groups (or while waiting for one)
                raise WorkerStopped()
            results = share.results()
            open_groups = [g for g in share.order if share.state(g, results)[1]]
            if not open_groups:
                return share.ran
            current = claims.current()
            noted = _log_notes(claims.notes(current), noted)
            picked = _claim_next(
                claims, _same_member_first(open_groups, share.last_member), current
            )
            if picked is None:
                # A group whose trial raised in a sibling stays for the next run (it would fail
                # here too): nothing to wait for once only such groups are open.
                keys = [claims_lib.group_key(g) for g in open_groups]
                if all(claims.failed_here(current.get(k)) for k in keys):
                    logging.warning("Only groups that failed in another worker are left: stopping.")
                    return share.ran
                if not waited:  # all open groups are held by live workers: wait, to take over
                    logging.info("No group free: waiting for %d held by others.", len(open_groups))
                    waited = True
                time.sleep(poll_s)
                continue
            waited = False
            _run_claimed(share, picked, current.get(claims_lib.group_key(picked)))
            share.last_member = picked[0]
    finally:
        stop_heartbeat.set()


def _log_notes(notes: list[str], noted: set) -> set:
    """Logs each claim note (a skewed heartbeat, a broken claim file) once; returns those seen."""
    for line in notes:
        if line not in noted:
            logging.warning("%s", line)
    return set(notes)


def _same_member_first(groups: list, member: str | None) -> list:
    """`groups` with the open groups of `member` first, each part in claim order: the next batch
    size of the member a process just ran keeps its build (engine/tf/reuse.py: the model, evaluation
    sets, probe and their traced functions), and at most the step is traced again."""
    return [g for g in groups if g[0] == member] + [g for g in groups if g[0] != member]


def _claim_next(claims, open_groups, current):
    """The first open group this process may claim and wins, or None."""
    for g in open_groups:
        key = claims_lib.group_key(g)
        if claims.available(current.get(key)) and claims.try_claim(key, current.get(key)):
            return g
    return None


def _run_claimed(share: _Share, g, prior) -> None:
    """Runs a claimed group and releases it: done, stopped (free for anyone at once) or failed."""
    key = claims_lib.group_key(g)
    logging.info(
        "Claimed group %s (batch %d)%s.",
        g[0],
        g[1],
        f", taken over from {prior.body.get('host')}:{prior.body.get('pid')} "
        f"({prior.body.get('state')})"
        if prior is not None
        else "",
    )
    try:
        _run_group(share, g, key)
    except claims_lib.LostClaim:
        logging.warning(
            "Group %s was taken over by another worker while this one had stopped beating: its "
            "run stopped before writing anything more; moving on.",
            key,
        )
        return
    except (preemption.Preempted, KeyboardInterrupt):
        share.claims.release(key, claims_lib.STOPPED)
        raise
    except BaseException:
        share.claims.release(key, claims_lib.FAILED)
        raise
    share.claims.release(key, claims_lib.DONE)


def run_group(share: _Share, g) -> int:
    """Runs group `g`, handed to this process by a driver (wide_tf/cluster/), to the end of its
    learning-rate protocol; returns the trials it ran."""
    before = share.ran
    _run_group(share, g, claims_lib.group_key(g))
    share.last_member = g[0]
    return share.ran - before


def _run_group(share: _Share, g, key) -> None:
    """Runs one claimed group to the end of its learning-rate protocol, round by round."""
    first_round = True
    while True:
        results = share.results()
        known, pending = share.state(g, results)
        if not pending:
            return
        if not first_round:
            progress.log_next(pending)
        first_round = False
        # The estimate covers the whole study (this shard's groups): every round, with the
        # extensions and confirmations still to come, not only this group's. Once per round:
        # expanding every group's protocol before each trial took ~3% of a local study (py-spy).
        at_round = progress.estimate_progress(share.config, share.initial, results)
        # The round's trials are ready together: runtime.cohort of them train as one cohort
        # (engine/cohort.py), one at a time when it is 1.
        size = _cohort_size(share.config)
        for first in range(0, len(pending), size):
            chunk = pending[first : first + size]
            if not share.claims.still_mine(key):
                raise claims_lib.LostClaim(key)
            for k, t in enumerate(chunk, start=first):
                p = dataclasses.replace(at_round, done=at_round.done + k)
                eta = progress.time_left(time.time() - share.start, p.done - share.done_before, p)
                done = len(known) - len(pending)
                progress.log_trial_start(t, done + k + 1, len(known), len(pending), eta, p)
            with _fence(share.claims, key):
                chunk_results = _train(share, chunk)
            for t, result in zip(chunk, chunk_results):
                if _chief(share.runtime):  # the chief records, while the group is its own
                    share.claims.record(share.workdir, key, result)
                    progress.log_run(result)  # the console's line (a worker's: its log's)
                # No clear_session() here: the next trial of the same member and batch size
                # reuses this one's model and traced step; train.py drops them (and clears the
                # session) when the next trial needs another model.
                share.mine[t.trial_id] = result
                results[t.trial_id] = result
                share.ran += 1


def _cohort_size(config) -> int:
    """runtime.cohort (configs written before the field: 1, one run at a time)."""
    runtime = config.get("runtime") if hasattr(config, "get") else None
    return max(1, int((runtime or {}).get("cohort", 1) or 1))


def _train(share: _Share, chunk: list[Trial]) -> list[dict]:
    """The records of `chunk`'s trials: one trained alone, several as one cohort (the command
    line checked the rules)."""
    workdirs = [wd.trial_dir(share.workdir, t.trial_id) for t in chunk]
    if len(chunk) == 1:
        t = chunk[0]
        return [train_lib.train_and_evaluate(t.config, workdirs[0], share.runtime, t.meta(), True)]
    return train_lib.train_and_evaluate_cohort(
        [t.config for t in chunk], workdirs, share.runtime, [t.meta() for t in chunk], True
    )


@contextlib.contextmanager
def _fence(claims, key: str) -> Iterator[None]:
    """Inside: after each host loop, evaluation pass and probe of the run (engine/timing.py's
    events), before the checkpoint, summaries or result that follow, the group is checked to be
    still this process's; LostClaim stops the run there (a worker that was stopped past the
    lease finds its group taken over and writes nothing more)."""

    def check(kind, start, seconds, count):
        if kind in FENCED and not claims.still_mine(key):
            raise claims_lib.LostClaim(key)

    with timing.listening(check):
        yield


def _chief(runtime) -> bool:
    """Whether this process records results: JAX's runtime says so; on TensorFlow, the strategy."""
    chief = getattr(runtime, "chief", None)
    return chief if chief is not None else runtime.strategy.extended.should_checkpoint
