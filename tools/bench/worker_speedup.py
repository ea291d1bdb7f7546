"""Owns the workers part of the benchmark: one study run with --workers=1 and with --workers=2."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from tools.bench.common import REPO, _median

# The study of the workers part: configs/mlp.py's MLP family on the 8x8 digits, cut to a size
# whose training (not TensorFlow's start-up) dominates: 4 members x 4 batch sizes = 16 groups of 4
# trials (3 learning rates, 1 confirmation seed). Every field that sets its cost is set here, so a
# change of the config file's variants does not change this benchmark. Written to a temporary
# config file: lists cannot be overridden on the command line.
_WORKERS_CONFIG = """
import importlib.util

_spec = importlib.util.spec_from_file_location("_mlp", {mlp!r})
_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mlp)


def get_config(arg=None):
    config = _mlp.get_config("smoke")
    if arg == "quick":
        return config
    s = config.sweep
    s.family.budget = 5.0e4
    s.family.depths = [1, 2, 4, 8]
    s.batch_sizes = [32, 64, 128, 256]
    s.lr_multipliers = [0.7071, 1.0, 1.4142]
    s.extend_lr_grid = False
    s.confirm_seeds = [1]
    config.train.max_epochs = 6.0
    config.train.target_value = 0.9
    config.train.eval_every_examples = 720
    config.train.steps_per_loop = 20
    return config
"""


def _time_study(config_arg: str, workers: int, workdir: str) -> tuple[float, list[str]]:
    """Wall seconds of `python -m wide_tf.main` on a fresh workdir, as a user times it (TensorFlow's
    start-up included), and the trial ids it recorded."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "wide_tf.main", f"--config={config_arg}"]
    cmd += [f"--workdir={workdir}", f"--workers={workers}", "--no_report"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    names = os.listdir(os.path.join(workdir, "results"))
    return seconds, sorted(n for n in names if n.endswith(".json"))


def bench_workers(quick: bool, repeats: int) -> list[dict]:
    """The same study run with --workers=1 and --workers=2, one after the other in each round (the
    order alternating between rounds, so a drift in the machine's load favours neither); the
    speed-up is the median of the per-round ratios. Needs 2 idle cores to mean anything."""
    one, two, same = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "workers_study.py")
        with open(path, "w") as f:
            f.write(_WORKERS_CONFIG.format(mlp=os.path.join(REPO, "configs", "mlp.py")))
        arg = f"{path}:{'quick' if quick else 'bench'}"
        for k in range(repeats):
            order = (1, 2) if k % 2 == 0 else (2, 1)
            got = {}
            for n in order:
                got[n] = _time_study(arg, n, os.path.join(tmp, f"w{n}_r{k}"))
            one.append(got[1][0])
            two.append(got[2][0])
            same = same and got[1][1] == got[2][1]
            trials = len(got[1][1])
    per_round = [a / b for a, b in zip(one, two)]
    return [
        {
            "kind": "speedup",
            "name": "workers_2_over_1",
            "what": "wall time of one study (python -m wide_tf.main, TensorFlow start-up "
            "included) with --workers=1 over --workers=2",
            "trials": trials,
            "one_worker_s": one,
            "two_workers_s": two,
            "ratio": _median(per_round),
            "ratio_min": min(per_round),
            "ratio_max": max(per_round),
            "same_trials": same,
            "target": 1.7,
            "meets_target": _median(per_round) >= 1.7,
        }
    ]
