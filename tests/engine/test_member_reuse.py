"""A study's groups of one member follow each other: the next batch size keeps the member's model,
optimizer, evaluation sets, probe and snapshot (their traced functions), with a new Stepper for
the batch's shapes (engine/tf/reuse.py), and records exactly what a fresh build records."""

from helpers import small_mlp

from wide_tf.engine import timing, train
from wide_tf.engine.tf import reuse
from wide_tf.engine.tf.strategy import setup_runtime


def _config(batch: int):
    return small_mlp(
        global_batch=batch,
        max_epochs=2.0,
        eval_every_examples=320,
        target_value=0.8,
        gradient_every_examples=640,
        gradient_at_init=True,
        probe_size=128,
    )


def _key(r: dict) -> tuple:
    return tuple(
        (t["status"], t["steps_to_target"], t["steps_to_target_interp"]) for t in r["targets"]
    ) + (r["steps"], r["final"]["train_accuracy"], r["final"]["test_loss"])


def test_the_next_batch_of_a_member_keeps_its_build_and_records_the_same(tmp_path, monkeypatch):
    runtime = setup_runtime(_config(32).runtime)
    train.clear_cache()
    train.train_and_evaluate(_config(32), str(tmp_path / "b32"), runtime)
    (first,) = reuse._BUILT.values()
    model, eval_sets, stepper = first.model, first.eval_sets, first.stepper
    traced = []
    monkeypatch.setattr(timing, "note_trace", lambda: traced.append(1))
    kept = train.train_and_evaluate(_config(64), str(tmp_path / "b64"), runtime)
    (second,) = reuse._BUILT.values()
    assert second is first and second.model is model and second.eval_sets is eval_sets
    assert second.stepper is not stepper and second.stepper.plan.global_batch == 64
    assert len(traced) == 1  # the training loop only: no evaluation, probe or snapshot retrace
    monkeypatch.undo()
    train.clear_cache()
    fresh = train.train_and_evaluate(_config(64), str(tmp_path / "fresh"), runtime)
    assert _key(kept) == _key(fresh)
    assert kept["time_s"]["setup"] < fresh["time_s"]["setup"]
