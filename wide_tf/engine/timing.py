"""Owns the engine's timing hook: whoever listens (the bench) is told how long every training call,
evaluation, probe measurement and checkpoint of a run took, so that nothing outside the engine has
to patch it to time it. No listener (the normal case): nothing is timed or recorded."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

# What is timed, as the `kind` of an event: a run's start and end ("trial", "trial_end": zero
# seconds, to mark the run's span), a host call of the training loop ("train", count: the steps it
# ran), one evaluation set's pass ("eval", count: its examples), one gradient-probe measurement
# ("probe", count: its examples) and one checkpoint ("checkpoint", count: the step).
KINDS = ("trial", "trial_end", "train", "eval", "probe", "checkpoint")

# A listener gets (kind, start, seconds, count); start is time.perf_counter()'s.
Listener = Callable[[str, float, float, int], None]

_listeners: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """`listener` hears every event until the block ends."""
    _listeners.append(listener)
    try:
        yield listener
    finally:
        _listeners.remove(listener)


def mark(kind: str, count: int = 0) -> None:
    """An instant (zero seconds) event: a run starts or ends."""
    if _listeners:
        _emit(kind, time.perf_counter(), 0.0, count)


@contextlib.contextmanager
def timed(kind: str) -> Iterator[dict]:
    """Times the block; the block may set out["count"] (steps, examples) before it ends."""
    if not _listeners:
        yield {}
        return
    out = {"count": 0}
    start = time.perf_counter()
    yield out
    _emit(kind, start, time.perf_counter() - start, int(out["count"]))


def _emit(kind: str, start: float, seconds: float, count: int) -> None:
    for listener in list(_listeners):
        listener(kind, start, seconds, count)
