"""JAX checkpoints are keyed by variable path, not by position: a build that lists its variables
in another order (or whose optimizer got another auto name, sgd_1 for sgd) restores each value to
its own variable, and a checkpoint of other variables is refused in one line naming them."""

from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("jax")

from wide_tf.engine.jax import run as jax_run  # noqa: E402
from wide_tf.engine.state import RunState  # noqa: E402


def _var(path):
    return types.SimpleNamespace(path=path)


# A functional model's paths: layer / variable (the model's own name is not in them).
TRAINABLE = ["dense_0/kernel", "dense_0/bias", "logits/kernel", "logits/bias"]
NON_TRAINABLE = ["norm_0/moving_mean", "norm_0/moving_variance"]


def _build(order, optimizer_name):
    def ordered(paths):
        return [_var(p) for p in (paths[::-1] if order == "reversed" else paths)]

    opt = [f"{optimizer_name}/iteration", f"{optimizer_name}/learning_rate"]
    opt += [f"{optimizer_name}/{p.replace('/', '_')}_momentum" for p in TRAINABLE]
    stepper = types.SimpleNamespace(
        model=types.SimpleNamespace(
            trainable_variables=ordered(TRAINABLE), non_trainable_variables=ordered(NON_TRAINABLE)
        ),
        # the iteration counter first, then in the given order
        optimizer=types.SimpleNamespace(
            name=optimizer_name, variables=[_var(opt[0])] + ordered(opt[1:])
        ),
        replicated=None,
        _iterations=0,
    )
    return types.SimpleNamespace(stepper=stepper)


def _values(build):
    """A distinct array per variable, from its path alone (so any order gives the same map)."""
    names = jax_run.Checkpointer(build, None, "unused", True, None).names()

    def value(group, name):
        return np.full((2,), float(sum(map(ord, group + name))), np.float32)

    state = {g: [value(g, n) for n in names[g]] for g in jax_run.GROUPS}
    state["optimizer"][0] = np.asarray(7, np.int64)  # the iteration counter: step 7
    return state, names


def test_a_checkpoint_restores_by_name_across_a_change_of_variable_order(tmp_path):
    saved_build = _build("given", "sgd")
    state, names = _values(saved_build)
    holder = types.SimpleNamespace(state={**state, "diverged": np.asarray(False)}, snapshot=None)
    holder.snapshot = (state["trainable"], state["non_trainable"])
    logged = []
    saver = jax_run.Checkpointer(saved_build, holder, str(tmp_path), True, logged.append)
    saver.save(RunState(step=7))

    # Another process: the same model, its variables listed the other way round, the optimizer
    # built second in that process (sgd_1).
    other = _build("reversed", "sgd_1")
    holder2 = types.SimpleNamespace(state=None, snapshot=None)
    loader = jax_run.Checkpointer(other, holder2, str(tmp_path), True, lambda *a: logged.append(a))
    restored = loader.load()
    assert restored.step == 7
    want, other_names = _values(other)  # each variable's own value, in the new order
    assert other_names["trainable"] == names["trainable"][::-1]
    for g in jax_run.GROUPS:
        got = [np.asarray(v) for v in holder2.state[g]]
        assert len(got) == len(want[g])
        for a, b in zip(got, want[g]):
            np.testing.assert_array_equal(a, b)
    for part, g in zip(holder2.snapshot, ("trainable", "non_trainable")):
        for a, b in zip(part, want[g]):
            np.testing.assert_array_equal(np.asarray(a), b)


def test_a_checkpoint_of_other_variables_is_named(tmp_path):
    build = _build("given", "sgd")
    state, _ = _values(build)
    holder = types.SimpleNamespace(state={**state, "diverged": np.asarray(False)}, snapshot=None)
    jax_run.Checkpointer(build, holder, str(tmp_path), True, print).save(RunState(step=3))
    wider = _build("given", "sgd")
    wider.stepper.model.trainable_variables.append(_var("dense_1/kernel"))
    holder2 = types.SimpleNamespace(state=None, snapshot=None)
    with pytest.raises(jax_run.CheckpointMismatch, match="missing dense_1/kernel"):
        jax_run.Checkpointer(wider, holder2, str(tmp_path), True, print).load()
    with pytest.raises(jax_run.CheckpointMismatch, match="share a path"):
        jax_run.variable_names([_var("a/kernel"), _var("a/kernel")])
