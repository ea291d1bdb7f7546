"""Owns part 3 of the benchmark: the cost of one exact gradient-diversity measurement relative to
one training step, for the fast path and the naive per-example loop."""

from __future__ import annotations

import math
import time

import keras
import tensorflow as tf

from tools.bench.common import Case, _arrays, _median
from wide_tf.engine.loss import per_example_loss
from wide_tf.engine.tf import per_example as per_example_lib

# The target for the fast path: one exact measurement costs at most this many train steps.
DIVERSITY_TARGET = 3.0
# Per-example cost of the naive loop is taken from the difference of two runs of these sizes' ratio:
# the fixed cost (tracing its tf.function, which it re-creates on every call) cancels.
_NAIVE_BASE = 4
# A timed sample should last at least this long, so timer and dispatch jitter stay small.
_MIN_SAMPLE_S = 0.2


def _repeat_until(fn, min_s: float) -> int:
    """How many back-to-back calls make one sample of at least `min_s` (from a first, warm call)."""
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    return max(1, math.ceil(min_s / max(once, 1e-6)))


def _per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _naive_seconds(model, x, y, subset: int, rounds: int) -> dict:
    """Seconds the naive per-example loop would take on all of x, from runs on `subset` examples.

    per_example_grad_sq_norms_naive traces a new tf.function on every call, so a call costs
    fixed + n * per_example; the difference of the best of `rounds` calls on `_NAIVE_BASE` and on
    `subset` examples gives the per-example cost with the tracing removed."""
    n = len(x)
    subset = max(_NAIVE_BASE + 1, min(subset, n))
    small, big = [], []
    for _ in range(rounds):
        for out, k in ((small, _NAIVE_BASE), (big, subset)):
            start = time.perf_counter()
            per_example_lib.per_example_grad_sq_norms_naive(model, x[:k], y[:k])
            out.append(time.perf_counter() - start)
    per_example = (min(big) - min(small)) / (subset - _NAIVE_BASE)
    if (
        per_example <= 0
    ):  # noise swamped the difference: fall back to the (pessimistic) plain average
        per_example = min(big) / subset
    return {
        "seconds": per_example * n,
        "per_example_s": per_example,
        "timed_examples": subset,
        "scaled": subset < n,
    }


def _train_step(model):
    """One training step of `model` on a batch: forward in training mode, backward and an update
    of the run's momentum SGD at lr 0 (the weights stay put)."""
    optimizer = keras.optimizers.SGD(learning_rate=0.0, momentum=0.9)
    optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_example_loss(yb, model(xb, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def _interleaved(step, fast, repeats: int) -> tuple[list, list]:
    """Seconds per call of `step` and of `fast`, one sample of each per round, the order
    alternating between rounds."""
    step(), fast()  # tracing
    n_step = _repeat_until(step, _MIN_SAMPLE_S)
    n_fast = _repeat_until(fast, _MIN_SAMPLE_S)
    step_s, fast_s = [], []
    for r in range(repeats):
        pair = [(step_s, step, n_step), (fast_s, fast, n_fast)]
        for out, fn, calls in pair if r % 2 == 0 else pair[::-1]:
            out.append(_per_call(fn, calls))
    return step_s, fast_s


def _naive_row(case: Case, batch: int, naive: dict, step_s: list) -> dict:
    step_med = _median(step_s)
    return {
        "kind": "ratio",
        "name": f"diversity_naive/{case.name}/B{batch}",
        "model": case.name,
        "batch": batch,
        "what": (
            "per_example_grad_sq_norms_naive seconds / train-step seconds"
            + (
                f"; naive timed on {naive['timed_examples']} examples and scaled linearly"
                if naive["scaled"]
                else ""
            )
        ),
        "ratio": naive["seconds"] / step_med,
        "measure_s": naive["seconds"],
        "step_s": step_med,
        "per_example_s": naive["per_example_s"],
        "timed_examples": naive["timed_examples"],
        "scaled": naive["scaled"],
    }


def bench_diversity(
    case: Case, batch: int, repeats: int, chunk_size: int, naive_subset: int, seed: int = 0
) -> list[dict]:
    """Time of one exact `gradient_stats` on `batch` examples over one training step on them, for
    the fast path and the naive per-example loop.

    The step is forward in training mode, backward and an update of the run's momentum SGD at lr 0;
    step and measurement are interleaved round by round, not timed one after the other."""
    keras.utils.set_random_seed(seed)
    model = case.build()
    x, y = _arrays(case, batch, seed + 1)
    xt, yt = tf.constant(x), tf.constant(y)
    train_step = _train_step(model)
    step = lambda: float(train_step(xt, yt))  # noqa: E731
    fast = lambda: per_example_lib.gradient_stats(model, x, y, chunk_size=chunk_size)  # noqa: E731
    step_s, fast_s = _interleaved(step, fast, repeats)
    per_round = [f / s for f, s in zip(fast_s, step_s)]
    rows = [
        {
            "kind": "ratio",
            "name": f"diversity_fast/{case.name}/B{batch}",
            "model": case.name,
            "batch": batch,
            "chunk_size": min(chunk_size, batch),
            "what": "gradient_stats seconds / train-step seconds (median of per-round ratios)",
            "ratio": _median(per_round),
            "ratio_min": min(per_round),
            "ratio_max": max(per_round),
            "ratio_best": min(fast_s) / min(step_s),
            "measure_s": _median(fast_s),
            "step_s": _median(step_s),
            "measure_s_all": fast_s,
            "step_s_all": step_s,
            "target": DIVERSITY_TARGET,
            "meets_target": _median(per_round) <= DIVERSITY_TARGET,
        }
    ]
    if naive_subset > 0:
        naive = _naive_seconds(model, x, y, naive_subset, rounds=min(repeats, 3))
        rows.append(_naive_row(case, batch, naive, step_s))
    return rows
