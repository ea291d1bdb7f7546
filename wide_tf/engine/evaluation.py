"""Owns the evaluation economy: which passes an evaluation step of a run needs, the pass over the
training set that stops once no unreached target can be met at this step, and the snapshot of the
weights at the last step whose pass stopped early, so that a crossing right after it is
interpolated against that step's whole-set value, exactly as when every pass is whole.

Why the records stay identical (docs/evaluation.md): a target is first met at the first
evaluation step whose whole-set value meets it, interpolated with the evaluation step before it
(engine/targets.py). A pass stops early only when the examples still to come cannot lift the value
to any unreached target: an accuracy can gain at most one hit per remaining example, a mean loss
can only grow (every example's loss is >= 0, and the host sums in the same order either way). So a
stopped pass is never a crossing, every crossing is found at the same step with the same value,
and the step before it is either a whole pass or the snapshot's. The test set is not a target here
(the economy is off when one is): it is evaluated for the curves, every curve_every_examples, and
at the end. Nothing here reads the device per training step; a pass reads once per chunk."""

from __future__ import annotations

import bisect
import contextlib
import math

import numpy as np
import tensorflow as tf

from wide_tf.engine import timing
from wide_tf.spec import plan as plan_lib
from wide_tf.spec import targets as targets_lib

# Metrics of the training set that a bounded pass can rule out (their best reachable value).
_TRAIN_METRICS = ("train_accuracy", "train_loss")


class Snapshot:
    """A copy of the model's weights (all of them, batch-norm statistics too) on its devices,
    saved in the run's checkpoints so that a resumed run keeps it; `applied()` evaluates it."""

    def __init__(self, model, strategy):
        self.model = model
        with strategy.scope():
            self.saved = _copies(model, "eval_snapshot")
            self.held = _copies(model, "eval_held")
        self._take = _copier(model.weights, self.saved)
        self._hold = _copier(model.weights, self.held)
        self._put = _copier(self.saved, model.weights)
        self._back = _copier(self.held, model.weights)

    def take(self) -> None:
        self._take()

    @contextlib.contextmanager
    def applied(self):
        """The model holds the snapshot's weights inside the block, its own after it."""
        self._hold()
        self._put()
        try:
            yield
        finally:
            self._back()


def _copies(model, name: str) -> list:
    return [tf.Variable(w, trainable=False, name=name) for w in model.weights]


def _copier(sources, targets):
    @tf.function(autograph=False)
    def copy():
        timing.note_trace()
        for s, t in zip(sources, targets):
            t.assign(s)

    return copy


def bound(unreached, n: int) -> tuple[float, float]:
    """The bound of a pass over the `n` examples of the training set (engine/steps.go_on) that
    goes on while one of `unreached` ((metric, value) pairs) can still be met: [the fewest hits
    whose accuracy meets an accuracy target, the largest float32 loss sum whose mean meets a loss
    target]; the values are those the trainer computes (hits / n, float(loss sum) / n)."""
    min_hits, max_loss = math.inf, -math.inf
    for metric, value in unreached:
        if metric == "train_accuracy":
            h = max(0, math.ceil(value * n) - 1)
            while h <= n and not targets_lib.met(metric, value, h / n):
                h += 1
            min_hits = min(min_hits, h if h <= n else math.inf)
        elif metric == "train_loss":
            max_loss = max(max_loss, _largest_loss_sum(value, n))
    return float(min_hits), float(max_loss)


def _largest_loss_sum(target: float, n: int) -> float:
    """The largest float32 x with float(x) / n <= target (a loss sum above it cannot meet it)."""
    x = np.float32(target * n)
    while float(x) / n > target:
        x = np.nextafter(x, np.float32(-np.inf))
    while float(np.nextafter(x, np.float32(np.inf))) / n <= target:
        x = np.nextafter(x, np.float32(np.inf))
    return float(x)


class Economy:
    """The evaluation steps of one run (engine/train.Run): whole passes at step 0, on the curve
    cadence and without the economy; else a bounded pass over the training set alone."""

    def __init__(self, run):
        t = run.config.train
        self.run = run
        metrics = [run.targets.primary[0]] + [m for m, _ in run.targets.extra]
        self.on = bool(t.eval_economy) and all(m in _TRAIN_METRICS for m in metrics)
        every = plan_lib.curve_every(run.eval_every, t.curve_every_examples)
        self.curve_steps = set(plan_lib.eval_steps(run.batch, every, run.total_steps))
        self.cadence = sorted(run.eval_steps)  # for the evaluation step before a given one
        self.snapshot = run.built.snapshot

    def evaluate(self, train_scalars: dict | None = None) -> dict | None:
        """The evaluation at the current step (its targets checked); None: the pass stopped
        early (no target can be met here) and the weights went into the snapshot."""
        run, st = self.run, self.run.state
        if not self.on or st.step == 0 or st.step in self.curve_steps:
            ev = run.evaluate(train_scalars, sets=("train", "test"))
        else:
            limit = bound(run.targets.unreached(st), run.built.eval_sets["train"].num_examples)
            ev = run.evaluate(train_scalars, sets=("train",), bound=limit)
            if ev is None:
                with timing.timed("eval", st.time_s):
                    self.snapshot.take()
                st.cut_short_step = st.step
                return None
        run.check_targets(ev, self.previous(ev))
        return ev

    def previous(self, ev: dict) -> dict | None:
        """The evaluation at the evaluation step before `ev` (the last in the history): the
        history's, or the snapshot's whole pass when that step stopped early and a target is met
        now (then it joins the history, before `ev`)."""
        run, st = self.run, self.run.state
        k = bisect.bisect_left(self.cadence, ev["step"])
        prev_step = self.cadence[k - 1] if k else 0
        earlier = st.history[:-1]
        if earlier and earlier[-1]["step"] == prev_step:
            return earlier[-1]
        if st.cut_short_step == prev_step and run.targets.any_met(st, ev):
            with self.snapshot.applied():
                prev = run.evaluate(None, sets=("train",), record=False, step=prev_step)
            st.history.insert(len(st.history) - 1, prev)
            return prev
        return earlier[-1] if earlier else None

    def finish(self) -> dict | None:
        """The final numbers once the loop has stopped: a whole evaluation of both sets at the
        last step, unless the history already has one (None then); the target counts only on the
        cadence. A diverged run has no final model to evaluate."""
        run, st = self.run, self.run.state
        if st.diverged_at is not None:
            return None
        last = st.history[-1] if st.history else None
        if last is None or last["step"] != st.step:
            return run.evaluate(None, sets=("train", "test"))
        if "test_accuracy" not in last:
            run.add_test(last)
            return last
        return None
