"""Owns the actions the Controller (engine/loop.py) calls after each host loop, the Orbit way:
the gradient probe when it is due, checkpoints on their cadence and at a SIGTERM, and the run's
progress line on a wall-clock cadence. Each reads the plan and the state as plain data and reaches
the backend only through engine/interface.py."""

from __future__ import annotations

import dataclasses
import time

from wide_tf.engine import cadence, preemption, timing
from wide_tf.engine.interface import Checkpointer
from wide_tf.engine.state import RunPlan, RunState

# The progress line's cadence: one line per run every this many seconds of wall time, between its
# evaluations' lines (a long run of a study otherwise says nothing for minutes).
PROGRESS_EVERY_S = 30.0


class Probe:
    """The exact gradient probe: at the start and every plan.probe_every examples; each
    measurement into the state's gradient history, TensorBoard and the log. `measure(step)` is
    the trainer's (engine/interface.Trainer.measure: GradientStats)."""

    def __init__(self, measure, plan: RunPlan, metrics, examples: int | None):
        self.measure_at, self.plan, self.metrics, self.examples = measure, plan, metrics, examples

    def due(self, step_before: int, step: int) -> bool:
        every, batch = self.plan.probe_every, self.plan.batch
        return cadence.itstime(step * batch, every, last=step_before * batch)

    def __call__(self, st: RunState) -> None:
        stats = self.measure_at(st.step)
        g = dict(dataclasses.asdict(stats), step=st.step, examples=st.step * self.plan.batch)
        st.gradient.append(g)
        self.metrics.scalars(
            "eval",
            g["step"],
            {
                "gradient/diversity": g["diversity"],
                "gradient/batch_bound": g["batch_bound"],
                "gradient/noise_scale_exact": g["noise_scale"],
            },
        )
        self.metrics.log(
            "step %d: gradient diversity %.4g, batch bound %.4g (probe of %d examples)",
            g["step"],
            g["diversity"],
            g["batch_bound"],
            self.examples,
            debug=True,
        )


class Checkpoints:
    """Checkpoints (weights, optimizer, state) every plan.checkpoint_every steps, at least
    plan.checkpoint_min_s apart, with metrics.jsonl; at a SIGTERM one now, then Preempted. The
    run's wall time is counted here, between saves."""

    def __init__(self, checkpointer: Checkpointer, plan: RunPlan, metrics, clock=time.time):
        self.checkpointer, self.plan, self.metrics, self.clock = checkpointer, plan, metrics, clock
        self.wall = clock()
        self.last_step, self.last_time = 0, self.wall

    def load(self) -> RunState:
        """The last checkpoint's state (its weights restored), or a fresh one."""
        return self.checkpointer.load() or RunState()

    def close(self) -> None:
        self.checkpointer.close()

    def start(self) -> None:
        """The run's wall clock starts (after its restore and first log line)."""
        self.wall = self.clock()

    def arm(self, st: RunState) -> None:
        """The cadence counts from here (the first host loop of this process)."""
        self.last_step, self.last_time = st.step, self.clock()

    def save(self, st: RunState, weights: bool = True) -> None:
        """A checkpoint and metrics.jsonl; at the end of a run metrics.jsonl alone
        (`weights=False`): a finished run is never resumed (its result.json says it is done),
        and a run killed before that file is written resumes from its last checkpoint and
        repeats the same steps."""
        with timing.timed("checkpoint", st.time_s) as timed:
            now = self.clock()
            st.wall_time_s += now - self.wall
            self.wall = now
            if weights:
                self.checkpointer.save(st)
            self.metrics.history(st.history)
            self.metrics.flush()  # the events up to this checkpoint, with it
            timed["count"] = st.step

    def __call__(self, st: RunState) -> None:
        plan = self.plan
        if cadence.itstime(
            st.step, plan.checkpoint_every, last=self.last_step, aligned=False
        ) and cadence.itstime(
            self.clock(), plan.checkpoint_min_s, last=self.last_time, aligned=False
        ):
            self.save(st)
            self.last_step, self.last_time = st.step, self.clock()
        # SIGTERM or a platform notice on any host: every host checkpoints at this same step and
        # stops (engine/preemption.py's agreement).
        if preemption.stop_agreed(st.step):
            if self.last_step != st.step:
                self.save(st)
            raise preemption.Preempted(plan.name, st.step)


def duration(seconds: float) -> str:
    """1h02m, 3m05s, 42s."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class ProgressLine:
    """One log line every `every_s` seconds of wall time (`clock`'s), whatever the evaluation
    cadence: the step, epoch, last loss, examples per second since the last line, and the time
    left at this run's own pace since it started here (to its budget: a target may stop it
    sooner)."""

    def __init__(self, plan: RunPlan, log, every_s: float = PROGRESS_EVERY_S, clock=time.monotonic):
        self.plan, self.log, self.every_s, self.clock = plan, log, every_s, clock
        self.t0 = self.t_last = clock()
        self.step0 = self.step_last = 0

    def start(self, step: int) -> None:
        self.t0 = self.t_last = self.clock()
        self.step0 = self.step_last = step

    def __call__(self, step: int, scalars: dict) -> str | None:
        now = self.clock()
        due = cadence.itstime(now, self.every_s, last=self.t_last, aligned=False)
        if not due or step <= self.step0:
            return None
        plan = self.plan
        rate = (step - self.step_last) * plan.batch / (now - self.t_last)
        left = (plan.total_steps - step) * (now - self.t0) / (step - self.step0)
        line = (
            f"progress: step {step}/{plan.total_steps}  epoch {plan.epoch(step):.2f}  "
            f"loss {scalars['batch_loss']:.4f}  {rate:.0f} ex/s  "
            f"ETA {duration(left)} (to the budget; a target may stop it sooner)"
        )
        self.log("%s", line)
        self.t_last, self.step_last = now, step
        return line
