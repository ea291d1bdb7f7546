"""Several evaluation intervals in one device call (Trainer.span, engine/loop.py): a run whose
intervals run in spans records exactly what it records one interval per host call (every target's
status, steps and interpolated steps, a crossing right after passes cut short interpolated
against the snapshot, a diverged step, the evaluation history), and resumes from a checkpoint
taken between spans to the same record."""

import json

import pytest
from helpers import small_mlp, without

from wide_tf.engine import base, train
from wide_tf.engine.tf import span

TIMINGS = ("wall_time_s", "examples_per_s", "time_s", "provenance", "trial_id")


def _config(**train_overrides):
    train = dict(
        global_batch=48,  # 160 / 48: intervals of 3 and 4 steps
        max_epochs=4.0,
        eval_every_examples=160,
        eval_batch=64,  # 23 batches: a pass can stop early at many points
        steps_per_loop=40,
    )
    return small_mlp(**dict(train, **train_overrides))


def _strip(record):
    return without(record, TIMINGS)


class _Spans:
    """Counts the spans run and the intervals in them."""

    def __init__(self, monkeypatch):
        self.calls = self.intervals = 0
        original = span.run

        def counted(*args, last_pass=True):
            out = original(*args, last_pass=last_pass)
            if last_pass or len(args[4]) > 1:  # a span (one interval alone is a training call)
                self.calls += 1
                self.intervals += out["intervals"]
            return out

        monkeypatch.setattr(span, "run", counted)


def _both(tmp_path, monkeypatch, name, optim=None, **overrides):
    """The run one interval per call (spans off), then in spans: (per interval, spans, counter)."""

    def config():
        c = _config(**overrides)
        for k, v in (optim or {}).items():
            setattr(c.optim, k, v)
        return c

    monkeypatch.setattr(base.BaseTrainer, "span", lambda self, *args: None)
    train.clear_cache()
    single = train.train_and_evaluate(config(), str(tmp_path / f"{name}_single"))
    monkeypatch.undo()
    spans = _Spans(monkeypatch)
    train.clear_cache()
    spanned = train.train_and_evaluate(config(), str(tmp_path / f"{name}_spans"))
    monkeypatch.undo()
    return single, spanned, spans


def _metrics(path) -> list:
    """metrics.jsonl's rows (the evaluations: the history) without their timings."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [_strip(r) for r in rows]


CASES = {
    "reached": dict(
        target_value=0.9, extra_targets=["train_accuracy:0.95", "train_loss:0.25"], max_epochs=6.0
    ),
    "not_reached": dict(target_value=0.9, extra_targets=["train_accuracy:0.9999"], max_epochs=2.0),
    # the gradient probe every two intervals: its interval's pass is the host's, after the probe
    "probe": dict(
        target_value=0.9,
        gradient_at_init=True,
        gradient_every_examples=320,
        probe_size=128,
        max_epochs=3.0,
    ),
    # the loss target: the pass before the crossing stops early, so the crossing is
    # interpolated against the snapshot the span held on the device
    "snapshot": dict(
        target_metric="train_loss",
        target_value=0.3,
        eval_batch=16,
        curve_every_examples=160_000,
        max_epochs=8.0,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_in_spans_records_what_it_records_one_interval_at_a_time(tmp_path, monkeypatch, case):
    single, spanned, spans = _both(tmp_path, monkeypatch, case, **CASES[case])
    assert json.dumps(_strip(spanned), sort_keys=True) == json.dumps(_strip(single), sort_keys=True)
    assert spans.calls > 0 and spans.intervals > spans.calls  # several intervals a call
    assert _metrics(tmp_path / f"{case}_spans" / "metrics.jsonl") == _metrics(
        tmp_path / f"{case}_single" / "metrics.jsonl"
    )
    if case == "snapshot":
        assert spanned["status"] == "reached"
        assert spanned["steps_to_target_interp"] < spanned["steps_to_target"]


def test_a_step_diverging_inside_a_span_is_recorded_as_one_interval_at_a_time(
    tmp_path, monkeypatch
):
    single, spanned, spans = _both(
        tmp_path,
        monkeypatch,
        "diverged",
        # the rate warms up to 12 over 4 epochs: the loss passes 50 at step 28, mid-span
        optim=dict(base_lr=12.0, warmup_epochs=4.0),
        target_value=0.99,
        diverge_loss=50.0,
        curve_every_examples=160_000,
    )
    assert single["status"] == spanned["status"] == "diverged"
    assert spanned["diverged_at_step"] == single["diverged_at_step"] > 10
    assert json.dumps(_strip(spanned), sort_keys=True) == json.dumps(_strip(single), sort_keys=True)
    assert spans.calls > 0


def test_the_seconds_of_a_span_go_to_training_and_evaluation(tmp_path, monkeypatch):
    _, spanned, spans = _both(tmp_path, monkeypatch, "seconds", **CASES["reached"])
    t = spanned["time_s"]
    assert spans.calls > 0 and t["train"] > 0 and t["eval"] > 0
    inside = sum(v for k, v in t.items() if k != "setup")
    assert inside == pytest.approx(spanned["wall_time_s"], abs=0.01)


def test_a_run_stopped_between_spans_resumes_to_the_same_record(tmp_path, monkeypatch):
    """A checkpoint after every host call (a span's end among them), the run stopped after its
    third span as if preempted, then resumed in a fresh build: the uninterrupted run's record."""
    overrides = dict(CASES["snapshot"], checkpoint_every_steps=1)
    train.clear_cache()
    whole = train.train_and_evaluate(_config(**overrides), str(tmp_path / "whole"))

    class Stop(Exception):
        pass

    original, count = span.run, [0]

    def stopping(*args, last_pass=True):
        count[0] += last_pass
        if count[0] == 4:
            raise Stop
        return original(*args, last_pass=last_pass)

    monkeypatch.setattr(span, "run", stopping)
    train.clear_cache()
    with pytest.raises(Stop):
        train.train_and_evaluate(_config(**overrides), str(tmp_path / "cut"))
    monkeypatch.undo()
    train.clear_cache()
    resumed = train.train_and_evaluate(_config(**overrides), str(tmp_path / "cut"))
    keep = ("targets", "status", "steps", "steps_to_target", "steps_to_target_interp", "final")
    assert {k: _strip(resumed[k]) for k in keep} == {k: _strip(whole[k]) for k in keep}
