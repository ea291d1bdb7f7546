"""Shared by the tests that start `python -m wide_tf.main` as a separate process."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Results that must agree between two runs of the same trial; the rest (wall time, speed) may not.
COMPARED = (
    "trial_id",
    "status",
    "steps_to_target",
    "epochs_to_target",
    "steps",
    "params",
    "batch_size",
    "learning_rate",
)


def main_command(*args):
    return [sys.executable, "-m", "wide_tf.main", *args]


def env():
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    e["CUDA_VISIBLE_DEVICES"] = ""
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def run_main(*args, timeout=300, check=True):
    proc = subprocess.run(
        main_command(*args), cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"main failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def start_main(*args):
    return subprocess.Popen(
        main_command(*args),
        cwd=REPO,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_when(proc, condition, timeout=240):
    """SIGKILLs `proc` as soon as `condition()` holds; returns True if it was killed mid-way."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            if proc.returncode != 0:
                raise AssertionError(
                    f"the run failed ({proc.returncode}):\n{proc.stderr.read()[-3000:]}"
                )
            return False
        if condition():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the condition to kill the run never held")


def comparable(result):
    out = {k: result.get(k) for k in COMPARED}
    out["final"] = {k: (None if v is None else round(v, 4)) for k, v in result["final"].items()}
    return out


def add_second_target(records, metric: str, value: float, factor: float) -> None:
    """Gives each record a `targets` list as train.py writes it: the record's own target
    (train_accuracy >= 0.99) first, then `metric` at `value`, crossed after `factor` times the
    first target's steps (same status)."""
    for r in records:
        s = r["steps_to_target"]
        r["targets"] = [
            {
                "metric": "train_accuracy",
                "value": 0.99,
                "status": r["status"],
                "steps_to_target": s,
                "steps_to_target_interp": None,
            },
            {
                "metric": metric,
                "value": value,
                "status": r["status"],
                "steps_to_target": None if s is None else factor * s,
                "steps_to_target_interp": None,
            },
        ]
