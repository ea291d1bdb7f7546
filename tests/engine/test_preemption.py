"""SIGTERM (what a preempted Cloud TPU or spot VM sends) during a study: the run checkpoints the
trial in progress, exits 143, and the same command resumes it; no finished trial is lost or
repeated, and the results equal those of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

from helpers import REPO, comparable, env, run_main, start_main

from wide_tf.engine import preemption

ARGS = [
    "--config=configs/mlp.py:smoke",
    # Long enough trials (the target is out of reach) to be caught in the middle of one.
    "--config.train.max_epochs=20",
    "--config.train.target_value=0.999",
    "--config.train.steps_per_loop=5",
    # No periodic checkpoint: a checkpoint in an unfinished trial can only come from the SIGTERM.
    "--config.train.checkpoint_every_steps=1000000",
    "--no_report",
    # In this process: the log lines checked below are a single process's (SIGTERM through the
    # parent of --workers=N is tests/study/test_workers.py's).
    "--workers=1",
]


def _results(workdir):
    """Every recorded result: results/<trial>.json."""
    return [json.loads(p.read_text()) for p in sorted((workdir / "results").glob("*.json"))]


def _in_progress(workdir):
    trials = workdir / "trials"
    if not trials.exists():
        return []
    return [d for d in trials.iterdir() if d.is_dir() and not (d / "result.json").exists()]


def _sigterm_when(proc, condition, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended before the signal ({proc.returncode}):\n"
                f"{proc.stderr.read()[-3000:]}"
            )
        if condition():
            os.killpg(proc.pid, signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
            return err
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the condition to send SIGTERM never held")


def test_sigterm_checkpoints_exits_143_and_the_rerun_resumes(tmp_path):
    ref = tmp_path / "ref"
    run_main(*ARGS, f"--workdir={ref}")
    work = tmp_path / "work"
    proc = start_main(*ARGS, f"--workdir={work}")
    # Once a trial is recorded and the next one has started.
    err = _sigterm_when(proc, lambda: len(_results(work)) >= 1 and _in_progress(work))
    assert proc.returncode == preemption.EXIT_CODE, err[-3000:]
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    finished = {r["trial_id"] for r in _results(work)}
    assert 1 <= len(finished) < 4
    interrupted = _in_progress(work)
    assert len(interrupted) == 1
    ckpts = list((interrupted[0] / "checkpoints").glob("ckpt-*.index"))
    assert ckpts, "no checkpoint written on SIGTERM"
    stopped_at = int(ckpts[0].name.split("-")[1].split(".")[0])
    assert stopped_at > 0

    rerun = run_main(*ARGS, f"--workdir={work}")
    assert f"[{interrupted[0].name}] resumed from" in rerun.stderr
    assert f"at step {stopped_at}" in rerun.stderr
    records = _results(work)
    ids = [r["trial_id"] for r in records]
    assert len(ids) == len(set(ids)) == 4  # every trial exactly once, the finished ones kept
    assert finished <= set(ids)
    a = {r["trial_id"]: comparable(r) for r in _results(ref)}
    b = {r["trial_id"]: comparable(r) for r in records}
    assert a == b


def test_the_first_sigterm_sets_the_flag_and_a_second_one_kills():
    code = (
        "import os, signal, time\n"
        "from wide_tf.engine import preemption\n"
        "assert preemption.install() and not preemption.requested()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert preemption.requested()\n"
        "print('flag set', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout == "flag set\n", p.stderr
    assert p.returncode == -signal.SIGTERM
