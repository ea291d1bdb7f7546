"""The one cadence rule (engine/cadence.py): aligned multiples for evaluations and the probe,
elapsed amounts for checkpoints and the progress line, and the same evaluation steps as the
plan's closed form."""

from __future__ import annotations

import itertools

from wide_tf.engine.cadence import itstime
from wide_tf.schema import plan as plan_lib


def test_aligned_multiples_are_due_once_each_whatever_the_stride():
    # Every 100 examples, at a batch of 64: the steps that reach 100, 200, 300, ...
    due = [s for s in range(1, 12) if itstime(64 * s, 100, last=64 * (s - 1))]
    assert due == [2, 4, 5, 7, 8, 10, 11]
    assert not itstime(500, 0, last=0)  # no multiples of 0: never (the probe at the start only)
    assert itstime(7, 100, total=7, last=6)  # the end is always due


def test_elapsed_amounts_count_from_the_last_action():
    assert not itstime(29.9, 30, last=0.0, aligned=False)
    assert itstime(30.0, 30, last=0.0, aligned=False)
    assert itstime(5.0, 0.0, last=5.0, aligned=False)  # no minimum: always


def test_the_evaluation_steps_are_the_plans_closed_form():
    for batch, every, total in itertools.product(
        (1, 7, 32, 256, 1000), (50, 320, 1437), (1, 9, 60)
    ):
        due = [
            s
            for s in range(1, total + 1)
            if itstime(s * batch, every, total * batch, last=(s - 1) * batch)
        ]
        assert due == plan_lib.eval_steps(batch, every, total), (batch, every, total)
