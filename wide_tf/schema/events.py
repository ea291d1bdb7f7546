"""Owns a run's TensorBoard layout: the run folder and the tag each logged scalar goes to.
Accuracy and loss carry one tag set in three runs, so that TensorBoard draws them in one chart:
`train` (each host loop's mini-batches), `train_set` (the whole training set at each evaluation,
the target's metric) and `test` (the test set). The gradient statistics go with `train_set` (the
probe reads training examples). Older workdirs (train/batch_*, eval/train_*, eval/test_*) map to
the same places, so the report's curated TensorBoard reads both (report/tensorboard.py)."""

from __future__ import annotations

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
