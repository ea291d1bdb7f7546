"""Owns the plain data of one run, shared by every backend: its plan (RunPlan: the budget and the
cadences the Controller holds; BatchPlan: one update's layout over replicas and micro-batches) and
what it carries from one host loop to the next and into its checkpoints besides the weights and
optimizer state (RunState, saved as a JSON string)."""

from __future__ import annotations

import dataclasses
import json

from wide_tf.schema import plan as plan_lib
from wide_tf.schema import rules
from wide_tf.schema.problems import UsageError

# With train.checkpoint_every_steps=0 (ten checkpoints per run), at least this long between two.
DEFAULT_CHECKPOINT_MIN_S = 10.0


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run's numbers that do not change while it runs: its batch, budget and cadences (the
    evaluation steps, the curves' whole passes, checkpoints, the probe), from the config and the
    training set's size. Plain data: the Controller, the evaluation economy and the result record
    read it; no backend object is needed to know when anything happens."""

    name: str
    batch: int
    num_train: int
    total_steps: int
    eval_every: int  # examples between two evaluation steps
    eval_steps: tuple  # ascending; the last is total_steps
    curve_steps: frozenset  # evaluation steps that evaluate both sets whole
    steps_per_loop: int
    checkpoint_every: int  # steps
    checkpoint_min_s: float
    stop_at_target: bool
    eval_economy: bool
    probe: bool  # whether the gradient probe runs at all (at the start, then on its cadence)
    probe_every: int  # examples between two probe measurements (0: at the start only)

    @classmethod
    def make(cls, config, name: str, num_train: int, batch: int) -> RunPlan:
        t = config.train
        total = plan_lib.budget_steps(
            max_steps=t.max_steps,
            max_epochs=t.max_epochs,
            min_steps=t.min_steps,
            num_train=num_train,
            batch=batch,
        )
        every = t.eval_every_examples or num_train
        curve = plan_lib.curve_every(every, t.curve_every_examples)
        return cls(
            name=name,
            batch=batch,
            num_train=num_train,
            total_steps=total,
            eval_every=every,
            eval_steps=tuple(plan_lib.eval_steps(batch, every, total)),
            curve_steps=frozenset(plan_lib.eval_steps(batch, curve, total)),
            steps_per_loop=t.steps_per_loop,
            checkpoint_every=t.checkpoint_every_steps or max(1, total // 10),
            # The default cadence (ten per run) also waits DEFAULT_CHECKPOINT_MIN_S between
            # saves: a run of a few seconds needs no checkpoint every 0.1 s (each cost ~25 ms
            # here). Resume is exact from any checkpoint, so this only changes how much work a
            # kill can lose.
            checkpoint_min_s=0.0 if t.checkpoint_every_steps else DEFAULT_CHECKPOINT_MIN_S,
            stop_at_target=bool(t.stop_at_target),
            eval_economy=bool(t.eval_economy),
            probe=bool(t.gradient_every_examples or t.gradient_at_init),
            probe_every=int(t.gradient_every_examples or 0),
        )

    @property
    def steps_per_epoch(self) -> float:
        return self.num_train / self.batch

    def epoch(self, step: int) -> float:
        return step * self.batch / self.num_train


@dataclasses.dataclass
class RunState:
    """Everything a run carries from one host loop to the next, and into its checkpoints (as a
    JSON string beside the model and optimizer), besides the weights and optimizer state."""

    step: int = 0
    # The primary target's: None while running; then 'reached', 'not_reached' or 'diverged' (a
    # run that diverges after it reached the primary target, while it trains on towards the extra
    # targets, stays 'reached': that crossing is as valid as in a run without extra targets).
    status: str | None = None
    steps_to_target: int | None = None
    steps_to_target_interp: float | None = (
        None  # the crossing between the two evaluations around it
    )
    # One entry per train.extra_targets entry: None until it is first met, then
    # [step, interpolated step]. Saved in checkpoints, so a resumed run keeps earlier crossings.
    extra_crossings: list = dataclasses.field(default_factory=list)
    diverged_at: int | None = None  # the step at which the run diverged
    best_test_accuracy: float | None = None
    history: list = dataclasses.field(default_factory=list)  # one dict per evaluation
    gradient: list = dataclasses.field(default_factory=list)  # one dict per probe measurement
    noise: dict | None = None  # the two-batch noise-scale estimator's state
    train_time_s: float = 0.0
    wall_time_s: float = 0.0
    # Seconds by kind (engine/timing.py's ACCOUNT): result.json's "time_s".
    time_s: dict = dataclasses.field(default_factory=dict)
    # The last evaluation step whose training-set pass stopped early (its weights are in the
    # evaluation snapshot, engine/evaluation.py), or None.
    cut_short_step: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str, step: int) -> RunState:
        """From a checkpoint's JSON; `step` (the optimizer's) where the checkpoint predates the
        field. Unknown keys (from older versions) are ignored."""
        d = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        d.setdefault("step", step)
        if d.get("status") == "diverged" and d.get("diverged_at") is None:
            d["diverged_at"] = d["step"]  # a checkpoint from before the field
        return cls(**{k: v for k, v in d.items() if k in names})


class BatchSplitError(UsageError):
    """The global batch cannot be split evenly over replicas or micro-batches."""


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How one optimizer update of `global_batch` examples is laid out on the hardware."""

    global_batch: int
    num_replicas: int
    num_micro_batches: int
    max_device_batch: int = 0  # the cap in force (the config's, or the GPU default); 0: none

    @property
    def per_replica(self) -> int:
        return self.global_batch // self.num_replicas

    @property
    def micro_batch(self) -> int:
        return self.per_replica // self.num_micro_batches

    @classmethod
    def make(cls, global_batch: int, num_replicas: int, max_device_batch: int = 0) -> BatchPlan:
        if global_batch <= 0:
            raise BatchSplitError(f"train.global_batch={global_batch} must be positive")
        if global_batch % num_replicas:
            raise BatchSplitError(
                f"train.global_batch={global_batch} does not divide over {num_replicas} replicas; "
                f"use a multiple of {num_replicas}"
            )
        micro = rules.micro_batches(global_batch // num_replicas, max_device_batch)
        return cls(global_batch, num_replicas, micro, int(max_device_batch or 0))

    def describe(self) -> dict:
        """The plan as result.json records it (schema/result_fields.py, BATCH_PLAN)."""
        return {
            "max_device_batch": self.max_device_batch,
            "replicas": self.num_replicas,
            "per_replica": self.per_replica,
            "micro_batches": self.num_micro_batches,
            "micro_batch": self.micro_batch,
        }
