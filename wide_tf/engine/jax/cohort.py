"""Owns JAX's cohort call: the training calls of several runs of one kept build (one (member,
batch) cell: engine/jax/run.py's `_Build`) made as ONE compiled program with a leading run axis,
`jax.vmap` of the stepper's own update (engine/jax/step.JaxStepper._body) over the runs' stacked
states. The shared lockstep (engine/cohort.py) decides when; this module does the arithmetic.

Per run, as alone: its parameters, optimizer state (LARS's trust ratios are computed per run under
vmap), batch-norm statistics, divergence flag, schedule numbers, threshold and seed (the `hyper`
dict, stacked), and its data order (its own TrainOrder's index block). Shared: the training set on
the devices (in_axes None) and the compiled program. A run asking fewer steps than the call's most
is held still on the steps past its own by a mask applied after `_body` (state and sums kept, as
`_body` keeps a diverged run's), so a cohort resumed with its runs at different steps needs
nothing else. The update itself is `_body` unchanged, shard_map included: vmap of a shard_map over
the 1-D device mesh batches each replica's step (checked on one and on two devices).

The run's state stays in its own holder (engine/jax/run.py's `_Holder`), which its Evaluator reads
and its Checkpointer saves and restores (one slice each, today's .npz): the call stacks the states
(once; reused while every holder still holds the slice the last call gave it) and hands each
holder its slice back.

Compaction: a run leaves when it ends, and the call stacks the live runs only, padded to the
next program size (the cohort's K, then the powers of two from 2 below it) with masked copies of a
live run; a lone live run trains through its own Trainer's call (the program of runs alone, which
the cell compiles anyway for its rounds of one run). Each run count is a program of its own, and
each costs a compilation: measured here (2 shared CPU cores, local MLP study cells, mlp-d12 at
batch 32, K = 4) 1.2 s for the vmapped step and 0.5 s for stacking and slicing, 2-6 s per size
in all under load, against 4-50 ms for a call of 4 steps once compiled and 1-10 s for a whole run
of the local study. A program per distinct K (6, 5, 4, 3, 2 as a grid's runs end) would cost
more than the cohort saves; the sizes cap them at log2(K) + 1 per cell, at the price of at most
twice the arithmetic on the tail. The programs are kept with the build (`_FUNCTIONS`), so the next
cohort of the cell reuses the sizes it shares."""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np

from wide_tf.engine import timing

# The compiled functions of a build's cohorts, kept with the build (dropped with it).
_FUNCTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


class _Functions:
    """A stepper's vmapped step, closing, device loop, stacking and slicing (jit: one program per
    run count)."""

    def __init__(self, stepper):
        self.stepper = stepper
        self.step = jax.jit(jax.vmap(self._masked, in_axes=(0, 0, None, 0, 0, 0, 0)))
        self.finish = jax.jit(self._finish)
        self.loop = jax.jit(self._loop)
        self.stack = jax.jit(_stack)

    def _masked(self, state, acc, data, index, epochs, hyper, active):
        """One run's update (`_body`), or nothing where this step is past the run's own."""
        timing.note_trace()
        new, sums = self.stepper._body(state, acc, data, index, epochs, hyper)
        keep = lambda a, b: jnp.where(active, a, b)  # noqa: E731
        return jax.tree.map(keep, new, state), jax.tree.map(keep, sums, acc)

    def _loop(self, state, acc, data, index, epochs, hyper, counts, most):
        """The device loop (GPU, TPU): `most` masked steps of every run in one program, then
        `_finish`'s outputs."""
        timing.note_trace()
        batched = jax.vmap(self._masked, in_axes=(0, 0, None, 0, 0, 0, 0))

        def body(i, carry):
            state, acc = carry
            return batched(state, acc, data, index[:, i], epochs[:, i], hyper, i < counts)

        state, acc = jax.lax.fori_loop(0, most, body, (state, acc))
        return state, self._finish(state, acc, hyper)

    def _finish(self, state, acc, hyper):
        """(the runs' closing outputs, their divergence flags, each run's state sliced out): one
        program, since each program size compiles every function it calls."""
        timing.note_trace()
        out = jax.vmap(self.stepper._closing)(state, acc, hyper)
        k = state["diverged"].shape[0]
        slices = [jax.tree.map(lambda x, i=i: x[i], state) for i in range(k)]
        return out, state["diverged"], slices


class Cohort:
    """The shared training call of `trainers` (engine/jax/run.Trainer, one kept build): `train`
    is engine/cohort.run's `call`."""

    def __init__(self, trainers: list):
        build = trainers[0].build
        if any(t.build is not build for t in trainers):
            raise ValueError("a cohort's runs share one build (one member and batch size)")
        self.trainers, self.build = trainers, build
        k = len(trainers)
        self.sizes = sorted({k} | {2**j for j in range(1, k.bit_length()) if 2**j < k})
        self.stepper = build.stepper
        self.fns = _FUNCTIONS.get(build)
        if self.fns is None:
            self.fns = _FUNCTIONS[build] = _Functions(self.stepper)
        self._sums = jax.device_get(self.stepper._initial_sums())
        self._held = None  # (the states the last call handed out, their stacked form)
        self._hyper = None  # (the runs, their stacked hyper)

    def _states(self, runs: list, size: int):
        """The runs' stacked states, padded to `size` with the first run's (masked): the last
        call's stacked arrays while each run's holder still holds the slice it was given in the
        same place (no checkpoint restored, no run left), else stacked anew."""
        states = [t.holder.state for t in runs]
        held = self._held
        if held is not None and len(held[0]) == size:
            if all(a is b for a, b in zip(held[0], states)):
                return held[1]
        return self.fns.stack(states + [states[0]] * (size - len(runs)))

    def _hypers(self, runs: list, size: int):
        key = [id(t) for t in runs] + [size]
        if self._hyper is None or self._hyper[0] != key:
            padded = runs + [runs[0]] * (size - len(runs))
            self._hyper = (key, _stack([t.hyper for t in padded]))
        return self._hyper[1]

    def train(self, requests: list[tuple[int, int]]) -> list[dict]:
        """Each request (run, steps) trained from its run's state and step; its device sums."""
        runs = [self.trainers[i] for i, _ in requests]
        if len(runs) == 1:  # a lone run: its own call, the program compiled for runs alone
            self._held = None
            return [runs[0]._call(requests[0][1])()]
        size = min(s for s in self.sizes if s >= len(runs))
        # The padding's slots ask no steps: held still, their outputs dropped.
        counts = np.asarray([n for _, n in requests] + [0] * (size - len(runs)), np.int32)
        most = int(counts.max())
        host_loop = self.stepper.host_loop
        # The device loop's block keeps one shape for every call of a plan (steps_per_loop rows),
        # so that it compiles once; the host loop reads the rows it runs.
        rows = most if host_loop else max(most, max(int(t.plan.steps_per_loop) for t in runs))
        index = np.zeros((size, rows, runs[0].plan.batch), np.int32)
        epochs = np.zeros_like(index)
        for k, (t, n) in enumerate(zip(runs, counts)):
            index[k, :n], epochs[k, :n] = t.order.take(t.state.step, int(n))
        state, hyper = self._states(runs, size), self._hypers(runs, size)
        data = self.build.train_data
        acc = {k: np.full(size, v, np.float32) for k, v in self._sums.items()}
        if host_loop:  # steps dispatched from here, as JaxStepper.train does on a CPU (step.py)
            active = np.arange(rows)[None, :] < counts[:, None]
            for i in range(most):
                state, acc = self.fns.step(
                    state, acc, data, index[:, i], epochs[:, i], hyper, active[:, i]
                )
            out, diverged, slices = self.fns.finish(state, acc, hyper)
        else:
            state, (out, diverged, slices) = self.fns.loop(
                state, acc, data, index, epochs, hyper, counts, np.int32(most)
            )
        for t, s in zip(runs, slices):
            t.holder.state = s
        self._held = (slices, state)
        out, diverged = jax.device_get((out, diverged))
        answers = []
        for k in range(len(runs)):
            scalars = {name: float(v[k]) for name, v in out.items()}
            scalars["diverged"] = bool(diverged[k])
            scalars["iteration"] = int(out["iteration"][k])
            answers.append(scalars)
        return answers


def make(trainers: list):
    """The shared call of a cohort of `trainers` (engine/cohort.run's `call`)."""
    return Cohort(trainers).train
