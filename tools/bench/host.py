"""Owns part 2 of the benchmark, the host's work: device-to-host transfers and traces per host loop,
and a trial's fixed cost in a study (timed through the engine's timing hook, engine/timing.py)."""

from __future__ import annotations

import os
import tempfile
import time

import keras
import tensorflow as tf
from tensorflow.python.framework import ops  # the eager tensor class, to count reads

from tools.bench.common import REPO, _median
from wide_tf.checks import loader
from wide_tf.engine import timing
from wide_tf.engine import train as train_lib
from wide_tf.engine.tf.strategy import setup_runtime
from wide_tf.schema import defaults
from wide_tf.study import scheduler


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
    config = loader.load_config(os.path.join(REPO, "configs", "mlp.py") + ":local")
    s = config.sweep
    s.family.depths = [2]
    s.batch_sizes = [256]
    s.extend_lr_grid = False
    s.seeds, s.confirm_seeds = [0], []  # the grid of 3 on one seed: 3 trials
    config.train.extra_targets = []
    config.train.max_steps = steps
    config.train.min_steps = steps  # the floor is for epoch budgets; this one is in steps
    # Never stops early, so every trial runs the same steps: a training loss of 1e-12 is out of
    # reach in these few steps (an accuracy above 1, which did the same, is now refused).
    config.train.target_metric = "train_loss"
    config.train.target_value = 1e-12
    config.runtime.strategy = "cpu"
    if quick:
        s.family.budget = 2e4
    return config


def _study_events(config) -> tuple[list, list]:
    """Runs the study `config` in one process, as `python -m wide_tf.main` does, listening to the
    engine's timing hook: its events (kind, start, seconds, count), ending with ("end", ...), and
    the traced model calls of each trial."""
    events, trial_traces, started = [], [], []

    def listen(kind, start, seconds, count):
        if kind == "trial":
            events.append(("trial", start, 0.0, 0))
            started.append(counters.traced_model_calls)
        elif kind == "trial_end":
            trial_traces.append(counters.traced_model_calls - started.pop())
        elif kind in ("train", "eval"):
            events.append((kind, start, seconds, count))

    with (
        tempfile.TemporaryDirectory() as tmp,
        _Counters() as counters,
        timing.listening(listen),
    ):
        scheduler.run_study(config, tmp)
        events.append(("end", time.perf_counter(), 0.0, 0))
    return events, trial_traces


def _fixed_costs(events: list) -> tuple[list, list, float, dict]:
    """Each trial's fixed cost (its span minus its training calls and evaluations at their steady
    cost), its span, the steady seconds per step and per evaluation set (told apart by size)."""
    trains = [e for e in events if e[0] == "train" and e[3] > 0]
    evals = [e for e in events if e[0] == "eval"]
    per_step = _median([e[2] / e[3] for e in trains])  # steady: tracing calls are the outliers
    per_eval = {n: _median([e[2] for e in evals if e[3] == n]) for n in {e[3] for e in evals}}
    starts = [e[1] for e in events if e[0] in ("trial", "end")]
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
    return fixed, spans, per_step, per_eval


def bench_trial_cost(quick: bool, steps: int = 40) -> list[dict]:
    """A trial's fixed cost in a study: its share of the study's wall time minus its training steps
    and evaluations at their steady-state cost, for the trials of one learning-rate grid (same
    member and batch) run by `run_study` in one process, as `python -m wide_tf.main` does. Also
    counts the traced model calls of every trial after the first (target: 0 retraces)."""
    events, trial_traces = _study_events(_grid_study_config(quick, steps))
    fixed, spans, per_step, per_eval = _fixed_costs(events)
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
