"""The metrics a run can be judged by, and which way each one improves.

One registry: the config checks, the trainer's crossing rule, the learning-rate protocol and the
report all read a metric's direction and its valid values here, never from its name's suffix.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TargetMetric:
    name: str
    lower_is_better: bool  # a loss; an accuracy is higher-is-better
    bounded_by_one: bool  # an accuracy lies in (0, 1]; a loss only above 0
    doc: str


TARGET_METRICS_SPEC = {
    m.name: m
    for m in (
        TargetMetric("train_accuracy", False, True, "accuracy on the whole training set"),
        TargetMetric("train_loss", True, False, "mean loss on the whole training set"),
        TargetMetric("test_accuracy", False, True, "accuracy on the test set"),
    )
}
TARGET_METRICS = tuple(TARGET_METRICS_SPEC)
# Metrics recorded by every evaluation that are not targets: still ordered by the same rule.
_OTHER = {"test_loss": True}


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is better (a loss), for every metric a run records."""
    if metric in TARGET_METRICS_SPEC:
        return TARGET_METRICS_SPEC[metric].lower_is_better
    if metric in _OTHER:
        return _OTHER[metric]
    raise KeyError(f"unknown metric {metric!r}; the metrics are {(*TARGET_METRICS, *_OTHER)}")


def comparison(metric: str) -> str:
    """How `metric` meets its target: a loss at or below it, an accuracy at or above it."""
    return "<=" if lower_is_better(metric) else ">="


def met(metric: str, target: float, value: float) -> bool:
    """Whether `value` of `metric` meets `target`."""
    return value <= target if lower_is_better(metric) else value >= target
