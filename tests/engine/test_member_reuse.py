"""A study's groups of one member follow each other: the next batch size keeps the member's model,
optimizer, evaluation sets, probe and snapshot (their traced functions); an MLP on one CPU replica
its Stepper and stream too, the batch a variable of their traces, else a new Stepper for the
batch's shapes (engine/tf/reuse.py); and it records exactly what a fresh build records."""

import pytest
from helpers import probed_mlp

from wide_tf.engine import timing, train
from wide_tf.engine.tf import reuse
from wide_tf.engine.tf.strategy import setup_runtime


def _config(batch: int, **train):
    return probed_mlp(**train, global_batch=batch, max_epochs=2.0)


def _key(r: dict) -> tuple:
    return tuple(
        (t["status"], t["steps_to_target"], t["steps_to_target_interp"]) for t in r["targets"]
    ) + (r["steps"], r["final"]["train_accuracy"], r["final"]["test_loss"])


@pytest.mark.parametrize("micro", [False, True], ids=["open-batch", "micro-batches"])
def test_the_next_batch_of_a_member_keeps_its_build_and_records_the_same(
    tmp_path, monkeypatch, micro
):
    """One CPU replica: the Stepper, its stream and traces serve the next batch, nothing is traced
    again. Micro-batches (the batch's shape in the step's reshapes): a new Stepper, its training
    loop the one trace."""
    cap = {"max_device_batch": 16} if micro else {}
    runtime = setup_runtime(_config(32, **cap).runtime)
    train.clear_cache()
    train.train_and_evaluate(_config(32, **cap), str(tmp_path / "b32"), runtime)
    (first,) = reuse._BUILT.values()
    model, eval_sets, stepper = first.model, first.eval_sets, first.stepper
    assert (stepper.open_batch is None) == micro
    traced = []
    monkeypatch.setattr(timing, "note_trace", lambda: traced.append(1))
    kept = train.train_and_evaluate(_config(64, **cap), str(tmp_path / "b64"), runtime)
    (second,) = reuse._BUILT.values()
    assert second is first and second.model is model and second.eval_sets is eval_sets
    assert second.stepper.plan.global_batch == 64
    if micro:
        assert second.stepper is not stepper
        assert len(traced) == 1  # the training loop only: no evaluation, probe or snapshot retrace
    else:
        assert second.stepper is stepper and second._stream.batch == 64
        assert traced == []  # the span (the training loop too) serves batch 64 as it served 32
    monkeypatch.undo()
    train.clear_cache()
    fresh = train.train_and_evaluate(_config(64, **cap), str(tmp_path / "fresh"), runtime)
    assert _key(kept) == _key(fresh)
    assert kept["time_s"]["setup"] < fresh["time_s"]["setup"]


def test_only_an_mlp_on_one_cpu_replica_opens_its_batch():
    """A WRN's convolutions took other steps with the batch open (engine/tf/reuse._open_batch)."""
    from wide_tf.engine.state import BatchPlan
    from wide_tf.schema import defaults

    mlp = _config(32)
    runtime = setup_runtime(mlp.runtime)
    plan = BatchPlan.make(32, 1)
    assert reuse._open_batch(mlp, runtime, plan)
    assert not reuse._open_batch(mlp, runtime, BatchPlan.make(32, 1, max_device_batch=16))
    wrn = defaults.base_config("wrn", "digits_embedded")
    assert not reuse._open_batch(wrn, runtime, plan)
