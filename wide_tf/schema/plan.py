"""The plan of one run in steps: its budget and the steps at which it evaluates.

The one home of both rules: the trainer runs them, the analysis recomputes an old record's budget
with them, the simulator and the predict planner plan with them.
"""

from __future__ import annotations

import math


def budget_steps(*, max_steps: int, max_epochs: float, min_steps: int, num_train: int, batch: int):
    """The run's budget in steps: train.max_steps if set, else max_epochs' worth of steps but at
    least train.min_steps (a floor, so the largest batches get enough updates)."""
    if max_steps and max_steps > 0:
        return int(max_steps)
    return max(math.ceil(max_epochs * num_train / batch), int(min_steps or 0))


def eval_steps(batch: int, every_examples: int, total_steps: int) -> list[int]:
    """Steps at which a run evaluates, ascending: the first step at or past every multiple of
    `every_examples` examples (so every batch size is checked at the same points of training),
    and the last step."""
    steps = {int(total_steps)}
    k = 1
    while True:
        s = math.ceil(k * every_examples / batch)
        if s >= total_steps:
            return sorted(steps)
        steps.add(s)
        k += 1


CURVE_EVERY_EVALUATIONS = 10  # train.curve_every_examples=0: every 10th evaluation


def curve_every(eval_every: int, curve_every_examples: int) -> int:
    """Examples between two whole evaluations of both sets (the curves, the test set): a multiple
    of the evaluation cadence, so its steps are evaluation steps too."""
    return int(curve_every_examples) or CURVE_EVERY_EVALUATIONS * int(eval_every)
