"""Owns the lockstep of a cohort: several runs of one (member, batch) cell, each driven by its own
unchanged Controller (engine/loop.py) with its own Evaluator and Checkpointer, whose training calls
are made together by the backend's cohort call (engine/jax/cohort.py: one compiled program with a
leading run axis). Shared by every backend that offers a cohort (engine/backend.py's `cohort`).

The design: one thread per run, and a baton, so that exactly one of them (or the driver) runs at a
time. A run's thread holds the baton from one training call to the next (its evaluation, probe,
checkpoints, summaries and, at the end, its result record: everything its Controller does alone);
its Trainer is a `Member`, whose `train(n)` hands the baton back with "n steps, please". Once every
live run has asked (or ended), the driver makes ONE backend call for all of them, runs asking
fewer steps than the most held still for the rest (the step mask), and hands each run its own
numbers back. Every per-run guarantee of a run trained alone holds by construction: the Controller,
the evaluation economy, the targets, the checkpoints and the record are those of a run alone, and
only the arithmetic of the update is batched. Threads rather than a rewrite of the Controller as a
coroutine: the Controller stays the one driver of a run; the baton keeps the threads from ever
running together, so the order of every log line, file and timing event is fixed.

A run leaves the cohort when its Controller returns (target, divergence, budget): the next call
is asked of the live runs only (a program per run count costs a compilation: engine/jax/cohort.py
pads to a few sizes and says what each costs). An exception in a run (a preemption, a lost
claim, an error) lets the rest of that round take their turns (at a SIGTERM every run checkpoints
at the same call and stops), then every run still waiting for a call is ended where it waits, its
last checkpoint kept, and the first exception is raised: resuming repeats at most the steps since
those checkpoints.

Time: each run's account (RunState.time_s) gets its own host work as a run alone does, and a share
of each shared call in proportion to the steps it asked for (all of a cell's runs ask the same in
the common case: equal shares), so the runs' accounts add up to the cohort's wall time. Each run's
wall clock (RunState.wall_time_s, the checkpoints' cadence) is a `TurnClock`: the seconds it held
the baton plus its shares, not the other runs' turns."""

from __future__ import annotations

import threading
import time

from wide_tf.engine import timing
from wide_tf.engine.interface import HostCall


class _Abandoned(BaseException):
    """Another run of the cohort raised: this one ends where it waits for the shared call (a
    BaseException, so that nothing in the run's own code takes it for an error of its own)."""


class TurnClock:
    """A run's own clock in a cohort: the seconds its thread held the baton, plus its shares of
    the shared calls (time.time's scale, as engine/actions.Checkpoints reads it)."""

    def __init__(self):
        self.origin = time.time()
        self.spent = 0.0
        self.since: float | None = None  # when this run last took the baton; None: not its turn

    def resume(self) -> None:
        self.since = time.perf_counter()

    def pause(self) -> None:
        if self.since is not None:
            self.spent += time.perf_counter() - self.since
            self.since = None

    def add(self, seconds: float) -> None:
        self.spent += seconds

    def __call__(self) -> float:
        running = 0.0 if self.since is None else time.perf_counter() - self.since
        return self.origin + self.spent + running


class _Seat:
    """One run's place in the lockstep: its Controller, thread, baton, request and outcome."""

    def __init__(self, index: int, controller):
        self.index, self.controller = index, controller
        self.go = threading.Semaphore(0)  # the driver hands this run the baton
        self.back = threading.Semaphore(0)  # this run hands it back
        self.asked: int | None = None  # the steps of its pending training call
        self.answer = None  # (device sums, its seconds, whether the call traced)
        self.abandon = False
        self.done = False
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.clock = TurnClock()
        self.thread = threading.Thread(target=self._body, name=f"cohort-run-{index}", daemon=True)

    def _body(self) -> None:
        self.go.acquire()
        self.clock.resume()
        try:
            if self.abandon:
                raise _Abandoned()
            self.result = self.controller.run()
        except _Abandoned:
            pass
        except BaseException as e:  # handed to the driver, which raises it after the round
            self.error = e
        finally:
            self.done = True
            self.clock.pause()
            self.back.release()

    def wait_for_call(self, num_steps: int):
        """From the run's thread: the baton back to the driver with `num_steps` asked; returns the
        shared call's answer for this run once the driver hands the baton back."""
        self.asked, self.answer = int(num_steps), None
        self.clock.pause()
        self.back.release()
        self.go.acquire()
        self.clock.resume()
        if self.abandon:
            raise _Abandoned()
        return self.answer

    def turn(self) -> None:
        """From the driver: this run holds the baton until it asks for a call or ends."""
        self.asked = None
        self.go.release()
        self.back.acquire()


class Member:
    """engine/interface.Trainer of one run in a cohort: the run's own Trainer (restore, probe,
    facts, finish as alone), its training calls made by the cohort's shared call. No spans: a
    span's passes are one run's (the Controller then calls `train` per interval)."""

    def __init__(self, trainer, seat: _Seat):
        self.trainer, self.seat = trainer, seat

    def restore(self, state) -> None:
        self.trainer.restore(state)

    def train(self, num_steps: int) -> HostCall:
        scalars, seconds, traced = self.seat.wait_for_call(num_steps)
        st = self.trainer.state
        timing.shared("train", st.time_s, seconds, int(scalars["steps"]), traced)
        return self.trainer.host_call(scalars, seconds)

    def span(self, lengths, bound, last_pass: bool = True):
        return None

    def measure(self, step: int):
        return self.trainer.measure(step)

    def describe(self):
        return self.trainer.describe()

    def finish(self) -> None:
        self.trainer.finish()


def run(controllers: list, trainers: list, call) -> list[dict]:
    """Trains the runs of `controllers` (each set up alone, engine/train.setup; `trainers` their
    backend Trainers) in lockstep; returns their result records in order. `call(requests)` is the
    backend's shared training call: `requests` a list of (index into `trainers`, steps), its
    answer each request's device sums (as the Trainer's own call returns them)."""
    seats = [_Seat(i, c) for i, c in enumerate(controllers)]
    for seat, controller, trainer in zip(seats, controllers, trainers):
        controller.trainer = Member(trainer, seat)
        # The run's wall clock and checkpoint cadence on its own turns (TurnClock).
        checkpoints = controller.checkpoints
        checkpoints.clock = seat.clock
        checkpoints.wall = checkpoints.last_time = seat.clock()
        seat.thread.start()
    try:
        live = seats
        while live:
            for seat in live:
                seat.turn()
            failed = [s.error for s in live if s.error is not None]
            live = [s for s in live if not s.done]
            if failed:
                raise failed[0]
            if live:
                _shared_call(live, call)
    finally:
        for seat in seats:
            if seat.thread.is_alive():
                seat.abandon = True
                seat.go.release()
                seat.thread.join()
    return [seat.result for seat in seats]


def _shared_call(live: list[_Seat], call) -> None:
    """One backend call for every live run, its seconds shared by the steps each asked for."""
    requests = [(s.index, s.asked) for s in live]
    traces, start = timing.traces(), time.perf_counter()
    answers = call(requests)
    seconds = time.perf_counter() - start
    traced = timing.traces() != traces
    total = sum(s.asked for s in live)
    for seat, sums in zip(live, answers):
        share = seconds * seat.asked / total if total else seconds / len(live)
        seat.clock.add(share)
        seat.answer = (sums, share, traced)
