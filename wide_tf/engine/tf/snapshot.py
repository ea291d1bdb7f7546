"""Owns the evaluation economy's snapshot of the weights (engine/evaluation.py): a copy of the
model's weights, batch-norm statistics too, on its devices, taken at the last evaluation step whose
pass stopped early and saved in the run's checkpoints."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from wide_tf.engine import timing


class Snapshot:
    """A copy of the model's weights (all of them, batch-norm statistics too) on its devices,
    saved in the run's checkpoints so that a resumed run keeps it; `applied()` evaluates it."""

    def __init__(self, model, strategy):
        self.model = model
        with strategy.scope():
            self.saved = _copies(model, "eval_snapshot")
            self.held = _copies(model, "eval_held")
        self._take = _copier(model.weights, self.saved)
        self._hold = _copier(model.weights, self.held)
        self._put = _copier(self.saved, model.weights)
        self._back = _copier(self.held, model.weights)

    def take(self) -> None:
        self._take()

    @contextlib.contextmanager
    def applied(self):
        """The model holds the snapshot's weights inside the block, its own after it."""
        self._hold()
        self._put()
        try:
            yield
        finally:
            self._back()


def _copies(model, name: str) -> list:
    return [tf.Variable(w, trainable=False, name=name) for w in model.weights]


def _copier(sources, targets):
    @tf.function(autograph=False)
    def copy():
        timing.note_trace()
        for s, t in zip(sources, targets):
            t.assign(s)

    return copy
