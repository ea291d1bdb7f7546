"""Owns the glue both backends' Trainer and Evaluator share (engine/interface.py's seam): the
restore of a run's state and time account, the timed host call and its logged numbers, the
timed probe shared by a seed at step 0, the run's facts, and the evaluation passes under the
batch-norm statistics of train.target_bn. Each backend (engine/tf/run.py, engine/jax/run.py)
subclasses the two and supplies its compiled calls through the hooks named below."""

from __future__ import annotations

import contextlib
import time

import numpy as np

from wide_tf.engine import host_scalars, schedules, timing
from wide_tf.engine.interface import GradientStats, HostCall, RunFacts, SetMetrics, Span
from wide_tf.engine.measure.noise_scale import TwoBatchNoiseScale
from wide_tf.engine.state import BatchPlan, RunPlan, RunState


class Account:
    """The run's time account (RunState.time_s), which the trainer adopts at restore and the
    evaluator times its passes into."""

    def __init__(self):
        self.time_s: dict = {}


class BaseTrainer:
    """engine/interface.Trainer with the backend's hooks: `_open(step)` (the data at a step),
    `_call(num_steps)` (the compiled loop, as a function to time: its device sums),
    `_diagnostics()`, `_probe()` (the probe as a function and its examples), `_model()` and
    `_probe_examples()`."""

    def __init__(self, config, runtime, batch_plan: BatchPlan, plan: RunPlan, account, at_init):
        self.config, self.runtime, self.batch_plan, self.plan = config, runtime, batch_plan, plan
        self.account, self.at_init = account, at_init
        self.state = RunState()
        self.noise = None
        self.setup_s = 0.0  # the set-up's seconds (engine/train.py sets them), into the account

    def restore(self, state: RunState) -> None:
        self.state = state
        self.account.time_s = state.time_s
        timing.add(state.time_s, "setup", self.setup_s)
        self.noise = TwoBatchNoiseScale(decay=self.config.train.noise_scale_ema)
        if state.noise:
            self.noise = TwoBatchNoiseScale.from_dict(state.noise)
        self._open(state.step)

    def train(self, num_steps: int) -> dict:
        st = self.state
        call = self._call(num_steps)
        t0 = time.time()
        with timing.timed("train", st.time_s) as timed:
            scalars = call()
            timed["count"] = int(scalars["steps"])
        return self.host_call(scalars, time.time() - t0)

    def host_call(self, scalars: dict, dt: float) -> HostCall:
        """The HostCall of a training call whose device sums are `scalars` and whose seconds are
        `dt` (this run's share of the call, in a cohort: engine/cohort.py); the state's step and
        training time advanced. The call's seconds are in the time account already."""
        st = self.state
        st.step += int(scalars["steps"])  # all of them, or up to the first diverged step
        st.train_time_s += dt
        diagnostics = self._diagnostics()
        out, updated = host_scalars.from_sums(
            scalars,
            dt,
            self.batch_plan,
            self.plan.batch,
            self.noise,
            diagnostics.names if diagnostics is not None else (),
        )
        if updated:  # the noise estimate into the state
            st.noise = self.noise.to_dict()
        return HostCall(out, bool(scalars["diverged"]))

    def _span_call(self, lengths: tuple, bound, last_pass: bool):
        """The backend's span, as a function to time returning a dict: `scalars` (the last
        interval's, as the training call's), `intervals` (run), `sums` (the last pass's loss sum,
        hits and examples), `evaluated` (the examples all the span's passes evaluated) and
        `examples` (the training set's: a pass that counted them all went whole); None: this run
        cannot span."""
        return None

    def span(self, lengths: tuple, bound, last_pass: bool = True) -> Span | None:
        st = self.state
        call = self._span_call(tuple(lengths), bound, last_pass)
        if call is None:
            return None
        seconds: dict = {}
        t0 = time.time()
        with timing.timed("train", seconds) as timed:
            got = call()
            scalars, ran = got["scalars"], int(got["intervals"])
            steps = sum(lengths[: ran - 1]) + int(scalars["steps"])
            timed["count"] = steps
        dt = time.time() - t0
        # One call did both: its seconds go to training and evaluation in proportion to their
        # arithmetic, a forward and a backward pass (3 units) per training example against a
        # forward pass (1 unit) per evaluated example.
        train_units, eval_units = 3.0 * steps * self.plan.batch, float(got["evaluated"])
        train_share = train_units / max(train_units + eval_units, 1.0)
        timing.split(st.time_s, seconds, {"train": train_share, "eval": 1.0 - train_share})
        st.step += steps
        st.train_time_s += dt * train_share
        diagnostics = self._diagnostics()
        out, _ = host_scalars.from_sums(
            scalars,
            dt * train_share * int(scalars["steps"]) / max(steps, 1),
            self.batch_plan,
            self.plan.batch,
            self.noise,
            diagnostics.names if diagnostics is not None else (),
        )
        loss_sum, hits, count = got["sums"]
        whole = None
        if not scalars["diverged"] and count >= got["examples"]:
            whole = SetMetrics(loss=loss_sum / count, accuracy=hits / count, examples=count)
        return Span(HostCall(out, bool(scalars["diverged"])), ran, whole)

    def measure(self, step: int) -> GradientStats:
        with timing.timed("probe", self.state.time_s) as timed:
            compute, n = self._probe()
            seed = self.config.train.seed
            g = host_scalars.at_init(self.at_init, seed, step, "gradient", compute)
            timed["count"] = n
        return GradientStats(**g)

    def describe(self) -> RunFacts:
        model = self._model()
        # The policy the model was really built with (not only the one asked for): its first
        # layer with weights (the logits layer stays float32).
        layer = next((c for c in model.layers if c.weights), model)
        peak = schedules.peak_learning_rate(self.config.optim, self.plan.batch)
        return RunFacts(
            model=model.name,
            params=int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            learning_rate=float(peak),
            probe_examples=self._probe_examples(),
            runtime=self.runtime.describe(),
            dtype_policy=layer.dtype_policy.name,
            batch_plan=self.batch_plan.describe(),
        )


class BaseEvaluator:
    """engine/interface.Evaluator with the backend's hooks: `_weights()` (what a pass reads now),
    `_snapshot()` (a context giving the snapshot's), `_statistics(weights)` (a context giving
    the weights under train.target_bn's batch-norm statistics) and `_pass(weights, set, bound)`
    (one set's bounded pass: its sums, or None when it stopped early)."""

    def __init__(self, config, eval_sets: dict, account, at_init):
        self.seed, self.eval_sets, self.account = config.train.seed, eval_sets, account
        self.at_init = at_init
        self.examples = {k: s.num_examples for k, s in eval_sets.items()}

    def evaluate(self, step: int, sets=("train", "test"), bound=None, snapshot: bool = False):
        sets = tuple(sets)
        if snapshot:
            with self._snapshot() as weights:
                return self._passes(weights, sets, bound)
        key = "eval" if sets == ("train", "test") else "eval:" + ",".join(sets)
        compute = lambda: self._passes(self._weights(), sets, bound)  # noqa: E731
        return host_scalars.at_init(self.at_init, self.seed, step, key, compute)

    def _passes(self, weights, names, bound) -> dict[str, SetMetrics] | None:
        with self._statistics(weights) as weights:
            out = {}
            for k in names:
                with timing.timed("eval", self.account.time_s) as timed:
                    got = self._pass(weights, self.eval_sets[k], bound if k == "train" else None)
                    timed["count"] = 0 if got is None else int(got["examples"])
                if got is None:
                    return None
                out[k] = SetMetrics(**got)
            return out

    def _statistics(self, weights):
        return contextlib.nullcontext(weights)
