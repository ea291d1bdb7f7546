"""Owns running a study in several worker processes on one machine (`--workers=N`): how many by
default, which cores or GPU each one gets, starting them, forwarding SIGTERM/SIGINT to them,
printing the whole study's progress, surfacing a failed worker, and saying whether the one report is
due once all of them are done (main writes it). Which (member, batch size) group each worker runs
is decided by the workers themselves through claims, files of this machine (wide_tf/store/claims.py,
wide_tf/study/scheduler.py); several machines on one study are a Ray cluster's (wide_tf/cluster/).

A worker is `python -m wide_tf.study.worker` (wide_tf/study/worker.py: it dies with its parent,
and runs no check again) reading the config this parent checked, frozen into its logs folder
(`freeze_config`), with WIDE_TF_WORKER in its environment (its index, the run id, its cores and
GPU) and the variables the config asks for (`worker.environment`: KERAS_BACKEND). The parent
stops the workers it started on every way out (its supervision's end, an error while starting
them, any exit of the interpreter); each invocation's workers log to files of their own,
WORKDIR/logs/worker-<k>.<run id>.log, so that no error line of another invocation is quoted.
A worker pins itself to its cores with `os.sched_setaffinity` and gets TensorFlow's intra- and
inter-op threads set to that many cores before TensorFlow starts; on a GPU machine each worker sees
one GPU (CUDA_VISIBLE_DEVICES): a 50k-parameter model gains nothing from MirroredStrategy over 8
GPUs, while 8 independent groups keep all 8 busy. The parent supervises without TensorFlow (for a
local workdir: the results are read through os, wide_tf/store/workdir.py); main imports it only
for the report once every worker is done.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from wide_tf.checks import validate
from wide_tf.schema import hardware, provenance
from wide_tf.store import workdir as wd
from wide_tf.study import worker
from wide_tf.study.worker import WorkerSpec

LOGS = "logs"
# How often the parent looks at the workers and the results, and the longest it stays silent.
POLL_S = 1.0
PROGRESS_EVERY_S = 60.0
# How long the parent waits for its workers after SIGTERM before it kills them: a worker
# checkpoints after its current host loop (seconds to a minute), so 5 minutes means it cannot.
STOP_GRACE_S = 300.0


# The machine's cores and GPUs, seen without starting TensorFlow (which would claim the GPUs'
# memory in the parent); module names so that a test can stand in for the machine.
cpu_cores = hardware.cpu_cores
gpu_ids = hardware.gpu_ids


def _tpu_machine(config) -> bool:
    rt = config.runtime
    return rt.strategy == "tpu" or hardware.tpu_reachable(rt.tpu)


def default_workers(config, n_groups: int | None = None) -> int:
    """What the machine has: 1 on a TPU (one process drives it) or with runtime.strategy =
    multi_worker; one per GPU on a GPU machine; else one per CPU core (the local studies' models
    are small enough that a core each beats two cores on one model). Never more than there are
    (member, batch size) groups, the unit of work."""
    if _tpu_machine(config) or config.runtime.strategy == "multi_worker":
        n = 1
    elif config.runtime.strategy != "cpu" and gpu_ids():
        n = len(gpu_ids())
    else:
        n = len(cpu_cores())
    return max(1, min(n, n_groups)) if n_groups else max(1, n)


def plan(n: int, run_id: str, config) -> list[WorkerSpec]:
    """Worker k's cores (an even split of this process's cores; a core each, shared round-robin,
    when there are more workers than cores) and its GPU (worker k gets GPU k mod #GPUs)."""
    cores = cpu_cores()
    gpus = gpu_ids() if config.runtime.strategy != "cpu" else []
    per = max(1, len(cores) // n)
    specs = []
    for k in range(n):
        if len(cores) >= n:
            mine = cores[k * per : (k + 1) * per]
        else:
            mine = [cores[k % len(cores)]]
        specs.append(WorkerSpec(k, n, run_id, tuple(mine), gpus[k % len(gpus)] if gpus else None))
    return specs


def log_dir(workdir: str) -> tuple[str, bool]:
    """Where the worker logs go: WORKDIR/logs for a local workdir; for a gs:// one a local folder
    (a process writes its stdout to a local file), copied to WORKDIR/logs at the end."""
    if "://" not in workdir:
        return os.path.join(workdir, LOGS), False
    name = uuid.uuid5(uuid.NAMESPACE_URL, workdir).hex[:12]
    return os.path.join(tempfile.gettempdir(), f"wide_tf-logs-{name}"), True


def _last_line(path: str) -> str:
    """The line that explains a worker's failure: its last `error:` line, else its last line."""
    try:
        text = wd.read_checked(path, wd.MAX_FILE_BYTES).decode("utf-8", errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def _no_output(path: str) -> str:
    """What to say of a failed worker whose log is empty: the disk holding the log, when it is
    full, is why (a re-run on a still-full disk said only "(no output)")."""
    folder = os.path.dirname(path)
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return "(no output)"
    free = st.f_bavail * st.f_frsize
    if free < 1 << 20:
        return (
            f"(no output: {folder} has {free} bytes free, so the worker could not write its log "
            "or its files; the disk is full: free space and run the same command again)"
        )
    return "(no output)"


class _Signals:
    """In the parent: SIGTERM and SIGINT are passed to every worker as SIGTERM (each checkpoints
    after its current host loop and exits 143); the parent then waits for them and exits 143
    (SIGTERM) or 130 (SIGINT). A second signal is passed on too: a worker's second SIGTERM kills
    it at once."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs
        self.received: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}


def count_for(config, requested: str | None, one_process: bool) -> int:
    """The processes a study runs in: `requested` (--workers), or the machine's default (never
    more than the study has groups); 1 when `one_process` (--trial, --list_trials, a single run,
    the theory check)."""
    if one_process:
        return 1
    groups = count_groups(config)
    n = validate.parse_workers(requested)
    if n is not None:
        return max(1, min(n, groups))  # a worker more than there are groups would only wait
    return default_workers(config, groups)


def count_groups(config) -> int:
    """The study's (member, batch size) groups, without TensorFlow: members x batch sizes."""
    s = config.sweep
    f = s.family
    members = list(f.widths) if f.kind == "width" else list(f.depths)
    return max(1, len(members) * len(s.batch_sizes))


@dataclasses.dataclass
class Started:
    """Workers started by `start`, supervised by `supervise`."""

    procs: list[subprocess.Popen]
    paths: list[str]
    specs: list[WorkerSpec]
    signals: _Signals
    remote_logs: bool
    start: float


def freeze_config(config, logs: str, run_id: str) -> str:
    """Writes the checked config for this invocation's workers (LOGS/config.<run id>.json, a
    local file even for a gs:// workdir) and returns its path: the workers read it instead of
    checking the command again (worker.thaw gives the same ConfigDict back)."""
    path = os.path.join(logs, f"config.{run_id}.json")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(config.to_dict(), f, indent=1)
    os.replace(tmp, path)
    return path


def start(config, workdir: str, n: int, shard: str | None = None, verbose: bool = False):
    """Starts n workers on the study `config` (checked, and the workdir's study opened, by the
    caller: study/processes.py). Called before the parent imports TensorFlow, so the workers'
    start-up is not queued behind the parent's; SIGTERM, SIGINT and SIGHUP to the parent are
    passed on from here on. A worker that cannot be started stops those already started and
    raises a RuntimeProblem (one line)."""
    run_id = uuid.uuid4().hex[:12]
    logs, remote_logs = log_dir(workdir)
    if os.path.exists(logs) and not os.path.isdir(logs):
        raise validate.RuntimeProblem(
            f"{logs} is a file, not a folder (the workers' logs go there); move it aside and run "
            "the same command again"
        )
    os.makedirs(logs, exist_ok=True)
    try:
        frozen = freeze_config(config, logs, run_id)
    except OSError as e:
        raise validate.RuntimeProblem(
            f"cannot write the workers' config in {logs}: {e.strerror or e}; fix it and run the "
            "same command again"
        ) from None
    specs = plan(n, run_id, config)
    argv = worker.command(frozen, workdir, shard, verbose)
    base = dict(os.environ, **worker.environment(config), **provenance.child_env())
    base[worker.PARENT_ENV] = str(os.getpid())
    procs, paths = [], []
    started = Started(procs, paths, specs, _Signals(procs).__enter__(), remote_logs, time.time())
    atexit.register(_stop_all, started)  # every exit of the interpreter stops the workers
    for s in specs:
        path = os.path.join(logs, f"worker-{s.index}.{run_id}.log")
        paths.append(path)
        # Its records name the user's command (provenance); KERAS_BACKEND from the config.
        env = dict(base, **{worker.ENV: s.to_env()})
        try:
            with open(path, "w") as f:
                # A new session: a terminal's Ctrl-C reaches the parent only, which passes it on
                # as SIGTERM (a clean checkpoint) instead of a KeyboardInterrupt mid-step.
                procs.append(
                    subprocess.Popen(
                        argv,
                        env=env,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        except OSError as e:
            _stop_all(started)
            raise validate.RuntimeProblem(
                f"cannot start worker {s.index}: {path}: {e.strerror or e}; the workers already "
                "started were stopped: fix it and run the same command again"
            ) from None
    # The parent only watches from here on (without TensorFlow): its polls must not take CPU
    # from the workers'.
    try:
        os.nice(5)
    except OSError:
        pass
    return started


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a study's processes ended: whether its report is due now (main writes it), the exit
    status for the command, and the failure to raise once the report is written."""

    report_due: bool
    exit_code: int = 0
    failure: Exception | None = None


def supervise(
    started: Started, config, workdir: str, shard: str | None = None, log=print, on_complete=None
):
    """Prints the study's progress until every worker has exited; returns an `Outcome`: the report
    is due when every group is finished, the exit status is 143 / 130 after SIGTERM / SIGINT, and
    a failed worker (or groups left unfinished) is a WorkerFailed (one line). Results are never
    touched here: a re-run resumes. `on_complete()` runs once, in a thread of its own, as soon as
    the study's end is near: every group finished, or a worker ended having nothing left to claim
    (its core is free and the groups left are the others'); it is awaited before this returns
    (main imports TensorFlow for the report there, while the last groups run and the workers
    exit)."""
    from wide_tf.study import trials as trials_lib

    try:
        initial = trials_lib.group_trials(
            trials_lib.in_shard(trials_lib.list_trials(config), shard)
        )
        log(
            f"Study: {len(initial)} groups, {len(started.procs)} workers ("
            + ", ".join(
                f"{s.index}: cores {','.join(map(str, s.cpus))}"
                + ("" if s.gpu is None else f" GPU {s.gpu}")
                for s in started.specs
            )
            + f"); their logs: {os.path.join(workdir, LOGS)}/worker-<k>."
            f"{started.specs[0].run_id}.log"
        )
        failed = _watch(started, config, workdir, initial, log, on_complete)
    finally:
        _stop_all(started)
    return _outcome(started, config, workdir, initial, failed, log)


def _progress(config, workdir: str, initial, seen: set | None = None, log=None):
    """The study's progress; with `seen` (trial ids already told), one console line per run
    finished since (progress.run_line), whichever worker ran it."""
    from wide_tf.study import progress

    results = {r["trial_id"]: r for r in wd.read_results(workdir, whole=True)}
    if seen is not None and log is not None:
        for tid, r in results.items():
            if tid not in seen:
                seen.add(tid)
                log(progress.run_line(r))
    return progress.estimate_progress(config, initial, results)


def _watch(started: Started, config, workdir: str, initial, log, on_complete) -> dict[int, int]:
    """Polls the workers until all have exited, printing a progress line when the count moves
    (at least every PROGRESS_EVERY_S); returns {worker index: exit status} of the failed ones."""
    from wide_tf.study import progress

    procs, paths, signals = started.procs, started.paths, started.signals
    seen: set = set()
    done_before = _progress(config, workdir, initial, seen).done  # runs of an earlier command
    failed: dict[int, int] = {}
    last_line, last_print, last_done = "", 0.0, -1
    ahead = None  # the thread running on_complete

    def start_ahead() -> None:
        nonlocal ahead, on_complete
        if on_complete is not None and not signals.received:
            ahead = threading.Thread(target=on_complete, name="report-ahead", daemon=True)
            ahead.start()
        on_complete = None

    while True:
        running = [p for p in procs if p.poll() is None]
        if any(p.returncode == 0 for p in procs):  # a worker found nothing left to claim
            start_ahead()
        for k, p in enumerate(procs):
            if p.returncode not in (None, 0) and k not in failed:
                failed[k] = p.returncode
                if not signals.received:
                    log(
                        f"worker {k} exited with status {p.returncode}: "
                        f"{_last_line(paths[k]) or _no_output(paths[k])}"
                    )
        now = time.time()
        if now - last_print >= 5.0 or not running:
            p = _progress(config, workdir, initial, seen, log)
            left = progress.time_left(now - started.start, p.done - done_before, p)
            line = f"progress: {p.describe()}, {progress.workers_running(len(running))}" + (
                "" if left is None else f", about {progress.fmt_time(left)} left"
            )
            line += "".join(f"; {note}" for note in _claim_notes(workdir))
            if p.done != last_done or now - last_print >= PROGRESS_EVERY_S or not running:
                if line != last_line:
                    log(line)
                last_line, last_print, last_done = line, now, p.done
            if p.complete:
                start_ahead()
        if not running:
            if ahead is not None:
                ahead.join()
            return failed
        time.sleep(POLL_S)


def _claim_notes(workdir: str) -> list[str]:
    """The claim files a reader should know about (a broken one), for the progress line."""
    from wide_tf.store import claims

    try:
        c = claims.observer(workdir)
        return c.notes(c.current())
    except OSError:
        return []


def _stop_all(started: Started) -> None:
    """SIGTERM to every worker still running, and a wait for each (idempotent)."""
    for p in started.procs:  # the parent failing must not leave workers behind
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    _wait_or_kill(started.procs)
    started.signals.__exit__()


def _wait_or_kill(procs: list[subprocess.Popen], grace_s: float | None = None) -> None:
    """Waits for every worker; one that has not exited STOP_GRACE_S after the SIGTERM (it cannot
    act on it: stopped, stuck in a call that never returns) is killed, and said so on stderr."""
    grace_s = STOP_GRACE_S if grace_s is None else grace_s
    deadline = time.monotonic() + grace_s
    for k, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(
                f"warning: worker {k} (pid {p.pid}) did not stop within {grace_s:g}s of "
                "SIGTERM: killed (SIGKILL); its trial resumes from its last checkpoint on the "
                "next run",
                file=sys.stderr,
                flush=True,
            )
            p.kill()
            p.wait()


def _outcome(started: Started, config, workdir: str, initial, failed, log) -> Outcome:
    """The workers' logs copied (for a gs:// workdir), and how the study ended."""
    from wide_tf.study import progress

    paths, signals = started.paths, started.signals
    if started.remote_logs:
        import tensorflow as tf

        tf.io.gfile.makedirs(os.path.join(workdir, LOGS))
        for path in paths:
            tf.io.gfile.copy(path, os.path.join(workdir, LOGS, os.path.basename(path)), True)
    log(f"Workers done in {progress.fmt_time(time.time() - started.start)}.")
    if signals.received:
        killed = [k for k, p in enumerate(started.procs) if p.returncode not in (0, 143)]
        log(
            f"stopped by {signal.Signals(signals.received).name}; "
            + (
                f"workers {', '.join(map(str, killed))} were killed before they saved (a second "
                "signal, or no exit in time): their trials resume from their last checkpoint"
                if killed
                else "the workers checkpointed"
            )
            + ": run the same command again to resume"
        )
        return Outcome(False, 128 + signals.received)
    p = _progress(config, workdir, initial)
    if failed and p.complete:  # e.g. a killed worker whose group a sibling took over: all done
        k, code = next(iter(failed.items()))
        log(
            f"warning: worker {k} exited with status {code}, but every group is finished (its "
            "work was taken over): the study is complete"
        )
        return Outcome(True)
    if failed:
        k, code = next(iter(failed.items()))
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return Outcome(
            p.complete,
            failure=WorkerFailed(
                f"worker {k} exited with status {code}{more}: "
                f"{_last_line(paths[k]) or _no_output(paths[k])}; see {paths[k]}; finished "
                f"trials are kept{'' if p.complete else ' and the report is not written'}: fix "
                "the cause "
                "and run the same command again to resume"
            ),
        )
    if not p.complete:
        return Outcome(
            False,
            failure=WorkerFailed(
                f"{p.groups_total - p.groups_done} groups are unfinished although every worker "
                "exited; run the same command again to resume"
            ),
        )
    return Outcome(True)


class WorkerFailed(validate.RuntimeProblem):
    """A worker exited non-zero; the message is the one line to show (exit status 1)."""
