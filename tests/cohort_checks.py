"""The cohort checks, run by tests/engine/test_cohort.py in one child process with
KERAS_BACKEND=jax (a process runs one Keras backend; the JAX import and the compilations are paid
once for every check): runs trained in a cohort against the same runs trained alone. Prints one
JSON object."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tests.helpers import small_mlp, without

OUT = ""  # the folder the checks write into: the command line's argument
# What may differ between two trainings of one run: the clocks and what is read off them.
TIMINGS = ("wall_time_s", "examples_per_s", "time_s", "provenance", "train_time_s")
WEIGHTS: dict = {}  # phase -> run name -> its final trainable weights (Trainer.finish)
PHASE = [""]


def _capture() -> None:
    """Each run's final trainable weights, as its Trainer finishes (alone or in a cohort)."""
    import jax

    from wide_tf.engine.jax import run as jax_run

    original = jax_run.Trainer.finish

    def finish(self):
        got = jax.device_get(self.holder.state["trainable"])
        WEIGHTS.setdefault(PHASE[0], {})[self.plan.name] = [np.asarray(x) for x in got]
        original(self)

    jax_run.Trainer.finish = finish


def mlp(lr: float, seed: int, **train):
    settings = dict(global_batch=32, max_epochs=1.0, eval_every_examples=320, eval_batch=256)
    config = small_mlp(**dict(settings, **train))
    config.runtime.backend = "jax"
    config.optim.base_lr, config.train.seed = lr, seed
    return config


def wrn(lr: float, seed: int):
    """A WRN-10-1 with ghost batch norm (virtual batches of 8), LARS with momentum and weight
    decay, and 2 micro-batches per update on each replica (batch 32)."""
    import jax

    config = mlp(lr, seed, max_epochs=0.0, max_steps=8, eval_every_examples=128)
    config.train.eval_train_limit = 256
    config.model.arch, config.model.depth, config.model.width = "wrn", 10, 1
    config.model.norm, config.model.ghost_batch_size = "ghost", 8
    config.optim.name, config.optim.momentum, config.optim.weight_decay = "lars", 0.9, 5e-4
    config.train.max_device_batch = 16 // len(jax.local_devices())
    return config


def _alone(name: str, configs: list) -> list[dict]:
    from wide_tf.engine import train

    PHASE[0] = name
    return [
        train.train_and_evaluate(c, os.path.join(OUT, name, str(i)), trial={"trial_id": f"r{i}"})
        for i, c in enumerate(configs)
    ]


def _cohort(name: str, configs: list) -> list[dict]:
    """The runs through the cohort: the engine's entry point, or for one run (which the entry
    point trains alone) the lockstep itself around a cohort of one."""
    from wide_tf.engine import cohort, train
    from wide_tf.engine.jax import cohort as jax_cohort

    PHASE[0] = name
    workdirs = [os.path.join(OUT, name, str(i)) for i in range(len(configs))]
    trials = [{"trial_id": f"r{i}"} for i in range(len(configs))]
    if len(configs) > 1:
        return train.train_and_evaluate_cohort(configs, workdirs, trials=trials)
    runtime = train.runtime_for(configs[0])
    controller, run = train.setup(configs[0], workdirs[0], runtime, trials[0])
    return cohort.run([controller], [run.trainer], jax_cohort.make([run.trainer]))


def _compare(alone: list[dict], together: list[dict], a: str, b: str) -> dict:
    """Per run: the records without their timings equal, and the final weights' largest
    relative difference."""
    out = {"same_records": [], "fields": [], "weights_rel": [], "statuses": [], "steps": []}
    for i, (x, y) in enumerate(zip(alone, together)):
        same = without(x, TIMINGS) == without(y, TIMINGS)
        out["same_records"].append(same)
        keys = ("status", "steps", "steps_to_target", "steps_to_target_interp", "targets")
        out["fields"].append(all(x[k] == y[k] for k in keys))
        out["statuses"].append(x["status"])
        out["steps"].append(x["steps"])
        wa, wb = WEIGHTS[a][f"r{i}"], WEIGHTS[b][f"r{i}"]
        # Each tensor's largest difference on its own scale (its largest entry): entries near
        # zero would make an entry-wise ratio meaningless; a diverged run's non-finite weights
        # must be the same non-finite weights.
        rel = max(
            float(np.max(np.abs(p - q)) / max(float(np.max(np.abs(q))), 1e-12))
            if np.all(np.isfinite(q))
            else float(not np.array_equal(p, q, equal_nan=True))
            for p, q in zip(wa, wb)
        )
        out["weights_rel"].append(rel)
    return out


def _mlp_configs() -> list:
    return [mlp(0.05 * (1 + i % 4), seed=i) for i in range(8)]


def mlp_sizes(found):
    """K = 1, 3 and 8 runs of an MLP (rates and seeds apart) against the same runs alone."""
    configs = _mlp_configs()
    alone = _alone("mlp_alone", configs)
    for k in (1, 3, 8):
        together = _cohort(f"mlp_cohort{k}", configs[:k])
        found[f"mlp_k{k}"] = _compare(alone[:k], together, "mlp_alone", f"mlp_cohort{k}")
    found["alone"] = alone


def endings(found):
    """Runs that end at different steps: the target met early (stop_at_target), late, never
    within the budget, and a run that diverges (learning rate 50)."""
    ends = dict(stop_at_target=True, target_value=0.85, max_epochs=1.5)
    configs = [mlp(0.3, 0, **ends), mlp(0.1, 1, **ends), mlp(0.01, 2, **ends), mlp(50.0, 3, **ends)]
    alone = _alone("end_alone", configs)
    found["endings"] = _compare(alone, _cohort("end_cohort", configs), "end_alone", "end_cohort")


def device_loop(found):
    """The device loop (GPU and TPU's path: every step of a call in one program), forced on a
    CPU, for the first three runs of `mlp_sizes` (which runs before: their records alone)."""
    from wide_tf.engine.jax import run as jax_run

    configs = _mlp_configs()[:3]
    (build,) = jax_run._BUILT.values()
    build.stepper.host_loop = False
    try:
        together = _cohort("loop_cohort", configs)
    finally:
        build.stepper.host_loop = True
    found["device_loop"] = _compare(found["alone"][:3], together, "mlp_alone", "loop_cohort")


def wrn_lars_micro(found):
    """K = 3 WRNs with ghost batch norm, LARS and micro-batches against the same runs alone (on
    as many replicas as the process has devices)."""
    # Seeds 0, 1 and 3: on two replicas seed 2's run grows the first steps' rounding difference
    # (1e-6 of the weights) to 2e-3 by step 8, alone against a cohort, in the cohort's first slot
    # as in its last and at rates 0.75 and 1.5 (measured step by step): its data's doing (a
    # virtual batch of 8 is its micro-batch there), which a tolerance cannot tell from a fault.
    configs = [wrn(0.5 * (1 + i), seed=(0, 1, 3)[i]) for i in range(3)]
    alone = _alone("wrn_alone", configs)
    found["wrn"] = _compare(alone, _cohort("wrn_cohort", configs), "wrn_alone", "wrn_cohort")
    found["wrn"]["micro_batches"] = alone[0]["batch_plan"]["micro_batches"]
    found["wrn"]["replicas"] = alone[0]["batch_plan"]["replicas"]


def preempted(found):
    """A cohort stopped by a preemption after its third shared call (every run checkpoints at
    that call and stops), then resumed: the uninterrupted cohort's records."""
    from wide_tf.engine import preemption
    from wide_tf.engine.jax import cohort as jax_cohort

    configs = [mlp(0.05 * (1 + i), seed=20 + i, checkpoint_every_steps=5) for i in range(3)]
    configs[2].train.max_epochs = 0.75  # ends before the others: the cohort compacts
    full = _cohort("full", configs)
    original, calls = jax_cohort.Cohort.train, [0]

    def train(self, requests):
        calls[0] += 1
        if calls[0] == 3:
            preemption.request("the cohort check")
        return original(self, requests)

    jax_cohort.Cohort.train = train
    try:
        _cohort("cut", configs)
        found["preempted_at"] = None
    except preemption.Preempted as e:
        found["preempted_at"] = e.step
    finally:
        jax_cohort.Cohort.train = original
        preemption._requested.clear()
    found["checkpoints_after_cut"] = [
        sorted(os.listdir(os.path.join(OUT, "cut", str(i), "checkpoints"))) for i in range(3)
    ]
    resumed = _cohort("cut", configs)
    found["resume"] = _compare(full, resumed, "full", "cut")


if __name__ == "__main__":
    OUT = sys.argv[1]
    only = sys.argv[2:] or ["mlp_sizes", "device_loop", "endings", "wrn_lars_micro", "preempted"]
    _capture()
    found: dict = {}
    for name in only:
        globals()[name](found)
    found.pop("alone", None)
    print("JSON " + json.dumps(found, default=str))
