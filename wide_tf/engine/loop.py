"""Owns the Controller of one training run, the Orbit way: it holds the plan's cadences, calls the
Trainer's `train(n)` up to the next evaluation step, has the evaluation economy evaluate there
(the targets, their crossings and the stop rule), calls the actions (engine/actions.py: the probe,
checkpoints and SIGTERM, the progress line), writes the summaries, and builds the result from
plain state (engine/result.py). Shared by every backend: the Trainer, Evaluator and Checkpointer
are reached only through engine/interface.py (tests/test_coupling.py)."""

from __future__ import annotations

import bisect

from wide_tf.engine import actions, cadence, timing
from wide_tf.engine import result as result_lib
from wide_tf.engine.evaluation import Economy
from wide_tf.engine.interface import Checkpointer, Evaluator, RunFacts, Trainer
from wide_tf.engine.state import RunPlan, RunState
from wide_tf.schema.targets import EVAL_METRICS
from wide_tf.store import workdir as wd


class Controller:
    """Drives one run from its checkpoint, if any, to its result record. `targets`: the run's
    (engine/targets.py); `metrics`: its MetricsWriter (engine/summaries.py); `record`: what the
    result builder needs besides the state (the config, the trial's fields, the workdir, whether
    this process writes it: only the chief does)."""

    def __init__(
        self,
        trainer: Trainer,
        evaluator: Evaluator,
        checkpointer: Checkpointer,
        plan: RunPlan,
        targets,
        metrics,
        record: dict,
    ):
        self.trainer, self.plan = trainer, plan
        self.targets, self.metrics, self.record = targets, metrics, record
        self.economy = Economy(evaluator, targets, plan)
        self.checkpoints = actions.Checkpoints(checkpointer, plan, metrics)
        self.progress = actions.ProgressLine(plan, metrics.log)
        self.probe = None
        self.facts = None  # the trainer's RunFacts, asked once per run
        self.state = RunState()

    def restore(self) -> RunState:
        """Continues from the last checkpoint, if any (else from the start)."""
        st = self.state = self.checkpoints.load()
        self.targets.adopt(st)
        self.trainer.restore(st)
        return st

    def running(self) -> bool:
        """The stop rule: the budget, a divergence, or (train.stop_at_target) every target."""
        st = self.state
        return (
            st.step < self.plan.total_steps
            and st.diverged_at is None
            and not (self.plan.stop_at_target and self.targets.all_reached(st))
        )

    def run(self) -> dict:
        st = self.restore()
        facts = self.facts = self.trainer.describe()
        if self.plan.probe:
            self.probe = actions.Probe(
                self.trainer.measure, self.plan, self.metrics, facts.probe_examples
            )
        self.log_start(facts)
        self.checkpoints.start()
        if st.step == 0 and not st.history:
            self.evaluate()
            if self.probe is not None:
                self.probe(st)
        self.train_to_the_end(st)
        self.trainer.finish()
        if st.status is None:  # the primary target's, once the loop has stopped
            st.status = "reached" if st.steps_to_target is not None else "not_reached"
        final = self.economy.finish(st)  # the final numbers; the targets count on the cadence only
        if final is not None:
            self.write_eval(final)
        self.checkpoints.save(st, weights=False)
        self.write_time(st)
        self.metrics.close()
        return self.write_result(st)

    def train_to_the_end(self, st: RunState) -> None:
        """Host loops until the stop rule; after each, the actions and, at an evaluation step, the
        evaluation; SIGTERM: a checkpoint, then Preempted (actions.Checkpoints)."""
        plan = self.plan
        self.checkpoints.arm(st)
        self.progress.start(st.step)
        spanning = self.economy.on  # until the backend says it cannot span (Trainer.span)
        while self.running():
            lengths, last_pass = self.span_lengths(st) if spanning else ((), True)
            if lengths:
                spanned = self.train_span(st, lengths, last_pass)
                if spanned is None:
                    spanning = False
                    continue
                if not spanned:
                    break
                continue
            before = st.step
            target = min(s for s in plan.eval_steps if s > st.step)
            call = self.trainer.train(min(plan.steps_per_loop, target - st.step))
            if not self.logged(st, call):
                break
            self.after_training(st, before, call.scalars)
            self.checkpoints(st)

    def logged(self, st: RunState, call) -> bool:
        """A host call's numbers to the summaries and the progress line; False: a step diverged
        (recorded as the run's result)."""
        if call.diverged:
            self.diverged(st, call.scalars)
        self.metrics.scalars("train", st.step, call.scalars)
        self.progress(st.step, call.scalars)
        return st.diverged_at is None

    def after_training(self, st: RunState, before: int, scalars: dict) -> None:
        """The probe when due, then the evaluation of an evaluation step (the host's pass)."""
        if self.probe is not None and self.probe.due(before, st.step):
            self.probe(st)
        if self.evaluation_due(before, st.step):
            ev = self.evaluate(scalars)
            if ev is not None:  # None: a pass that could not be a crossing, cut short
                self.log_progress(scalars, ev)

    def span_lengths(self, st: RunState) -> tuple[tuple[int, ...], bool]:
        """(the steps of each evaluation interval that one Trainer.span may run from here,
        whether the last one's pass runs in the span): the next intervals, each at most
        plan.steps_per_loop steps, together at most plan.steps_per_loop steps (one interval if
        longer), while a target is unreached (the pass's bound needs one). An interval whose
        evaluation is the host's (a curve step, whose pass is whole on both sets; a probe due
        before its pass) ends the span without its pass. No intervals: the per-interval path."""
        plan = self.plan
        if not self.targets.unreached(st):
            return (), True
        k = bisect.bisect_right(plan.eval_steps, st.step)
        before, lengths = st.step, []
        for step in plan.eval_steps[k:]:
            if step - before > plan.steps_per_loop:
                break
            if lengths and step - st.step > plan.steps_per_loop:
                break
            lengths.append(step - before)
            probe_due = self.probe is not None and self.probe.due(before, step)
            if step in plan.curve_steps or probe_due:
                return tuple(lengths), False
            before = step
        return tuple(lengths), True

    def train_span(self, st: RunState, lengths: tuple[int, ...], last_pass: bool) -> bool | None:
        """One Trainer.span and what the host does after it (the per-interval path's summaries,
        evaluation record and actions, once); False: a step diverged; None: the backend cannot
        span this run (nothing ran)."""
        span = self.trainer.span(lengths, self.economy.bound(st), last_pass)
        if span is None:
            return None
        scalars = span.call.scalars
        if not self.logged(st, span.call):
            return False
        host_pass = not last_pass and span.intervals == len(lengths)
        ev = self.economy.spanned(st, span, lengths[span.intervals - 1], host_pass)
        if ev is not None:
            self.write_eval(ev)
            self.log_progress(scalars, ev)
        if host_pass:
            self.after_training(st, st.step - lengths[-1], scalars)
        self.checkpoints(st)
        return True

    def evaluation_due(self, before: int, step: int) -> bool:
        """Whether `step` is an evaluation step (plan.eval_steps): the cadence's, in examples, with
        the last step always one."""
        batch, plan = self.plan.batch, self.plan
        return cadence.itstime(
            step * batch, plan.eval_every, plan.total_steps * batch, last=before * batch
        )

    def diverged(self, st: RunState, scalars: dict) -> None:
        st.diverged_at = st.step
        if st.steps_to_target is None:
            st.status = "diverged"
        self.metrics.log(
            "diverged at step %d (loss %.4g): recorded as a result, not an error",
            st.step,
            scalars["batch_loss"],
            warning=True,
        )

    def evaluate(self, train_scalars: dict | None = None) -> dict | None:
        """The evaluation of an evaluation step (engine/evaluation.py), its targets checked."""
        ev = self.economy.evaluate(self.state, train_scalars)
        if ev is not None:
            self.write_eval(ev)
        return ev

    # ---- summaries and the result ----------------------------------------------------------------

    def write_eval(self, ev: dict) -> None:
        self.metrics.scalars("eval", ev["step"], {k: ev[k] for k in EVAL_METRICS if k in ev})

    def write_time(self, st: RunState) -> None:
        """The run's seconds by kind (engine/timing.py), as TensorBoard scalars at its last step."""
        account = timing.settle(st.time_s, st.wall_time_s)
        self.metrics.scalars("train", st.step, {f"time/{k}_s": v for k, v in account.items()})

    def log_start(self, facts: RunFacts) -> None:
        plan, bp = self.plan, facts.batch_plan
        self.metrics.log(
            "%s, %d params, batch %d (%d replica(s) x %d micro-batch(es) of %d), "
            "peak lr %.4g, %d steps (%.3g epochs) budget, eval every %d examples",
            facts.model,
            facts.params,
            plan.batch,
            bp["replicas"],
            bp["micro_batches"],
            bp["micro_batch"],
            facts.learning_rate,
            plan.total_steps,
            plan.total_steps / plan.steps_per_epoch,
            plan.eval_every,
        )

    def log_progress(self, scalars: dict, ev: dict) -> None:
        st, plan = self.state, self.plan
        self.metrics.log(
            "step %d/%d  epoch %.2f  loss %.4f  acc %.4f | train acc %.4f  test acc %s | "
            "lr %.4g  %.0f ex/s",
            st.step,
            plan.total_steps,
            st.step / plan.steps_per_epoch,
            scalars["batch_loss"],
            scalars["batch_accuracy"],
            ev["train_accuracy"],
            f"{ev['test_accuracy']:.4f}" if "test_accuracy" in ev else "-",
            scalars["learning_rate"],
            scalars["examples_per_s"],
            debug=True,
        )

    def write_result(self, st: RunState) -> dict:
        """result.json (written by the chief; the other workers delete their scratch folder)."""
        rec = self.record
        result = result_lib.build(
            rec["config"],
            rec["trial"],
            self.plan,
            st,
            self.targets.records(st),
            self.facts,
        )
        if rec["chief"]:
            wd.write_json(wd.join(rec["workdir"], wd.RESULT), result)
        self.checkpoints.close()
        self.metrics.log(
            "%s: steps to target %s, epochs to target %s, final train acc %s, test acc %s",
            st.status,
            result["steps_to_target"],
            None if result["epochs_to_target"] is None else round(result["epochs_to_target"], 3),
            *(
                None if v is None else round(v, 4)
                for v in (result["final"]["train_accuracy"], result["final"]["test_accuracy"])
            ),
        )
        return result
