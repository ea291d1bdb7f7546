"""Owns the speed benchmark: the package's training loop against Keras `model.fit`, and the cost of
an exact gradient-diversity measurement relative to one training step.

    python -m wide_tf.tools.bench          # both parts, an aligned table (a few minutes on 2 cores)
    python -m wide_tf.tools.bench --only=loop --json --repeats=7
    python -m wide_tf.tools.bench --only=workers   # one study with --workers=1 and 2 (minutes)

Shared machines are noisy, so every comparison is made inside one run with the contenders
interleaved (loop, fit, loop, fit, ...) and summarised by the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.framework import ops  # noqa: E402  (the eager tensor class, to count reads)

from wide_tf.config import loader as configs_loader
from wide_tf.engine import measure  # noqa: E402
from wide_tf.engine import optim as optim_lib  # noqa: E402
from wide_tf.engine import steps as steps_lib  # noqa: E402
from wide_tf.engine import train as train_lib  # noqa: E402
from wide_tf.engine.models import build_model  # noqa: E402
from wide_tf.engine.steps import BatchPlan, Stepper  # noqa: E402
from wide_tf.engine.strategy import setup_runtime  # noqa: E402
from wide_tf.spec import defaults
from wide_tf.study import scheduler as study_lib  # noqa: E402

# The target for the fast path: one exact measurement costs at most this many train steps.
DIVERSITY_TARGET = 3.0
# Per-example cost of the naive loop is taken from the difference of two runs of these sizes' ratio:
# the fixed cost (tracing its tf.function, which it re-creates on every call) cancels.
_NAIVE_BASE = 4
# A timed sample should last at least this long, so timer and dispatch jitter stay small.
_MIN_SAMPLE_S = 0.2


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmarked model and the batch it is trained with."""

    arch: str
    depth: int
    width: float
    input_shape: tuple
    batch: int  # training batch of the loop-vs-fit comparison
    steps_per_loop: int  # steps per Stepper.train call and fit's steps_per_execution
    norm: str = "none"
    num_classes: int = 10

    @property
    def name(self) -> str:
        if self.arch == "mlp":
            return f"mlp-d{self.depth}-w{int(self.width)}"
        side = "x".join(str(s) for s in self.input_shape)
        return f"wrn-{self.depth}-{self.width:g}@{side}"

    def build(self) -> keras.Model:
        return build_model(
            self.arch, self.depth, self.width, self.num_classes, self.input_shape, norm=self.norm
        )


def default_cases(quick: bool) -> list[Case]:
    if quick:  # seconds, for the test: the code paths, not meaningful numbers
        return [
            Case("mlp", 1, 64, (8, 8, 1), batch=16, steps_per_loop=3),
            Case("wrn", 10, 1, (8, 8, 3), batch=8, steps_per_loop=2, norm="batch"),
        ]
    # WRN-16-2 (CIFAR's weights) on 16x16 inputs: on 32x32 a batch of 128 takes ~0.5 s on 2 idle CPU
    # cores (9 s per 10-step call under load), too slow for a bench of a few minutes.
    return [
        Case("mlp", 2, 1024, (28, 28, 1), batch=128, steps_per_loop=50),
        Case("wrn", 16, 2, (16, 16, 3), batch=128, steps_per_loop=10, norm="batch"),
        # Overhead-bound: a step of this tiny MLP at batch 16 costs less than the host's work
        # around it, so the row compares what the loop does besides computing.
        OVERHEAD_CASE,
    ]


OVERHEAD_CASE = Case("mlp", 1, 32, (8, 8, 1), batch=16, steps_per_loop=20)


def _arrays(case: Case, n: int, seed: int):
    """Synthetic in-memory examples: speed does not depend on the pixel values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n,) + tuple(case.input_shape)).astype(np.float32)
    y = rng.integers(0, case.num_classes, size=n).astype(np.int32)
    return x, y


def _train_dataset(x, y, batch: int) -> tf.data.Dataset:
    # The shape of a real run's stream (wide_tf.engine.data): in memory, repeating, fixed batches,
    # prefetched.
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def _optimizer(batch: int):
    """The package's momentum SGD (constant schedule), as a run builds it; lr small enough to never
    diverge on random labels (a diverged Stepper stops stepping, which would fake its speed)."""
    cfg = defaults.optim_config("momentum", base_lr=0.01)
    cfg.scaling = "none"
    return optim_lib.build_optimizer(cfg, batch, steps_per_epoch=100, total_steps=10**9)


def _median(values):
    return float(statistics.median(values))


# ---- 1. the loop against model.fit --------------------------------------------------------------


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
            # jit_compile=False as the loop on CPU (wide_tf.engine.strategy); 'auto' also resolves
            # to it on CPU.
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


# ---- 2. host work: transfers and traces per loop, a trial's fixed cost ---------------------------


class _Counters:
    """Counts, while active, device-to-host reads (every EagerTensor -> NumPy/Python conversion:
    .numpy(), float(), bool(), np.asarray) and model calls made while tracing a graph (each traced
    function that runs the model calls it at least once, so this counts traces that build a model
    graph: training step, evaluation, probe).

    Not counted: the reads that eager `tf.summary` calls make of their own recording condition, a
    constant on the host (never a transfer from an accelerator)."""

    def __init__(self):
        self._ops = ops
        self.reads = 0
        self.traced_model_calls = 0

    def __enter__(self):
        cls = self._ops._EagerTensorBase
        self._numpy = cls._numpy
        self._call = keras.Model.__call__
        counters, real_numpy, real_call = self, cls._numpy, keras.Model.__call__

        def numpy(tensor):
            counters.reads += 1
            return real_numpy(tensor)

        def call(model, *args, **kwargs):
            if tf.inside_function():
                counters.traced_model_calls += 1
            return real_call(model, *args, **kwargs)

        self._scalar = tf.summary.scalar
        real_scalar = tf.summary.scalar

        def scalar(*args, **kwargs):
            before = counters.reads
            try:
                return real_scalar(*args, **kwargs)
            finally:
                counters.reads = before

        cls._numpy = numpy
        keras.Model.__call__ = call
        tf.summary.scalar = scalar
        return self

    def __exit__(self, *exc):
        self._ops._EagerTensorBase._numpy = self._numpy
        keras.Model.__call__ = self._call
        tf.summary.scalar = self._scalar
        return False


def _tiny_run_config(steps: int, steps_per_loop: int):
    """One run of a tiny MLP on the embedded digits, evaluated at step 0 and at the end only."""
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width = 1, 16
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy = "cpu"
    t = config.train
    t.global_batch, t.max_steps, t.steps_per_loop = 32, steps, steps_per_loop
    t.eval_every_examples = 10**9
    t.checkpoint_every_steps = 10**9
    return config


def bench_transfers(steps_per_loop: int = 5, loops=(4, 12)) -> list[dict]:
    """Device-to-host reads and traces per host loop, from two runs that differ only in their
    number of host loops (set-up, first and last evaluation and the final save cancel)."""
    runtime = setup_runtime(_tiny_run_config(1, 1).runtime)
    counts = []
    for n_loops in loops:
        with tempfile.TemporaryDirectory() as tmp, _Counters() as c:
            train_lib.train_and_evaluate(
                _tiny_run_config(n_loops * steps_per_loop, steps_per_loop), tmp, runtime
            )
        counts.append(c)
        # Both runs start from nothing (a kept model would spare the second run its traces).
        getattr(train_lib, "clear_cache", keras.backend.clear_session)()
        keras.backend.clear_session()
    d_loops = loops[1] - loops[0]
    reads = (counts[1].reads - counts[0].reads) / d_loops
    traces = (counts[1].traced_model_calls - counts[0].traced_model_calls) / d_loops
    return [
        {
            "kind": "count",
            "name": "host_loop/transfers_and_traces",
            "what": (
                f"device-to-host reads and traced model calls per host loop of {steps_per_loop} "
                f"steps (runs of {loops[0]} and {loops[1]} loops, difference)"
            ),
            "reads_per_loop": reads,
            "traces_per_loop": traces,
            "reads": [c.reads for c in counts],
            "traced_model_calls": [c.traced_model_calls for c in counts],
            "target": "reads O(1) per loop, 0 traces per loop",
        }
    ]


def _grid_study_config(quick: bool, steps: int):
    """configs/mlp.py:local cut to one member and one batch size, with its learning-rate grid of 3:
    the trials that should share one traced step."""
    config = configs_loader.load_config(
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "mlp.py"
        )
        + ":local"
    )
    s = config.sweep
    s.family.depths = [2]
    s.batch_sizes = [256]
    s.extend_lr_grid = False
    s.seeds, s.confirm_seeds = [0], []  # the grid of 3 on one seed: 3 trials
    config.train.extra_targets = []
    config.train.max_steps = steps
    config.train.target_value = 1.01  # never stops early: every trial runs the same steps
    config.runtime.strategy = "cpu"
    if quick:
        s.family.budget = 2e4
    return config


def bench_trial_cost(quick: bool, steps: int = 40) -> list[dict]:
    """A trial's fixed cost in a study: its share of the study's wall time minus its training steps
    and evaluations at their steady-state cost, for the trials of one learning-rate grid (same
    member and batch) run by `run_study` in one process, as `python -m wide_tf.main` does. Also
    counts the traced model calls of every trial after the first (target: 0 retraces)."""
    config = _grid_study_config(quick, steps)
    events = []  # (kind, start, seconds, steps)
    real_train, real_eval, real_run = (
        steps_lib.Stepper.train,
        steps_lib.Stepper.evaluate,
        train_lib.train_and_evaluate,
    )

    def timed_train(self, iterator, num_steps):
        start = time.perf_counter()
        out = real_train(self, iterator, num_steps)
        events.append(("train", start, time.perf_counter() - start, out["steps"]))
        return out

    def timed_eval(self, dataset):
        start = time.perf_counter()
        out = real_eval(self, dataset)
        events.append(("eval", start, time.perf_counter() - start, int(out["examples"])))
        return out

    trial_traces = []

    def timed_run(*args, **kwargs):
        events.append(("trial", time.perf_counter(), 0.0, 0))
        before = counters.traced_model_calls
        out = real_run(*args, **kwargs)
        trial_traces.append(counters.traced_model_calls - before)
        return out

    steps_lib.Stepper.train, steps_lib.Stepper.evaluate = timed_train, timed_eval
    train_lib.train_and_evaluate = timed_run
    try:
        with tempfile.TemporaryDirectory() as tmp, _Counters() as counters:
            study_lib.run_study(config, tmp)
            end = time.perf_counter()
    finally:
        steps_lib.Stepper.train, steps_lib.Stepper.evaluate = real_train, real_eval
        train_lib.train_and_evaluate = real_run
    trains = [e for e in events if e[0] == "train" and e[3] > 0]
    evals = [e for e in events if e[0] == "eval"]
    per_step = _median([e[2] / e[3] for e in trains])  # steady: tracing calls are the outliers
    # Per evaluation set (told apart by size): its steady cost.
    per_eval = {n: _median([e[2] for e in evals if e[3] == n]) for n in {e[3] for e in evals}}
    starts = [e[1] for e in events if e[0] == "trial"] + [end]
    fixed = []
    for k in range(len(starts) - 1):
        inside = [
            e for e in events if e[0] in ("train", "eval") and starts[k] <= e[1] < starts[k + 1]
        ]
        steady = sum(
            min(e[2], e[3] * per_step if e[0] == "train" else per_eval[e[3]]) for e in inside
        )
        fixed.append(starts[k + 1] - starts[k] - steady)
    spans = [starts[k + 1] - starts[k] for k in range(len(starts) - 1)]
    later = fixed[1:] or fixed
    return [
        {
            "kind": "cost",
            "name": "trial_fixed_cost/mlp_local_grid",
            "what": (
                f"seconds per trial besides training steps and evaluations (at steady cost), "
                f"{len(fixed)} trials of one learning-rate grid of configs/mlp.py:local "
                f"(depth 2, batch 256, {steps} steps each) in one run_study"
            ),
            "fixed_s_first": fixed[0],
            "fixed_s_later": _median(later),
            "fixed_s": fixed,
            # Whole trials (fixed cost, steps, evaluations), for a comparison that moves nothing
            # between the two: a pause between loops (a checkpoint) lets the input pipeline run
            # ahead.
            "trial_s": spans,
            "trial_s_later": _median(spans[1:] or spans),
            "per_step_s": per_step,
            "per_eval_s": sum(per_eval.values()) / max(len(per_eval), 1),
            "traces_first_trial": trial_traces[0],
            "retraces_later_trials": sum(trial_traces[1:]),
            "target": "fixed_s_later <= 0.5, retraces_later_trials == 0",
        }
    ]


# ---- 3. the cost of a diversity measurement -----------------------------------------------------


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
            measure.per_example_grad_sq_norms_naive(model, x[:k], y[:k])
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
    optimizer = keras.optimizers.SGD(learning_rate=0.0, momentum=0.9)
    optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(measure.per_example_loss(yb, model(xb, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = lambda: float(train_step(xt, yt))  # noqa: E731
    fast = lambda: measure.gradient_stats(model, x, y, chunk_size=chunk_size)  # noqa: E731
    step(), fast()  # tracing
    n_step = _repeat_until(step, _MIN_SAMPLE_S)
    n_fast = _repeat_until(fast, _MIN_SAMPLE_S)
    step_s, fast_s = [], []
    for r in range(repeats):
        pair = [(step_s, step, n_step), (fast_s, fast, n_fast)]
        for out, fn, calls in pair if r % 2 == 0 else pair[::-1]:
            out.append(_per_call(fn, calls))
    per_round = [f / s for f, s in zip(fast_s, step_s)]
    name = f"{case.name}/B{batch}"
    rows = [
        {
            "kind": "ratio",
            "name": f"diversity_fast/{name}",
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
        step_med = _median(step_s)
        rows.append(
            {
                "kind": "ratio",
                "name": f"diversity_naive/{name}",
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
        )
    return rows


# ---- workers: one study in 1 and in 2 processes -------------------------------------------------

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
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "wide_tf.main", f"--config={config_arg}"]
    cmd += [f"--workdir={workdir}", f"--workers={workers}", "--no_report"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=repo, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    names = os.listdir(os.path.join(workdir, "results"))
    return seconds, sorted(n for n in names if n.endswith(".json"))


def bench_workers(quick: bool, repeats: int) -> list[dict]:
    """The same study run with --workers=1 and --workers=2, one after the other in each round (the
    order alternating between rounds, so a drift in the machine's load favours neither); the
    speed-up is the median of the per-round ratios. Needs 2 idle cores to mean anything."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    one, two, same = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "workers_study.py")
        with open(path, "w") as f:
            f.write(_WORKERS_CONFIG.format(mlp=os.path.join(repo, "configs", "mlp.py")))
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


# ---- output -------------------------------------------------------------------------------------


def _environment() -> dict:
    return {
        "kind": "meta",
        "name": "environment",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def format_table(rows: list[dict]) -> str:
    """Aligned, human-readable: speeds first, then ratios."""
    lines = []
    meta = [r for r in rows if r["kind"] == "meta"]
    for m in meta:
        lines.append(
            f"# {m['name']}: "
            + ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("kind", "name"))
        )
    speed = [r for r in rows if r["kind"] == "speed"]
    if speed:
        w = max(len(r["name"]) for r in speed)
        lines.append("")
        lines.append(
            f"{'training speed':<{w}}  {'ex/s (median)':>13}  {'ex/s (best)':>11}  "
            f"{'s/call':>8}  {'batch':>5}  {'steps/call':>10}"
        )
        for r in speed:
            lines.append(
                f"{r['name']:<{w}}  {r['examples_per_s']:>13.0f}  "
                f"{r['examples_per_s_best']:>11.0f}  {r['seconds_median']:>8.3f}  "
                f"{r['batch']:>5d}  {r['steps_per_call']:>10d}"
            )
    for r in rows:
        if r["kind"] == "count":
            lines += [
                "",
                f"{r['name']}: {r['reads_per_loop']:.1f} device-to-host reads and "
                f"{r['traces_per_loop']:.1f} traced model calls per host loop ({r['what']})",
            ]
        elif r["kind"] == "cost":
            lines += [
                "",
                f"{r['name']}: fixed cost {r['fixed_s_later']:.3f} s per trial after the first "
                f"(first {r['fixed_s_first']:.3f} s; all: "
                + ", ".join(f"{v:.3f}" for v in r["fixed_s"])
                + f"); whole trial {r['trial_s_later']:.3f} s after the first"
                + f"; traced model calls {r['traces_first_trial']} in the first trial, "
                f"{r['retraces_later_trials']} in the later ones; steady step "
                f"{r['per_step_s'] * 1e3:.2f} ms, evaluation {r['per_eval_s'] * 1e3:.1f} ms",
            ]
        elif r["kind"] == "speedup":
            lines += [
                "",
                f"{r['name']}: {r['ratio']:.2f}x (rounds {r['ratio_min']:.2f}-"
                f"{r['ratio_max']:.2f}; target >= {r['target']:g}: "
                + ("met" if r["meets_target"] else "MISSED")
                + f"); {r['trials']} trials; 1 worker "
                + ", ".join(f"{v:.1f}" for v in r["one_worker_s"])
                + " s, 2 workers "
                + ", ".join(f"{v:.1f}" for v in r["two_workers_s"])
                + " s"
                + ("" if r["same_trials"] else "; the two runs recorded DIFFERENT trials"),
            ]
    ratios = [r for r in rows if r["kind"] == "ratio"]
    if ratios:
        w = max(len(r["name"]) for r in ratios)
        lines.append("")
        lines.append(
            f"{'ratio':<{w}}  {'median':>8}  {'best/best':>9}  {'range':>11}  {'measure s':>9}  "
            f"{'step s':>8}  note"
        )
        for r in ratios:
            rng = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}" if "ratio_min" in r else ""
            meas = f"{r['measure_s']:.3f}" if "measure_s" in r else ""
            stp = f"{r['step_s']:.4f}" if "step_s" in r else ""
            if "at_least_as_fast" in r:
                note = "loop at least as fast" if r["at_least_as_fast"] else "loop SLOWER"
                if r["ratio_min"] <= 1.0 <= r["ratio_max"]:  # rounds disagree on the winner
                    note += " (within noise)"
            elif "meets_target" in r:
                note = f"target <= {r['target']:g}: " + ("met" if r["meets_target"] else "MISSED")
            elif r.get("scaled"):
                note = f"naive timed on {r['timed_examples']} examples, scaled linearly"
            else:
                note = ""
            best = f"{r['ratio_best']:.3f}" if "ratio_best" in r else ""
            lines.append(
                f"{r['name']:<{w}}  {r['ratio']:>8.3f}  {best:>9}  {rng:>11}  {meas:>9}  "
                f"{stp:>8}  {note}"
            )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m wide_tf.tools.bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--only",
        choices=("loop", "overhead", "diversity", "workers"),
        default=None,
        help="run one part only (default: all but workers, which runs whole studies: minutes)",
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny models and batches (seconds; for tests)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved rounds per comparison (default 5, 2 with --quick)",
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of a table"
    )
    p.add_argument(
        "--batches",
        default=None,
        help="diversity batch sizes, comma-separated (default 256,1024; 16 with --quick)",
    )
    p.add_argument(
        "--chunk_size",
        type=int,
        default=256,
        help="gradient_stats chunk (256 = the probe chunk a run uses)",
    )
    p.add_argument(
        "--naive_subset",
        type=int,
        default=None,
        help="examples the naive loop is timed on before scaling to B (0 = skip the naive "
        "loop; default 64, 8 with --quick)",
    )
    p.add_argument(
        "--models",
        default=None,
        help="loop part: only these model names, comma-separated (e.g. mlp-d1-w32, the "
        "overhead-bound case)",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def run(args) -> list[dict]:
    """All rows of the benchmark that `args` asks for (see parse_args)."""
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    batches = [int(b) for b in (args.batches or ("16" if args.quick else "256,1024")).split(",")]
    naive_subset = args.naive_subset if args.naive_subset is not None else (8 if args.quick else 64)
    cases = default_cases(args.quick)
    if args.models:
        cases = [c for c in cases if c.name in args.models.split(",")]
    rows = [_environment()]
    if args.only in (None, "loop"):
        for case in cases:
            rows += bench_loop(case, repeats, args.seed)
    if args.only in (None, "overhead"):
        rows += bench_transfers()
        rows += bench_trial_cost(args.quick)
    if args.only in (None, "diversity"):
        for case in cases:
            for b in batches:
                rows += bench_diversity(case, b, repeats, args.chunk_size, naive_subset, args.seed)
    if args.only == "workers":
        rows += bench_workers(args.quick, args.repeats or (1 if args.quick else 2))
    end = _environment()
    rows[0]["load_average_1m_end"] = end["load_average_1m"]
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    rows = run(args)
    rows[0]["wall_s"] = round(time.perf_counter() - start, 1)
    if args.json:
        for r in rows:
            print(json.dumps(r), flush=True)
    else:
        print(format_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
