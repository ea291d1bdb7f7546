"""Targets past the transients: several targets judged on one run's evaluations,
batch-norm statistics recomputed on training data for the evaluations that judge them, the
momentum warm-up, and what result.json says about them."""

import json
import math

import numpy as np
import pytest

from wide_tf.engine import arrays, preemption, train
from wide_tf.engine.models.norm import batch_norm_layers
from wide_tf.engine.result import describe_protocol, momentum_ramp_steps
from wide_tf.engine.state import RunState
from wide_tf.engine.targets import interpolated_crossing
from wide_tf.engine.tf import reuse
from wide_tf.engine.tf.strategy import setup_runtime
from wide_tf.schema import defaults

TARGET_KEYS = {
    "metric",
    "value",
    "status",
    "steps_to_target",
    "steps_to_target_interp",
    "epochs_to_target",
}


def _config(norm="none", depth=1, **train_overrides):
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = depth, 32, norm
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy = "cpu"
    config.train.global_batch = 32
    config.train.max_epochs = 6.0
    config.train.eval_every_examples = 320
    for k, v in train_overrides.items():
        setattr(config.train, k, v)
    return config


EXTRA = ["train_loss:0.2", "test_accuracy:0.9", "train_accuracy:0.95"]


@pytest.fixture(scope="module")
def with_extras(tmp_path_factory):
    config = _config(target_value=0.9, extra_targets=EXTRA)
    folder = tmp_path_factory.mktemp("extras")
    result = train.train_and_evaluate(config, str(folder))
    result["history"] = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return config, result


def test_every_target_is_recorded_primary_first_with_the_top_level_numbers(with_extras):
    config, r = with_extras
    targets = r["targets"]
    assert [(t["metric"], t["value"]) for t in targets] == [("train_accuracy", 0.9)] + [
        (s.split(":")[0], float(s.split(":")[1])) for s in EXTRA
    ]
    assert all(set(t) == TARGET_KEYS for t in targets)
    primary = targets[0]
    assert primary["status"] == r["status"] == "reached"
    for k in ("steps_to_target", "steps_to_target_interp", "epochs_to_target"):
        assert primary[k] == r[k], k
    assert all(t["status"] == "reached" for t in targets)
    for t in targets:
        assert t["epochs_to_target"] == t["steps_to_target"] * 32 / r["num_train"]
        # The interpolated crossing lies in the cadence interval that ends at the recorded step.
        assert t["steps_to_target"] - 10 <= t["steps_to_target_interp"] <= t["steps_to_target"]
    assert r["protocol"]["extra_targets"] == [
        "train_loss <= 0.2",
        "test_accuracy >= 0.9",
        "train_accuracy >= 0.95",
    ]


def test_the_run_stops_at_the_evaluation_that_meets_the_last_target(with_extras):
    config, r = with_extras
    last = max(t["steps_to_target"] for t in r["targets"])
    first = min(t["steps_to_target"] for t in r["targets"])
    assert last > first  # otherwise this test could not tell "the last" from "the primary"
    assert r["steps"] == last


def test_each_crossing_is_the_first_evaluation_that_meets_it_interpolated(with_extras):
    config, r = with_extras
    history = r["history"]  # the run's own metrics.jsonl
    for t in r["targets"]:
        lower = t["metric"].endswith("loss")
        hits = [
            i
            for i, ev in enumerate(history)
            if (ev[t["metric"]] <= t["value"] if lower else ev[t["metric"]] >= t["value"])
        ]
        i = hits[0]
        assert history[i]["step"] == t["steps_to_target"]
        expected = interpolated_crossing(history[i - 1], history[i], t["metric"], t["value"])
        assert t["steps_to_target_interp"] == pytest.approx(expected)


def test_extra_targets_do_not_change_the_primary_result(with_extras, tmp_path):
    config, r = with_extras
    alone = train.train_and_evaluate(_config(target_value=0.9), str(tmp_path))
    for k in ("status", "steps_to_target", "steps_to_target_interp", "epochs_to_target"):
        assert alone[k] == r[k], k
    assert alone["steps"] == alone["steps_to_target"] < r["steps"]
    assert [t["metric"] for t in alone["targets"]] == ["train_accuracy"]


def test_unreached_targets_are_not_reached_and_diverged_runs_mark_them_diverged(tmp_path):
    r = train.train_and_evaluate(
        _config(target_value=0.5, extra_targets=["train_loss:0.0001"], max_epochs=1.0),
        str(tmp_path / "a"),
    )
    assert r["status"] == "reached" and r["diverged_at_step"] is None
    assert [t["status"] for t in r["targets"]] == ["reached", "not_reached"]
    assert r["targets"][1]["steps_to_target"] is None
    assert r["targets"][1]["steps_to_target_interp"] is None
    assert r["targets"][1]["epochs_to_target"] is None
    assert r["steps"] == math.ceil(1437 / 32)  # trained on to the budget for the extra target

    config = _config(extra_targets=["train_loss:0.1"], diverge_loss=100.0)
    config.optim.base_lr = 1e4
    r = train.train_and_evaluate(config, str(tmp_path / "b"))
    assert r["status"] == "diverged" and r["diverged_at_step"] == r["steps"]
    assert [t["status"] for t in r["targets"]] == ["diverged", "diverged"]


def test_a_divergence_after_the_primary_target_keeps_its_crossing(tmp_path):
    """The primary target is reached, then the run (training on for an extra target) diverges:
    the primary stays reached with its numbers; the extra target is marked diverged."""
    config = _config(target_value=0.5, extra_targets=["train_loss:0.0001"], max_epochs=1.0)
    controller, _ = train.setup(config, str(tmp_path), setup_runtime(config.runtime))
    st = controller.restore()
    st.history = [
        {"step": 0, "train_accuracy": 0.1},
        {"step": 10, "train_accuracy": 0.7, "train_loss": 1.0},
    ]
    st.step = 10
    controller.targets.check(st, st.history[-1], st.history[-2])
    st.step, st.diverged_at = 17, 17  # what the Controller records for a diverged loop
    targets = controller.targets.records(st)
    assert targets[0]["status"] == "reached" and targets[0]["steps_to_target"] == 10
    assert targets[0]["steps_to_target_interp"] == pytest.approx(10 * 0.4 / 0.6)
    assert targets[1]["status"] == "diverged"
    assert not controller.running()


def test_resume_keeps_the_crossings_found_before_the_interruption(tmp_path, monkeypatch):
    config = _config(target_value=0.9, extra_targets=EXTRA, checkpoint_every_steps=10)
    config.train.steps_per_loop = 10
    full = train.train_and_evaluate(config, str(tmp_path / "full"))
    first_crossing = min(t["steps_to_target"] for t in full["targets"])
    calls = {"n": 0}

    def requested():  # a SIGTERM after the first crossing, before the last one
        calls["n"] += 1
        return calls["n"] * 10 > first_crossing

    monkeypatch.setattr(preemption, "requested", requested)
    with pytest.raises(preemption.Preempted) as stopped:
        train.train_and_evaluate(config, str(tmp_path / "cut"))
    assert first_crossing <= stopped.value.step < full["steps"]
    monkeypatch.setattr(preemption, "requested", lambda: False)
    resumed = train.train_and_evaluate(config, str(tmp_path / "cut"))
    assert resumed["targets"] == full["targets"]
    assert resumed["steps"] == full["steps"]


def test_run_state_round_trips_the_crossings_and_reads_old_checkpoints():
    st = RunState(step=30, extra_crossings=[[20, 17.5], None], diverged_at=None)
    assert RunState.from_json(st.to_json(), 30) == st
    old = RunState.from_json('{"step": 40, "status": "diverged"}', 40)
    assert old.diverged_at == 40 and old.extra_crossings == []


def test_momentum_ramp_and_evaluation_count_are_recorded(with_extras):
    config, r = with_extras
    assert r["momentum_ramp_steps"] == pytest.approx(10.0)
    # Evaluations every 10 steps: the one at the crossing is the (steps / 10)-th after step 0.
    assert r["evaluations_to_target"] == r["steps_to_target"] // 10
    config.optim.name = "sgd"
    assert momentum_ramp_steps(config.optim) is None
    config.optim.name, config.optim.momentum = "nesterov", 0.99
    assert momentum_ramp_steps(config.optim) == pytest.approx(100.0)


# ---- batch-norm statistics recomputed for the evaluations that judge the target ----------------


def _numpy_mlp_stats(model, x, batch):
    """Per BN layer, the plain average over batches of the batch statistics that a training-mode
    pass of the MLP computes (each layer normalised with its batch's statistics), by hand."""
    layers = {layer.name: layer for layer in model.layers}
    depth = sum(1 for name in layers if name.startswith("norm_"))
    sums = [[0.0, 0.0] for _ in range(depth)]
    batches = len(x) // batch
    for b in range(batches):
        h = x[b * batch : (b + 1) * batch].reshape(batch, -1).astype(np.float64)
        for i in range(1, depth + 1):
            h = h @ layers[f"dense_{i}"].kernel.numpy()
            bn = layers[f"norm_{i}"]
            mean, var = h.mean(0), h.var(0)
            sums[i - 1][0] += mean
            sums[i - 1][1] += var
            h = (h - mean) / np.sqrt(var + bn.epsilon) * bn.gamma.numpy() + bn.beta.numpy()
            h = np.maximum(h, 0.0)
    return [(m / batches, v / batches) for m, v in sums]


@pytest.mark.parametrize("norm", ["batch", "ghost"])
def test_recomputed_statistics_are_the_average_of_the_subsets_batch_statistics(norm, tmp_path):
    config = _config(
        norm=norm,
        depth=2,
        target_bn="recompute",
        target_bn_examples=600,
        target_bn_batch=128 if norm == "batch" else 32,
    )
    config.model.ghost_batch_size = 32
    controller, backend = train.setup(config, str(tmp_path), setup_runtime(config.runtime))
    controller.restore()
    backend.trainer.train(30)  # weights and moving averages away from their initial values
    built = backend.built
    model, sets = built.model, built.eval_sets
    weights = [w.numpy().copy() for w in model.weights]
    slots = [v.numpy().copy() for v in built.optimizer.variables]

    judged = backend.evaluator.evaluate(30)

    # Training is unaffected: weights, moving averages and optimizer state are as they were.
    for before, w in zip(weights, model.weights):
        np.testing.assert_array_equal(before, w.numpy(), err_msg=w.path)
    for before, v in zip(slots, built.optimizer.variables):
        np.testing.assert_array_equal(before, v.numpy())
    # 600 examples in batches of the statistics batch: the last, partial batch is left out.
    recompute = built.bn_recompute
    stat_batch = config.train.target_bn_batch
    assert recompute.examples == 600 // stat_batch * stat_batch
    x, _ = arrays.load_arrays(config.data, "train", limit=600)
    # Ghost batch norm's training statistics are those of its ghost groups: by hand, batches of 32.
    by_hand = _numpy_mlp_stats(model, x[: recompute.examples], 32 if norm == "ghost" else 128)
    norms = batch_norm_layers(model)
    assert len(norms) == 2
    for layer, (mean, var) in zip(norms, by_hand):
        layer.moving_mean.assign(mean.astype(np.float32))
        layer.moving_variance.assign(var.astype(np.float32))
    direct = {k: built.stepper.evaluate(sets[k]) for k in ("train", "test")}
    for k in ("train", "test"):
        assert judged[k].loss == pytest.approx(direct[k]["loss"], rel=1e-4), k
        assert judged[k].accuracy == pytest.approx(direct[k]["accuracy"], abs=1.5 / 1437), k
    # ... and differ from the training run's moving averages (so the test can fail).
    trained = {w.path: value for w, value in zip(model.weights, weights)}
    for layer, (mean, _) in zip(norms, by_hand):
        lag = np.abs(trained[layer.moving_mean.path] - mean).max()
        assert lag > 1e-2 * np.abs(mean).max(), layer.name


def test_recompute_is_recorded_and_the_run_still_trains_to_the_target(tmp_path):
    config = _config(
        norm="batch",
        target_value=0.9,
        target_bn="recompute",
        target_bn_examples=512,
        target_bn_batch=128,
    )
    config.train.eval_economy = False  # the curves of both runs are compared, step by step
    r = train.train_and_evaluate(config, str(tmp_path / "recompute"))
    assert r["status"] == "reached"
    assert r["protocol"]["target_bn"] == "recompute"
    assert r["protocol"]["target_bn_examples"] == 512
    # The evaluations leave training alone: the same run judged with the moving averages trains
    # through the same losses (it may stop at another step).
    config.train.target_bn = "moving"
    moving = train.train_and_evaluate(config, str(tmp_path / "moving"))
    assert moving["protocol"]["target_bn"] == "moving"
    assert moving["protocol"]["target_bn_examples"] is None

    def batch_losses(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return {ev["step"]: ev.get("batch_loss") for ev in map(json.loads, lines)}

    a, b = batch_losses("recompute"), batch_losses("moving")
    common = [step for step in a if step in b and step > 0 and a[step] is not None]
    assert len(common) >= 3
    assert [a[step] for step in common] == [b[step] for step in common]
    assert describe_protocol(_config(target_bn="recompute"))["target_bn"] is None  # no BN


def test_recompute_traces_once_per_model_and_nothing_retraces_for_a_new_learning_rate(tmp_path):
    def config(lr_multiplier):
        c = _config(
            norm="batch", target_bn="recompute", target_bn_examples=256, target_bn_batch=128
        )
        c.train.max_epochs, c.optim.lr_multiplier = 0.5, lr_multiplier
        return c

    runtime = setup_runtime(config(1.0).runtime)
    train.clear_cache()
    train.train_and_evaluate(config(1.0), str(tmp_path / "a"), runtime)
    (built,) = reuse._BUILT.values()
    counts = [
        built.bn_recompute._recompute.experimental_get_tracing_count(),
        built.stepper._traced_train_fn.experimental_get_tracing_count(),
        built.eval_sets["train"]._fn.experimental_get_tracing_count(),
    ]
    assert counts[0] == 1
    train.train_and_evaluate(config(2.0), str(tmp_path / "b"), runtime)
    assert list(reuse._BUILT.values()) == [built]
    assert [
        built.bn_recompute._recompute.experimental_get_tracing_count(),
        built.stepper._traced_train_fn.experimental_get_tracing_count(),
        built.eval_sets["train"]._fn.experimental_get_tracing_count(),
    ] == counts
    train.clear_cache()


# ---- momentum warm-up ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["momentum", "nesterov", "lars"])
@pytest.mark.parametrize("warmup", [0, 4])
def test_momentum_rises_linearly_over_the_warmup_steps(name, warmup):
    """Seven steps on a quadratic, against the update written out by hand with momentum
    m * min(1, k / warmup) at the step after k completed ones (m at every step without warm-up)."""
    import keras

    from wide_tf.engine import optim

    cfg = defaults.optim_config(name, base_lr=0.1)
    cfg.scaling, cfg.momentum_warmup_steps = "none", warmup
    if name == "lars":
        cfg.lars_trust_ratio, cfg.lars_eta = "you", 1.0
    w = keras.Variable(np.array([1.0, -2.0], np.float32))
    opt = optim.build_optimizer(cfg, 256, 10, 100)
    opt.build([w])
    x, v = np.array([1.0, -2.0]), np.zeros(2)
    for k in range(7):
        g = 2.0 * np.asarray(w.numpy(), np.float64)  # the gradient of |w|^2
        opt.apply([g.astype(np.float32)], [w])
        m = 0.9 * (min(1.0, k / warmup) if warmup else 1.0)
        # LARS on a rank-1 variable is plain momentum SGD (excluded from the trust ratio).
        if name == "lars":  # v = m v + lr g; w -= v (Nesterov: w -= m v + lr g)
            v = m * v + 0.1 * g
            x = x - v
        else:  # Keras: v = m v - lr g; w += v (Nesterov: w += m v - lr g)
            v = m * v - 0.1 * g
            x = x + (m * v - 0.1 * g if name == "nesterov" else v)
        np.testing.assert_allclose(w.numpy(), x, rtol=1e-5, err_msg=f"step {k + 1}")


def test_momentum_warmup_is_in_the_protocol_and_a_run_trains(tmp_path):
    config = _config(target_value=0.9)
    config.optim.momentum_warmup_steps = 20
    r = train.train_and_evaluate(config, str(tmp_path))
    assert r["status"] == "reached"
    assert r["protocol"]["momentum_warmup_steps"] == 20


def test_the_report_protocol_table_describes_the_new_fields():
    from wide_tf.report import protocol

    config = _config(
        norm="batch", target_bn="recompute", extra_targets=["train_loss:0.1"], target_bn_batch=128
    )
    config.optim.momentum_warmup_steps = 50
    rows = dict(protocol.trial_settings_rows([{"protocol": describe_protocol(config)}]))
    assert "also train_loss <= 0.1" in rows["Target"]
    assert "stops once every target is met" in rows["Target"]
    assert (
        "first 1024 training examples in batches of 128"
        in (rows["Batch-norm statistics at evaluation"])
    )
    assert "over the first 50 steps" in rows["Optimizer"]
    # Every new protocol key is shown by a named row (none falls through to a raw row).
    assert not {"extra_targets", "target_bn", "momentum_warmup_steps"} & set(rows)


def test_recompute_on_two_replicas_gives_the_statistics_of_one(tmp_path):
    stats = {}
    for devices in ([], ["/cpu:0", "/cpu:1"]):
        config = _config(
            norm="batch", depth=2, target_bn="recompute", target_bn_examples=256, target_bn_batch=64
        )
        config.runtime.devices = devices
        train.clear_cache()
        _, backend = train.setup(
            config, str(tmp_path / str(len(devices))), setup_runtime(config.runtime)
        )
        recompute = backend.built.bn_recompute  # at the initial weights of seed 0: both the same
        saved = recompute.recompute()
        stats[len(devices)] = [v.numpy() for v in recompute.variables]
        recompute.restore(saved)
    train.clear_cache()
    for one, two in zip(stats[0], stats[2]):
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)
