"""Owns the seam between one run's shared driver and its backend (the Orbit way): what the
Controller (engine/loop.py) and the evaluation economy (engine/evaluation.py) may ask of a Trainer,
an Evaluator and a Checkpointer, and the typed payloads they return. A backend (engine/tf/run.py,
engine/jax/run.py) implements the three; the Controller, its actions, the economy, the targets and
the result record are shared. tests/test_coupling.py holds the rule that nothing shared reaches past
these methods."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from wide_tf.engine.state import RunState


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What Trainer.describe returns, once per run: the run's facts for its log and record."""

    model: str  # the model's name
    params: int  # trainable parameters
    learning_rate: float  # the peak learning rate at this batch size
    probe_examples: int | None  # the gradient probe's set (None: no probe)
    runtime: str  # the devices and strategy, in words
    dtype_policy: str  # the policy the model was really built with
    batch_plan: dict  # the batch's layout (engine/state.BatchPlan.describe)


@dataclasses.dataclass(frozen=True)
class HostCall:
    """What Trainer.train returns: the host call's logged numbers (batch_loss, batch_accuracy,
    the norms, learning_rate, examples_per_s, the optimizer's diagnostics, the two-batch noise
    scale: engine/host_scalars.py) and whether a step diverged."""

    scalars: dict
    diverged: bool


@dataclasses.dataclass(frozen=True)
class Span:
    """What Trainer.span returns: several evaluation intervals in one device call, each its steps
    then the bounded pass over the training set, ended by the first pass that went whole (a
    target may be met there: the host checks it), a diverged step, or the intervals asked for.
    `call`: the last interval's numbers (as Trainer.train's); `intervals`: how many ran; `whole`:
    the last interval's pass when it went whole, None when it stopped early, a step diverged or
    the pass was left to the host."""

    call: HostCall
    intervals: int
    whole: SetMetrics | None


@dataclasses.dataclass(frozen=True)
class GradientStats:
    """What Trainer.measure returns: the exact gradient probe's numbers."""

    diversity: float
    batch_bound: float
    noise_scale: float


@dataclasses.dataclass(frozen=True)
class SetMetrics:
    """One set's numbers in what Evaluator.evaluate returns."""

    loss: float
    accuracy: float
    examples: float  # the pass's count (a float32 sum of weights; padding weighs 0)


class Trainer(Protocol):
    """The training side of one run: its model, optimizer, data stream and compiled step."""

    def restore(self, state: RunState) -> None:
        """Adopts `state` (its step, noise estimate and time account; a fresh one or a
        checkpoint's) and opens the data stream at its step."""

    def train(self, num_steps: int) -> HostCall:
        """`num_steps` optimizer steps (fewer when one diverges: the state's step says how many
        ran); the host call's numbers."""

    def span(self, lengths: tuple[int, ...], bound, last_pass: bool = True) -> Span | None:
        """Up to len(lengths) evaluation intervals, the k-th of lengths[k] steps, each followed by
        the training set's pass under `bound` (engine/evaluation.bound) but the last one's when
        `last_pass` is False (the host's); a pass that stops early holds the weights in the
        Evaluator's snapshot, as Evaluator.hold does. None, having run nothing: this run's backend
        cannot (the Controller then calls `train` and the Evaluator once per interval)."""

    def measure(self, step: int) -> GradientStats:
        """The exact gradient probe at the current weights; `step` is the current step (at 0 a
        seed's measurement is shared)."""

    def describe(self) -> RunFacts:
        """The run's facts for its log and record (called once per run, after restore)."""

    def finish(self) -> None:
        """Training is over: the data stream's threads end now."""


class Evaluator(Protocol):
    """The evaluation side of one run: its evaluation sets and the snapshot of the weights."""

    examples: dict  # set name -> its number of examples (the bound of a pass is computed on it)

    def evaluate(
        self, step: int, sets=("train", "test"), bound=None, snapshot: bool = False
    ) -> dict[str, SetMetrics] | None:
        """{set: its SetMetrics} of the model at `step` (the snapshot's weights
        when `snapshot`); None when the training set's pass stopped early under `bound` (the
        evaluation economy's (fewest hits, largest loss sum); None: a whole pass)."""

    def hold(self) -> None:
        """The current weights into the snapshot (a pass at this step stopped early)."""


class Checkpointer(Protocol):
    """Where a run's weights, optimizer and RunState are saved, and read back on resume."""

    def load(self) -> RunState | None:
        """The state of the last checkpoint (its weights restored), or None: a fresh start."""

    def save(self, state: RunState) -> None:
        """A checkpoint of the model, optimizer, snapshot and `state` at the state's step."""

    def close(self) -> None:
        """The run is over: a worker that is not the chief removes its scratch folder."""
