"""The evaluation economy (engine/evaluation.py): passes over the training set that stop
once no target can be met leave every target's record exactly as whole passes do (every status,
reached, not reached and diverged; a crossing right after a pass that stopped early is
interpolated against the snapshot's whole pass), and a run's seconds are accounted by kind."""

import json
import math

import numpy as np
import pytest
from helpers import small_mlp

from wide_tf.checks import loader
from wide_tf.engine import arrays, base, evaluation, train
from wide_tf.engine.tf import snapshot
from wide_tf.engine.tf import step as steps
from wide_tf.engine.tf.step import WHOLE_PASS
from wide_tf.engine.tf.strategy import setup_runtime
from wide_tf.schema import result_fields
from wide_tf.schema import targets as targets_lib
from wide_tf.study import trials as trials_lib


def _config(**train_overrides):
    train = dict(
        global_batch=32,
        max_epochs=4.0,
        eval_every_examples=160,
        eval_batch=64,  # 23 batches: a pass can stop early at many points
        steps_per_loop=5,
    )
    return small_mlp(**dict(train, **train_overrides))


def _record(r: dict) -> tuple:
    """Everything the analysis reads of a run's targets, and its length and status."""
    targets = [
        (t["metric"], t["value"], t["status"], t["steps_to_target"], t["steps_to_target_interp"])
        for t in r["targets"]
    ]
    return (
        targets,
        r["status"],
        r["steps"],
        r["diverged_at_step"],
        r["evaluations_to_target"],
        r["final"]["train_accuracy"],
    )


class _Spy:
    """Counts the passes that stopped early and the snapshot's evaluations, with every pass the
    host's (no span: tests/engine/test_span.py holds a span's records to the host's)."""

    def __init__(self, monkeypatch):
        self.stopped = self.snapshots = 0
        monkeypatch.setattr(base.BaseTrainer, "span", lambda self, *args: None)
        original = steps.Stepper.evaluate

        def evaluate(stepper, dataset, bound=None):
            out = original(stepper, dataset, bound)
            self.stopped += out is None
            return out

        monkeypatch.setattr(steps.Stepper, "evaluate", evaluate)
        applied = snapshot.Snapshot.applied

        def counted(snap):
            self.snapshots += 1
            return applied(snap)

        monkeypatch.setattr(snapshot.Snapshot, "applied", counted)


def _both(tmp_path, monkeypatch, name, **overrides):
    train.clear_cache()
    whole = train.train_and_evaluate(
        _config(eval_economy=False, **overrides), str(tmp_path / f"{name}_whole")
    )
    spy = _Spy(monkeypatch)
    train.clear_cache()
    cut = train.train_and_evaluate(_config(**overrides), str(tmp_path / f"{name}_cut"))
    monkeypatch.undo()
    return whole, cut, spy


CASES = {
    # reached on accuracy, with extra targets on the loss and a higher accuracy
    "reached": dict(
        target_value=0.9, extra_targets=["train_accuracy:0.95", "train_loss:0.25"], max_epochs=6.0
    ),
    # a target never met: every pass may stop early, the run trains to its budget
    "not_reached": dict(target_value=0.9, extra_targets=["train_accuracy:0.9999"], max_epochs=2.0),
    # a run that trains on after its targets (stop_at_target off): nothing left to meet
    "trains_on": dict(target_value=0.8, stop_at_target=False, max_epochs=2.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_target_is_recorded_exactly_as_with_whole_passes(tmp_path, monkeypatch, case):
    whole, cut, spy = _both(tmp_path, monkeypatch, case, **CASES[case])
    assert _record(cut) == _record(whole)
    assert spy.stopped > 0  # the economy did cut passes short (its seconds: the bench's business)


def test_a_diverged_run_is_recorded_as_before(tmp_path, monkeypatch):
    config_lr = dict(target_value=0.9, extra_targets=["train_loss:0.1"], diverge_loss=50.0)
    train.clear_cache()
    a = _config(eval_economy=False, **config_lr)
    a.optim.base_lr = 1e4
    whole = train.train_and_evaluate(a, str(tmp_path / "w"))
    train.clear_cache()
    b = _config(**config_lr)
    b.optim.base_lr = 1e4
    cut = train.train_and_evaluate(b, str(tmp_path / "c"))
    assert whole["status"] == cut["status"] == "diverged"
    assert _record(cut)[:5] == _record(whole)[:5]


def test_a_crossing_after_a_pass_cut_short_is_interpolated_against_the_snapshot(
    tmp_path, monkeypatch
):
    # A loss target: the pass at the evaluation before the crossing, whose mean loss (0.311) is a
    # little above the target, stops once its partial sum passes target x n, before the last of
    # its 90 batches of 16 (no curve evaluation in between: those are whole).
    whole, cut, spy = _both(
        tmp_path,
        monkeypatch,
        "loss",
        target_metric="train_loss",
        target_value=0.3,
        eval_batch=16,
        curve_every_examples=160_000,
        max_epochs=8.0,
    )
    assert whole["status"] == "reached"
    assert spy.snapshots >= 1
    assert _record(cut) == _record(whole)
    assert cut["steps_to_target_interp"] == whole["steps_to_target_interp"]
    assert cut["steps_to_target_interp"] < cut["steps_to_target"]


def test_the_test_set_is_evaluated_for_the_curves_and_at_the_end(tmp_path):
    train.clear_cache()
    config = _config(target_value=0.9999, max_epochs=2.0, curve_every_examples=640)
    r = train.train_and_evaluate(config, str(tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    with_test = [row["step"] for row in rows if "test_accuracy" in row]
    assert with_test[0] == 0 and with_test[-1] == r["steps"]
    curve = [s for s in (math.ceil(k * 640 / 32) for k in range(1, 10)) if s < r["steps"]]
    assert set(curve) <= set(with_test)
    assert r["final"]["test_accuracy"] is not None and r["best_test_accuracy"] is not None


def test_the_bound_is_the_exact_edge_of_meeting_each_target():
    n = 1437
    for value in (0.5, 0.9, 0.95, 0.97, 0.99, 1.0, 0.123456):
        lo, hi = evaluation.bound([("train_accuracy", value)], n)
        assert hi == -math.inf
        assert targets_lib.met("train_accuracy", value, lo / n)
        assert not targets_lib.met("train_accuracy", value, (lo - 1) / n)
    for value in (0.3, 0.05, 1.2345):
        _, hi = evaluation.bound([("train_loss", value)], n)
        assert float(np.float32(hi)) == hi and hi / n <= value
        assert float(np.nextafter(np.float32(hi), np.float32(np.inf))) / n > value
    # The easiest unreached target sets the bound; none: the pass stops at once.
    lo, _ = evaluation.bound([("train_accuracy", 0.99), ("train_accuracy", 0.95)], n)
    assert lo == evaluation.bound([("train_accuracy", 0.95)], n)[0]
    assert evaluation.bound([], n) == (math.inf, -math.inf)
    assert WHOLE_PASS == (-math.inf, math.inf)


def test_a_run_accounts_for_its_seconds_by_kind(tmp_path):
    train.clear_cache()
    config = _config(target_value=0.9, gradient_every_examples=320, gradient_at_init=True)
    config.train.probe_size = 128
    runtime = setup_runtime(config.runtime)
    r = train.train_and_evaluate(config, str(tmp_path), runtime)
    t = r["time_s"]
    assert list(t) == list(result_fields.TIME_KINDS)
    assert all(v >= 0 for v in t.values())
    assert t["compile"] > 0 and t["train"] > 0 and t["eval"] > 0 and t["probe"] > 0
    inside = sum(v for k, v in t.items() if k != "setup")
    assert inside == pytest.approx(r["wall_time_s"], abs=0.01)
    # A second run of the same key traces nothing: no compile time.
    again = train.train_and_evaluate(config, str(tmp_path / "again"), runtime)
    assert again["time_s"]["compile"] == 0


def test_every_run_of_the_smoke_study_is_recorded_as_with_whole_passes(tmp_path):
    config = loader.load_config("configs/mlp.py:smoke")
    info = arrays.dataset_info(config.data)
    runtime = setup_runtime(config.runtime)  # one for all: each new one builds everything anew
    for k, trial in enumerate(trials_lib.expand(config, info.num_classes, info.input_shape)):
        records = []
        for economy in (False, True):
            cfg = trial.config.copy_and_resolve_references()
            cfg.train.eval_economy = economy
            records.append(
                train.train_and_evaluate(
                    cfg, str(tmp_path / f"{k}_{economy}"), runtime, trial=trial.meta()
                )
            )
        assert _record(records[0]) == _record(records[1]), trial.trial_id


def test_only_the_smallest_batch_probes_along_training_unless_asked():
    config = loader.load_config("configs/mlp.py:local")
    info = arrays.dataset_info(config.data)
    trials = trials_lib.expand(config, info.num_classes, info.input_shape)
    smallest = min(config.sweep.batch_sizes)
    every = config.train.gradient_every_examples
    assert every > 0
    for t in trials:
        want = every if t.batch_size == smallest else 0
        assert t.config.train.gradient_every_examples == want
        assert t.config.train.gradient_at_init
    config.sweep.probe_batches = "all"
    trials = trials_lib.expand(config, info.num_classes, info.input_shape)
    assert {t.config.train.gradient_every_examples for t in trials} == {every}


@pytest.mark.parametrize("unreached, held", [([("train_accuracy", 0.9)], 1), ([], 0)])
def test_a_pass_cut_short_is_held_only_while_a_target_is_left(unreached, held):
    """The snapshot is read only when a later evaluation meets an unreached target: a run that
    trains on after its last target (stop_at_target=False) takes none."""
    from types import SimpleNamespace

    from wide_tf.engine.state import RunState

    calls = []
    evaluator = SimpleNamespace(
        examples={"train": 100},
        evaluate=lambda step, sets, bound, snapshot: None,  # every pass stops early
        hold=lambda: calls.append("hold"),
    )
    targets = SimpleNamespace(
        primary=("train_accuracy", 0.9), extra=[], unreached=lambda st: unreached
    )
    plan = SimpleNamespace(eval_economy=True, curve_steps=frozenset(), eval_steps=(5, 10))
    economy = evaluation.Economy(evaluator, targets, plan)
    st = RunState()
    st.step = 5
    assert economy.evaluate(st) is None and st.cut_short_step == 5
    assert len(calls) == held
