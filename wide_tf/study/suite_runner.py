"""Owns a suite: several studies of one question run one after another into one workdir, each a
whole study of its own (its config, its workers, its report, resumable), so that one command gives
the protocol x family x target table of report/answer.py.

    python -m wide_tf.main --suite=configs/answer.py --workdir=runs/answer

A suite file defines `get_suite(arg)` returning a list of `Entry`s. Each study runs as
`python -m wide_tf.main --config=<entry.config> --workdir=WORKDIR/<entry.name>` in a child process
(with WIDE_TF_PARENT_PID set, so that it dies with the suite: main runs study/worker.py's
die_with_parent first): the same command a user would type, so a study of a suite and a study
run alone are the same thing (the same records, resumed the same way); a suite stopped part-way
and started again skips nothing it has not done and redoes nothing it has (each study resumes
from its own workdir). The wall time of each study's last invocation is kept in
WORKDIR/suite.json beside the entries.

No TensorFlow: the parent only checks the entries' configs, starts the studies and waits.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from wide_tf.checks import loader, validate
from wide_tf.schema import provenance
from wide_tf.schema.problems import UsageError
from wide_tf.store import workdir as wd
from wide_tf.store.suite_dir import (  # noqa: F401 (Entry and the record: a suite file imports them here)
    SUITE_FILE,
    Entry,
    read_record,
    study_dir,
    write_record,
)
from wide_tf.study import worker

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def load(spec: str) -> list[Entry]:
    """`path[:variant]` of a suite file -> its entries, every config loaded and checked (one
    UsageError line otherwise)."""
    path, arg = loader.resolve_path(spec)
    module = loader.load_module(path, "get_suite", "suite")
    try:
        entries = list(module.get_suite(arg))
    except ValueError as e:
        raise UsageError(f"--suite={spec}: {e}") from None
    if not entries or not all(isinstance(e, Entry) for e in entries):
        raise UsageError(f"--suite={spec}: get_suite must return a non-empty list of suite.Entry")
    names = [e.name for e in entries]
    for e in entries:
        if not _NAME.match(e.name):
            raise UsageError(
                f"--suite={spec}: study name {e.name!r} is not a folder name (a-z, 0-9, _)"
            )
        cfg = loader.load_config(e.config)
        validate.check_config(cfg, [])
    if len(set(names)) != len(names):
        raise UsageError(f"--suite={spec}: two studies share a name ({', '.join(names)})")
    for e in entries:
        if e.replicate_of and e.replicate_of not in names[: names.index(e.name)]:
            raise UsageError(
                f"--suite={spec}: {e.name} replicates {e.replicate_of!r}, which is not a study "
                "listed before it; name an earlier study of the suite"
            )
    return entries


def _command(entry: Entry, workdir: str, workers: str | None) -> list[str]:
    # wide_tf.main with worker.PARENT_ENV (_run_study): the study dies with the suite, as the
    # workers of --workers=N with their parent (even a suite killed by SIGKILL leaves no study
    # computing unsupervised).
    cmd = [sys.executable, "-m", "wide_tf.main", f"--config={entry.config}"]
    cmd.append(f"--workdir={study_dir(workdir, entry)}")
    return cmd + ([f"--workers={workers}"] if workers else [])


def _run_study(entry: Entry, workdir: str, workers: str | None) -> int:
    """One study in a child process; its exit status. SIGTERM (a preemption, a scheduler's stop)
    goes on to the study, which checkpoints and exits 143 (Ctrl-C reaches it already: it is in
    the terminal's process group)."""
    env = {**os.environ, **provenance.child_env(), worker.PARENT_ENV: str(os.getpid())}
    proc = subprocess.Popen(_command(entry, workdir, workers), env=env)
    before = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        return proc.wait()
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, before)


def run(spec: str, workdir: str, workers: str | None, log) -> int:
    """Runs every study of the suite in turn (each resumes where it stopped); returns the first
    non-zero exit status of a study (the suite stops there), else 0."""
    entries = load(spec)
    wd.makedirs(workdir)
    old = read_record(workdir)
    if old and old.get("suite") not in (None, spec):
        raise UsageError(
            f"--workdir={workdir} holds the suite {old['suite']!r}, not {spec!r}; give the suite "
            "its own workdir"
        )
    wall = dict(old.get("wall_s", {}))
    write_record(workdir, spec, entries, wall)
    for k, e in enumerate(entries, 1):
        log(f"suite: study {k}/{len(entries)} {e.name} ({e.config}) -> {study_dir(workdir, e)}")
        t0 = time.monotonic()
        code = _run_study(e, workdir, workers)
        wall[e.name] = round(time.monotonic() - t0, 1)
        write_record(workdir, spec, entries, wall)
        if code != 0:
            log(f"suite: study {e.name} exited with status {code}; the suite stops (run it again)")
            return code
        log(f"suite: study {e.name} done in {wall[e.name]:.0f} s")
    return 0


def command(spec: str, given: dict, log) -> int:
    """`--suite`: refuses the flags of a single study (`given`: main's flags by name), lists the
    studies under --dry_run, else runs them (`run`); returns the exit status."""
    others = [f"--{k}" for k in ("config", "shard", "trial", "list_trials") if given.get(k)]
    if others:
        raise UsageError(f"--suite runs its studies' own configs; drop {', '.join(others)}")
    if given.get("dry_run"):
        entries = load(spec)
        width = max([18] + [len(e.name) for e in entries])  # the columns stay aligned
        for e in entries:
            print(f"{e.name:{width}s} {e.protocol:14s} {e.family:8s} {e.config}")
        return 0
    if not given.get("workdir"):
        raise UsageError("--workdir is required (the suite's folder, one per study)")
    return run(spec, given["workdir"], given.get("workers"), log)
