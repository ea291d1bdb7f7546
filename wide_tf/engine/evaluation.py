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
at the end. Nothing here reads the device per training step; a pass reads once per chunk.

Shared by every backend: it reaches the weights only through an Evaluator (engine/interface.py),
and reads the run's plan and state as plain data."""

from __future__ import annotations

import bisect
import math

import numpy as np

from wide_tf.engine.interface import Evaluator, Span
from wide_tf.engine.state import RunPlan, RunState
from wide_tf.schema import targets as targets_lib

# Metrics of the training set: a bounded pass over it can rule them out (their best reachable
# value); the economy is off when a target is measured on another set.
_TRAIN_METRICS = tuple(
    m for m in targets_lib.EVAL_METRICS if targets_lib.METRICS[m].split == "train"
)


def bound(unreached, n: int) -> tuple[float, float]:
    """The bound of a pass over the `n` examples of the training set (engine/tf/step.go_on) that
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
    """The evaluation steps of one run: whole passes at step 0, on the curve cadence and without
    the economy; else a bounded pass over the training set alone. `targets`: the run's
    (engine/targets.py); every evaluation is recorded in the state's history."""

    def __init__(self, evaluator: Evaluator, targets, plan: RunPlan):
        self.evaluator, self.targets, self.plan = evaluator, targets, plan
        metrics = [targets.primary[0]] + [m for m, _ in targets.extra]
        self.on = plan.eval_economy and all(m in _TRAIN_METRICS for m in metrics)

    def evaluate(self, st: RunState, train_scalars: dict | None = None) -> dict | None:
        """The evaluation at the current step (its targets checked); None: the pass stopped
        early (no target can be met here) and the weights went into the snapshot."""
        if not self.on or st.step == 0 or st.step in self.plan.curve_steps:
            ev = self._evaluate(st, train_scalars, ("train", "test"))
        else:
            unreached = self.targets.unreached(st)
            limit = bound(unreached, self.evaluator.examples["train"])
            ev = self._evaluate(st, train_scalars, ("train",), bound=limit)
            if ev is None:
                # The snapshot is read only when the next evaluation meets an unreached target
                # (previous): with none left (train.stop_at_target=False runs on) it is not taken.
                if unreached:
                    self.evaluator.hold()
                st.cut_short_step = st.step
                return None
        self.targets.check(st, ev, self.previous(st, ev))
        return ev

    def bound(self, st: RunState):
        """The bound of this step's training-set pass: (fewest hits, largest loss sum)."""
        return bound(self.targets.unreached(st), self.evaluator.examples["train"])

    def spanned(
        self, st: RunState, span: Span, last_steps: int, host_pass: bool = False
    ) -> dict | None:
        """The evaluations of a span (Trainer.span), as `evaluate` would have made them one
        interval at a time: every interval but the last stopped early (the trainer held the
        weights of each in the snapshot, the last one's kept); the last either stopped early too
        (None) or went whole, and is then checked for crossings as `evaluate` checks it.
        `last_steps`: the last interval's steps; `host_pass`: the last interval ran without its
        pass, which the host's `evaluate` makes next (None here)."""
        if span.whole is None and not host_pass:
            st.cut_short_step = st.step
            return None
        if span.intervals > 1:  # the interval before the last stopped early, at its end
            st.cut_short_step = st.step - last_steps
        if host_pass:
            return None
        ev = self._record(st, span.call.scalars, {"train": span.whole})
        self.targets.check(st, ev, self.previous(st, ev))
        return ev

    def _evaluate(
        self, st, train_scalars, sets, bound=None, step=None, snapshot=False
    ) -> dict | None:
        """The loss and accuracy of `sets` at the current step (at `step`: the snapshot's), into
        the history unless it is the snapshot's (the caller places it)."""
        step = st.step if step is None else step
        out = self.evaluator.evaluate(step, sets, bound, snapshot)
        if out is None:
            return None
        return self._record(st, train_scalars, out, step, snapshot)

    def _record(self, st, train_scalars, out: dict, step=None, snapshot=False) -> dict:
        """The evaluation record of `out` ({set: SetMetrics}) at `step` (the current one)."""
        step = st.step if step is None else step
        ev = {"step": step, "epoch": self.plan.epoch(step), "examples": step * self.plan.batch}
        for name, values in out.items():
            ev.update({f"{name}_{q}": getattr(values, q) for q in targets_lib.EVAL_QUANTITIES})
        if train_scalars:
            ev.update(train_scalars)
        if "test" in out:
            _best_test(st, out["test"].accuracy)
        if not snapshot:
            st.history.append(ev)
        return ev

    def previous(self, st: RunState, ev: dict) -> dict | None:
        """The evaluation at the evaluation step before `ev` (the last in the history): the
        history's, or the snapshot's whole pass when that step stopped early and a target is met
        now (then it joins the history, before `ev`)."""
        cadence = self.plan.eval_steps
        k = bisect.bisect_left(cadence, ev["step"])
        prev_step = cadence[k - 1] if k else 0
        earlier = st.history[:-1]
        if earlier and earlier[-1]["step"] == prev_step:
            return earlier[-1]
        if st.cut_short_step == prev_step and self.targets.any_met(st, ev):
            prev = self._evaluate(st, None, ("train",), step=prev_step, snapshot=True)
            st.history.insert(len(st.history) - 1, prev)
            return prev
        return earlier[-1] if earlier else None

    def finish(self, st: RunState) -> dict | None:
        """The final numbers once the loop has stopped: a whole evaluation of both sets at the
        last step, unless the history already has one (None then); the target counts only on the
        cadence. A diverged run has no final model to evaluate."""
        if st.diverged_at is not None:
            return None
        last = st.history[-1] if st.history else None
        if last is None or last["step"] != st.step:
            return self._evaluate(st, None, ("train", "test"))
        if "test_accuracy" not in last:
            te = self.evaluator.evaluate(st.step, ("test",))["test"]
            last.update({f"test_{q}": getattr(te, q) for q in targets_lib.EVAL_QUANTITIES})
            _best_test(st, te.accuracy)
            return last
        return None


def _best_test(st: RunState, accuracy: float) -> None:
    best = st.best_test_accuracy
    st.best_test_accuracy = accuracy if best is None else max(best, accuracy)
