"""Owns the engine's timing: every training call, evaluation, probe measurement and checkpoint of a
run is timed into the run's account (RunState.time_s, by kind; a call during which a function was
traced counts as "compile"), and whoever listens (the bench) is told of each one, so that nothing
outside the engine has to patch it to time it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from wide_tf.schema import result_fields

# What is timed, as the `kind` of an event: a run's start and end ("trial", "trial_end": zero
# seconds, to mark the run's span), a host call of the training loop ("train", count: the steps it
# ran), one evaluation set's pass ("eval", count: its examples), one gradient-probe measurement
# ("probe", count: its examples) and one checkpoint ("checkpoint", count: the step).
KINDS = ("trial", "trial_end", "train", "eval", "probe", "checkpoint")
# A run's account (result.json's "time_s"): the timed kinds, "compile" (a timed call that traced a
# function: the first call of each compiled function, whose time is mostly tracing and XLA), the
# run's set-up before its loop (model, optimizer and data sets built or reset), and what the loop
# spent outside all of these ("other": the host loop, the data stream's start, summaries).
ACCOUNT = result_fields.TIME_KINDS

# A listener gets (kind, start, seconds, count); start is time.perf_counter()'s.
Listener = Callable[[str, float, float, int], None]

_listeners: list[Listener] = []
_traces = 0  # functions traced so far in this process (note_trace)


def note_trace() -> None:
    """Called from the Python body of every compiled function: it runs only while tracing, so a
    timed call during which this ran traced (and, under XLA, compiled) something."""
    global _traces
    _traces += 1


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
def timed(kind: str, account: dict | None = None) -> Iterator[dict]:
    """Times the block into `account` (kind -> seconds; "compile" if the block traced a function)
    and tells the listeners; the block may set out["count"] (steps, examples) before it ends."""
    if account is None and not _listeners:
        yield {}
        return
    out = {"count": 0}
    traces, start = _traces, time.perf_counter()
    yield out
    seconds = time.perf_counter() - start
    if account is not None:
        key = "compile" if _traces != traces else kind
        account[key] = account.get(key, 0.0) + seconds
    if _listeners:
        _emit(kind, start, seconds, int(out["count"]))


def traces() -> int:
    """The functions traced so far in this process: a block that changed it traced (compiled)."""
    return _traces


def shared(kind: str, account: dict, seconds: float, count: int, traced: bool) -> None:
    """One run's share of a block timed for several runs together (a cohort's training call,
    engine/cohort.py): `seconds` into `account` as `kind` ("compile" when the block `traced`), and
    the listeners told of it as `timed` tells them, once per run (a fence checks each run)."""
    add(account, "compile" if traced else kind, seconds)
    if _listeners:
        _emit(kind, time.perf_counter() - seconds, seconds, int(count))


def add(account: dict, kind: str, seconds: float) -> None:
    """`seconds` of `kind` into `account` (e.g. the set-up, timed before the account exists)."""
    account[kind] = account.get(kind, 0.0) + float(seconds)


def split(account: dict, seconds: dict, shares: dict) -> None:
    """Adds a timed block's `seconds` (what `timed` put in a scratch account: one kind, or
    "compile") to `account`, its one kind divided among `shares` (kind -> fraction, summing to 1);
    a block that traced stays "compile" whole."""
    for kind, value in seconds.items():
        if kind == "compile":
            add(account, kind, value)
        else:
            for k, share in shares.items():
                add(account, k, value * share)


def settle(account: dict, wall_s: float) -> dict:
    """The account in ACCOUNT's order, rounded to ms, with "other": the loop's wall time less
    every timed kind in it (the set-up runs before the loop's clock starts)."""
    inside = sum(v for k, v in account.items() if k not in ("setup", "other"))
    full = {k: float(account.get(k, 0.0)) for k in ACCOUNT if k != "other"}
    full["other"] = max(0.0, float(wall_s) - inside)
    return {k: round(full[k], 3) for k in ACCOUNT}


def _emit(kind: str, start: float, seconds: float, count: int) -> None:
    for listener in list(_listeners):
        listener(kind, start, seconds, count)
