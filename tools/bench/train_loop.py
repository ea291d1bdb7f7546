"""Owns part 1 of the benchmark: the package's training loop (Stepper.train) against Keras
`model.fit` on the same model, optimizer, batch and data stream, interleaved round by round."""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from tools.bench.common import Case, _arrays, _median, _optimizer, _train_dataset
from wide_tf.engine.tf.step import BatchPlan, Stepper


class _FitTimer(keras.callbacks.Callback):
    """Times the executions of one fit call: from the first batch's start to the last batch's end.

    Iterator creation and fit's per-call set-up fall outside (in fit's favour). Reading the loss
    at each batch end waits for the step to finish, as Stepper.train waits for its scalars."""

    def on_train_begin(self, logs=None):
        self.start = None
        self.end = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:
            float(keras.ops.convert_to_numpy(logs["loss"]))
        self.end = time.perf_counter()


class _LoopContender:
    """This package's loop: Stepper.train over a one-device strategy and a distributed dataset."""

    def __init__(self, case: Case, x, y, strategy, seed: int):
        self.case = case
        self.name = "loop"
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            self.model = case.build()
            optimizer = _optimizer(case.batch)
            optimizer.build(self.model.trainable_variables)
            self.stepper = Stepper(
                self.model,
                optimizer,
                strategy,
                BatchPlan.make(case.batch, strategy.num_replicas_in_sync),
            )
        ds = _train_dataset(x, y, case.batch)
        self.iterator = iter(strategy.distribute_datasets_from_function(lambda ctx: ds))

    def run(self) -> float:
        """Seconds for one call of steps_per_loop steps."""
        n = self.case.steps_per_loop
        start = time.perf_counter()
        scalars = self.stepper.train(self.iterator, n)
        seconds = time.perf_counter() - start
        if scalars["steps"] != n:
            raise RuntimeError(f"the loop ran {scalars['steps']:g} of {n} steps (diverged?)")
        return seconds


class _FitContender:
    """Keras model.fit on the same model, optimizer, loss, batch and data stream."""

    def __init__(self, case: Case, x, y, strategy, seed: int, steps_per_execution: int):
        self.case = case
        self.name = f"fit_spe{steps_per_execution}"
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            self.model = case.build()
            # jit_compile=False as the loop on CPU (wide_tf.engine.tf.strategy); 'auto' also
            # resolves to it on CPU.
            self.model.compile(
                optimizer=_optimizer(case.batch),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=steps_per_execution,
                jit_compile=False,
            )
        self.dataset = _train_dataset(x, y, case.batch)
        self.timer = _FitTimer()

    def run(self) -> float:
        """Seconds for steps_per_loop steps (one fit call, one epoch)."""
        self.model.fit(
            self.dataset,
            epochs=1,
            steps_per_epoch=self.case.steps_per_loop,
            verbose=0,
            shuffle=False,
            callbacks=[self.timer],
        )
        return self.timer.end - self.timer.start


def bench_loop(case: Case, repeats: int, seed: int = 0, strategy=None) -> list[dict]:
    """Examples/s of the loop and of model.fit (steps_per_execution = the loop's steps per call, and
    Keras' default of 1), interleaved round by round after one untimed warm-up call each."""
    strategy = strategy or tf.distribute.OneDeviceStrategy("/cpu:0")
    x, y = _arrays(case, max(4 * case.batch, 512), seed)
    contenders = [
        _LoopContender(case, x, y, strategy, seed),
        _FitContender(case, x, y, strategy, seed, case.steps_per_loop),
        _FitContender(case, x, y, strategy, seed, 1),
    ]
    for c in contenders:
        c.run()  # tracing, first-call allocations and filling the prefetch buffer are not timed
    times = {c.name: [] for c in contenders}
    for r in range(repeats):
        # Rotate the order so no contender always runs right after the same neighbour.
        for c in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:
            times[c.name].append(c.run())
    examples = case.batch * case.steps_per_loop
    rows = []
    for c in contenders:
        t = times[c.name]
        rows.append(
            {
                "kind": "speed",
                "name": f"{c.name}/{case.name}",
                "model": case.name,
                "contender": c.name,
                "batch": case.batch,
                "steps_per_call": case.steps_per_loop,
                "examples_per_s": examples / _median(t),
                "examples_per_s_best": examples / min(t),
                "seconds_median": _median(t),
                "seconds": t,
                "params": int(sum(np.prod(v.shape) for v in c.model.trainable_variables)),
            }
        )
    loop_t = times["loop"]
    for c in contenders[1:]:
        per_round = [ft / lt for lt, ft in zip(loop_t, times[c.name])]
        rows.append(
            {
                "kind": "ratio",
                "name": f"loop_over_{c.name}/{case.name}",
                "model": case.name,
                "what": (
                    f"loop examples/s divided by {c.name} examples/s (median of {repeats} rounds)"
                ),
                "ratio": _median(per_round),
                "ratio_min": min(per_round),
                "ratio_max": max(per_round),
                # Best against best: under load from other processes the fastest call is the one
                # least disturbed, so this is the second, steadier estimate of the same ratio.
                "ratio_best": min(times[c.name]) / min(loop_t),
                "loop_seconds": loop_t,
                "other_seconds": times[c.name],
                "at_least_as_fast": _median(per_round) >= 1.0,
            }
        )
    return rows
