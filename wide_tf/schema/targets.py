"""The metrics every evaluation records (the one list), those a run can be judged by, and which way
each one improves.

One registry: the config checks, the trainer's crossing rule, the learning-rate protocol and the
report all read a metric's direction and its valid values here, never from its name's suffix.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    split: str  # the evaluation set it is measured on
    quantity: str  # what a pass computes on that set
    lower_is_better: bool  # a loss; an accuracy is higher-is-better
    bounded_by_one: bool  # an accuracy lies in (0, 1]; a loss only above 0
    target: bool  # whether a run may be judged by it (train.target_metric, extra_targets)
    doc: str


# Every metric an evaluation records, in the one order the record, the summaries and the tables
# use (result.json "final", TensorBoard's eval/ scalars, the final_* columns).
METRICS = {
    m.name: m
    for m in (
        Metric(
            "train_accuracy",
            "train",
            "accuracy",
            False,
            True,
            True,
            "accuracy on the whole training set",
        ),
        Metric(
            "train_loss", "train", "loss", True, False, True, "mean loss on the whole training set"
        ),
        Metric("test_accuracy", "test", "accuracy", False, True, True, "accuracy on the test set"),
        Metric("test_loss", "test", "loss", True, False, False, "mean loss on the test set"),
    )
}
EVAL_METRICS = tuple(METRICS)
EVAL_QUANTITIES = tuple(dict.fromkeys(m.quantity for m in METRICS.values()))
TARGET_METRICS_SPEC = {k: m for k, m in METRICS.items() if m.target}
TARGET_METRICS = tuple(TARGET_METRICS_SPEC)


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is better (a loss), for every metric a run records."""
    if metric in METRICS:
        return METRICS[metric].lower_is_better
    raise KeyError(f"unknown metric {metric!r}; the metrics are {EVAL_METRICS}")


def comparison(metric: str) -> str:
    """How `metric` meets its target: a loss at or below it, an accuracy at or above it."""
    return "<=" if lower_is_better(metric) else ">="


def met(metric: str, target: float, value: float) -> bool:
    """Whether `value` of `metric` meets `target`."""
    return value <= target if lower_is_better(metric) else value >= target
