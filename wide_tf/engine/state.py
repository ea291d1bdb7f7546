"""Owns what a run carries from one host loop to the next and into its checkpoints besides the
weights and optimizer state (RunState, saved as a JSON string)."""

from __future__ import annotations

import dataclasses
import json


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
