"""Owns the metrics every evaluation records (the one list), those a run can be judged by, which
way each one improves, and where each is logged: a run's TensorBoard layout.

One registry: the config checks, the trainer's crossing rule, the learning-rate protocol and the
report all read a metric's direction and its valid values here, never from its name's suffix.

Accuracy and loss carry one tag set in three runs, so that TensorBoard draws them in one chart:
`train` (each host loop's mini-batches), `train_set` (the whole training set at each evaluation,
the target's metric) and `test` (the test set). The gradient statistics go with `train_set` (the
probe reads training examples). Older workdirs (train/batch_*, eval/train_*, eval/test_*) map to
the same places, so the report's curated TensorBoard reads both (report/tensorboard.py).
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


# A run's TensorBoard layout: the run folders and the tag each logged scalar goes to.
RUNS = ("train", "train_set", "test")
# Folders a trial's events may be in: today's runs, and `eval` of older workdirs.
FOLDERS = (*RUNS, "eval")

_PLACES = {
    ("train", "batch_loss"): ("train", "loss"),
    ("train", "batch_accuracy"): ("train", "accuracy"),
    ("eval", "train_loss"): ("train_set", "loss"),
    ("eval", "train_accuracy"): ("train_set", "accuracy"),
    ("eval", "test_loss"): ("test", "loss"),
    ("eval", "test_accuracy"): ("test", "accuracy"),
}


def place(kind: str, key: str) -> tuple[str, str]:
    """(run folder, tag) of the scalar `key` logged as `kind` ('train' or 'eval'), or read from
    the folder `kind` of an older workdir; a place already in today's layout is kept."""
    if (kind, key) in _PLACES:
        return _PLACES[(kind, key)]
    return ("train_set" if kind == "eval" else kind), key
