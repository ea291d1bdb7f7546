"""Owns the one cadence rule of a run (as big_vision's `itstime`): whether an action on a cadence
is due, from a counter now and when it was last looked at or acted on. The Controller's
evaluation steps, the gradient probe, the checkpoints (steps and wall time) and the progress line
all ask it; schema/plan.py's list of evaluation steps is the same rule written in closed form
(tests/engine/test_cadence.py holds them equal)."""

from __future__ import annotations


def itstime(
    now: float, every: float, total: float | None = None, *, last: float, aligned: bool = True
) -> bool:
    """Whether an action every `every` units of a counter (examples, steps or seconds) is due at
    `now`, the counter having been `last` before.

    Aligned (the default): `now` has reached a multiple of `every` that `last`, the counter at
    the previous look, had not; counted in examples, that puts the actions at the same points of
    training for every batch size. Never when `every` <= 0 (no multiples).
    Elapsed (`aligned=False`): at least `every` has passed since `last`, the counter when the
    action last ran (`every` <= 0: always, no minimum).
    Either way, always on reaching `total` (the end of the run), when given."""
    if total is not None and last < total <= now:
        return True
    if not aligned:
        return now - last >= every
    return every > 0 and now // every > last // every
