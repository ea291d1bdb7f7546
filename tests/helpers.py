"""Shared by the tests: starting `python -m wide_tf.main` as a separate process, the small MLP run
the engine's tests train in-process, and a record without what may differ between two runs."""

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


def small_mlp(**train):
    """One run (no sweep) of a 2x32 MLP without normalisation on the embedded digits, plain SGD at
    0.1 on one CPU replica; `train` sets train.* fields (global_batch, max_epochs, ...)."""
    from wide_tf.schema import defaults

    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = 2, 32, "none"
    config.optim.name, config.optim.momentum, config.optim.base_lr = "sgd", 0.0, 0.1
    config.runtime.strategy = "cpu"
    for k, v in train.items():
        setattr(config.train, k, v)
    return config


def probed_mlp(**train):
    """small_mlp evaluated every 320 examples against a 0.8 target, with the gradient probe (128
    examples, at initialisation and every 640); `train` sets or overrides train.* fields."""
    probed = dict(
        eval_every_examples=320,
        target_value=0.8,
        gradient_every_examples=640,
        gradient_at_init=True,
        probe_size=128,
    )
    return small_mlp(**{**probed, **train})


def without(obj, keys):
    """`obj` (a result record, nested dicts and lists) with every entry named in `keys` left out."""
    if isinstance(obj, dict):
        return {k: without(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [without(v, keys) for v in obj]
    return obj
