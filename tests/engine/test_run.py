"""One training run end to end: learning on real data, result.json, TensorBoard, divergence as a
result, exact resume after SIGKILL, clear errors for bad input."""

import json
import math

import pytest
import tensorflow as tf
from helpers import comparable, kill_when, run_main, start_main

from wide_tf.engine import arrays, compile_key, timing, train
from wide_tf.engine.result import describe_protocol
from wide_tf.engine.state import RunPlan, RunState
from wide_tf.engine.summaries import MetricsWriter
from wide_tf.engine.tf import reuse
from wide_tf.engine.tf.probe import GradientProbe
from wide_tf.engine.tf.step import Stepper
from wide_tf.schema import defaults, plan, result_fields


def _single(data="mnist_embedded", **train_overrides):
    config = defaults.base_config("mlp", data)
    config.sweep = None
    config.model.depth, config.model.width = 1, 64
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy = "cpu"
    for k, v in train_overrides.items():
        setattr(config.train, k, v)
    return config


def test_real_mnist_reaches_95_percent_and_writes_result_and_events(tmp_path):
    config = _single(global_batch=64, max_epochs=10.0, target_value=0.95, eval_every_examples=2000)
    result = train.train_and_evaluate(config, str(tmp_path))
    assert result["status"] == "reached"
    assert result["final"]["train_accuracy"] >= 0.95
    # Steps/epochs agree, and the target was met on the evaluation cadence (multiples of 2,000
    # examples).
    assert result["epochs_to_target"] == pytest.approx(result["steps_to_target"] * 64 / 4000)
    assert result["examples_to_target"] % 2000 < 64
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["steps_to_target"] == result["steps_to_target"]
    assert result_fields.problems(on_disk) == []  # the record is the declared one
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert history[0]["step"] == 0 and history[-1]["train_accuracy"] >= 0.95
    tags = set()
    for f in tf.io.gfile.glob(str(tmp_path / "train" / "events*")):
        for ev in tf.compat.v1.train.summary_iterator(f):
            tags |= {v.tag for v in ev.summary.value}
    assert {
        "loss",  # the mini-batches' loss: the tag train_set/ and test/ share (schema/targets.py)
        "accuracy",
        "learning_rate",
        "grad_norm",
        "update_norm",
        "param_norm",
        "examples_per_s",
    } <= tags
    # A finished run is not repeated.
    assert train.train_and_evaluate(config, str(tmp_path))["wall_time_s"] == result["wall_time_s"]


def test_not_reached_is_recorded_as_not_reached_not_as_the_budget(tmp_path):
    config = _single(data="digits_embedded", global_batch=32, max_epochs=1.0, target_value=0.999)
    config.train.eval_economy = False  # every evaluation step: both sets, whole
    events = []
    train.clear_cache()  # a kept build would share its step-0 evaluations (fewer "eval" events)
    with timing.listening(lambda *event: events.append(event)):
        result = train.train_and_evaluate(config, str(tmp_path))
    assert result["status"] == "not_reached"
    assert result["steps_to_target"] is None and result["epochs_to_target"] is None
    assert result["steps"] == math.ceil(1437 / 32)
    assert result_fields.problems(json.loads((tmp_path / "result.json").read_text())) == []
    # The timing hook heard the run: its span, every training call's steps, every evaluation
    # (training and test set per evaluation) and the final checkpoint, in order.
    kinds = [e[0] for e in events]
    assert kinds[0] == "trial" and kinds[-1] == "trial_end" and kinds[-2] == "checkpoint"
    assert sum(e[3] for e in events if e[0] == "train") == result["steps"]
    assert kinds.count("eval") == 2 * len((tmp_path / "metrics.jsonl").read_text().splitlines())
    assert all(e[2] >= 0 for e in events) and set(kinds) <= set(timing.KINDS)


def test_a_diverging_run_is_a_result(tmp_path):
    config = _single(data="digits_embedded", global_batch=32, max_epochs=5.0, diverge_loss=100.0)
    config.optim.base_lr = 1e4
    result = train.train_and_evaluate(config, str(tmp_path))
    assert result["status"] == "diverged"
    assert result["steps_to_target"] is None
    assert result_fields.problems(result) == []
    assert result["steps"] < math.ceil(5 * 1437 / 32)


def test_lars_run_logs_trust_ratios_and_accumulates(tmp_path):
    config = _single(
        data="digits_embedded",
        global_batch=64,
        max_epochs=2.0,
        max_device_batch=16,
        target_value=0.999,
    )
    config.optim.name, config.optim.base_lr, config.optim.weight_decay = "lars", 2.0, 1e-4
    config.optim.warmup_epochs, config.optim.schedule = 0.5, "polynomial"
    result = train.train_and_evaluate(config, str(tmp_path))
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = history[-1]
    assert 0 < last["trust_ratio_min"] <= last["trust_ratio_mean"] <= last["trust_ratio_max"]
    # Accumulation over 4 micro-batches feeds the two-batch noise-scale estimator.
    assert result["gradient"]["noise_scale_ema"] is not None
    assert result["examples_per_s"] > 0 and result["optimizer"] == "lars"


def test_bad_config_is_a_clear_error(tmp_path):
    config = _single(global_batch=10_000)
    with pytest.raises(train.ConfigError, match="larger than the training set"):
        train.train_and_evaluate(config, str(tmp_path))
    config = _single(global_batch=48)
    config.model.norm, config.model.ghost_batch_size = "ghost", 32
    with pytest.raises(train.ConfigError, match="multiple of model.ghost_batch_size=32"):
        train.train_and_evaluate(config, str(tmp_path))
    config = _single(global_batch=16)  # smaller than the ghost size: never shrunk, an error
    config.model.norm, config.model.ghost_batch_size = "ghost", 32
    with pytest.raises(
        train.ConfigError, match="lower model.ghost_batch_size .* or raise the batch"
    ):
        train.train_and_evaluate(config, str(tmp_path))
    config = _single(global_batch=16, max_device_batch=8)  # micro-batches count, too
    config.model.norm, config.model.ghost_batch_size = "ghost", 16
    with pytest.raises(train.ConfigError, match="it is 8"):
        train.train_and_evaluate(config, str(tmp_path))
    config = _single(target_metric="accuracy")
    with pytest.raises(train.ConfigError, match="target_metric"):
        train.train_and_evaluate(config, str(tmp_path))


def test_ghost_size_is_not_shrunk_on_more_replicas(tmp_path):
    """The same config that runs on one replica is refused on two (per-replica batch 16 < 32)."""
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    config = _single(global_batch=32)
    config.model.norm, config.model.ghost_batch_size = "ghost", 32
    config.runtime.devices = ["/cpu:0", "/cpu:1"]
    with pytest.raises(train.ConfigError, match="it is 16 .*over 2 replica"):
        train.train_and_evaluate(config, str(tmp_path))


def test_budget_has_a_floor_in_steps():
    config = _single(global_batch=1000, max_epochs=2.0)

    def budget(batch):
        return RunPlan.make(config, "run", 4000, batch).total_steps

    assert budget(1000) == 8
    config.train.min_steps = 20
    assert budget(1000) == 20  # the floor wins at a large batch
    assert budget(16) == 500  # and not at a small one
    config.train.max_steps = 5
    assert budget(1000) == 5  # an explicit max_steps is the budget
    assert describe_protocol(_single(min_steps=20))["min_steps"] == 20


def test_eval_steps_are_at_the_same_examples_for_every_batch():
    assert plan.eval_steps(64, 1000, 100) == [16, 32, 47, 63, 79, 94, 100]
    assert plan.eval_steps(4000, 1000, 5) == [1, 2, 3, 4, 5]


def test_killed_run_resumes_to_the_same_result(tmp_path):
    args = [
        "--config=configs/mlp.py:single",
        "--config.data.name=digits_embedded",
        "--config.train.max_epochs=12",
        "--config.train.global_batch=32",
        "--config.train.target_value=0.999",
        "--config.train.checkpoint_every_steps=40",
        "--config.train.eval_every_examples=500",
        "--config.train.steps_per_loop=20",
    ]
    ref = tmp_path / "ref"
    run_main(*args, f"--workdir={ref}")
    killed = tmp_path / "killed"
    proc = start_main(*args, f"--workdir={killed}")
    ckpt = killed / "checkpoints"
    assert kill_when(
        proc, lambda: ckpt.exists() and any(p.name.startswith("ckpt-") for p in ckpt.iterdir())
    )
    assert not (killed / "result.json").exists()
    run_main(*args, f"--workdir={killed}")
    a = json.loads((ref / "result.json").read_text())
    b = json.loads((killed / "result.json").read_text())
    assert comparable(a) == comparable(b)
    ha = [json.loads(line) for line in (ref / "metrics.jsonl").read_text().splitlines()]
    hb = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in ha] == [h["step"] for h in hb]
    assert [round(h["train_loss"], 4) for h in ha] == [round(h["train_loss"], 4) for h in hb]


def test_main_reports_bad_input_in_one_line(tmp_path):
    proc = run_main(
        "--config=configs/mlp.py:single",
        f"--workdir={tmp_path}",
        "--config.data.name=cifar10",
        "--config.data.data_dir=" + str(tmp_path / "none"),
        check=False,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and "data_dir" in last and "Traceback" not in proc.stderr
    proc = run_main(
        "--config=configs/mlp.py:single",
        f"--workdir={tmp_path}",
        "--config.train.global_bach=3",
        check=False,
    )
    assert proc.returncode != 0 and "global_bach" in proc.stderr


def test_a_run_reusing_the_last_runs_model_and_step_gives_the_fresh_result(tmp_path):
    """Runs that differ only in learning rate, seed or divergence threshold reuse one model,
    optimizer and traced step (reset, not rebuilt); the result is that of a fresh build."""

    def config(lr_multiplier, seed):
        c = _single(
            "digits_embedded",
            global_batch=64,
            max_epochs=2.0,
            eval_every_examples=500,
            gradient_at_init=True,
            gradient_every_examples=1000,
            seed=seed,
        )
        c.optim.lr_multiplier = lr_multiplier
        c.optim.schedule, c.optim.warmup_epochs = "cosine", 0.5
        return c

    from wide_tf.engine.tf.strategy import setup_runtime

    runtime = setup_runtime(config(1.0, 0).runtime)  # one per process, as in a study
    train.clear_cache()
    train.train_and_evaluate(config(1.0, 0), str(tmp_path / "a"), runtime)
    (built,) = reuse._BUILT.values()
    traces = built.stepper._traced_train_fn.experimental_get_tracing_count()
    reused = train.train_and_evaluate(config(2.0, 1), str(tmp_path / "b"), runtime)
    assert list(reuse._BUILT.values()) == [built]
    assert built.stepper._traced_train_fn.experimental_get_tracing_count() == traces  # no retrace
    train.clear_cache()
    fresh = train.train_and_evaluate(config(2.0, 1), str(tmp_path / "c"), runtime)
    assert comparable(reused) == comparable(fresh)
    # A fresh build may reduce float32 sums in another order (CI saw the last digits differ), and
    # 32 steps of training carry that on, so the probe's numbers are compared to a relative 1e-3,
    # entry by entry (pytest.approx takes no list of dicts); a run that was not reset properly
    # differs by far more.
    got, want = reused["gradient"]["history"], fresh["gradient"]["history"]
    assert [sorted(g) for g in got] == [sorted(w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert {k: pytest.approx(v, rel=1e-3) for k, v in w.items()} == g
    train.clear_cache()


def test_the_result_schema_names_what_is_wrong_with_a_record():
    good = {"metric": "train_loss", "value": 0.1, "status": "reached", "steps_to_target": 3}
    good.update(steps_to_target_interp=2.5, epochs_to_target=0.1)
    assert result_fields.problems(good, result_fields.TARGET) == []
    bad = dict(good, value=True, status="done", steps_to_target=None, extra="allowed")
    del bad["metric"]
    assert result_fields.problems(bad, result_fields.TARGET) == [
        "metric: missing",
        "value: bool, not number",
        "status: 'done' is not one of ('reached', 'not_reached', 'diverged')",
    ]
    record = {"targets": [dict(good, steps_to_target=1.5)], "final": {"train_loss": "x"}}
    got = result_fields.problems(record)
    assert "targets[0].steps_to_target: float, not int" in got
    assert "final.train_loss: str, not number" in got and "final.test_loss: missing" in got
    assert "trial_id: missing" in got and "role: missing" not in got  # role is optional
    assert {f.name for f in result_fields.FIELDS if f.required} < set(result_fields.NAMES)


def _changed(value):
    """Another value of a config field's type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str) or value is None:
        return (value or "") + "x"
    return list(value) + [value[0] if value else "x"]


def test_the_reuse_key_is_every_field_but_the_declared_exclusions():
    """A config field not in compile_key.KEY_EXCLUDED (a new one included) gets a new build; an
    excluded one shares the kept build (that such a run equals a fresh one is the test above)."""
    from types import SimpleNamespace

    from wide_tf.engine.tf.step import BatchPlan

    runtime = SimpleNamespace(strategy=object(), mixed_precision="float32", jit_compile=False)
    info = SimpleNamespace(num_classes=10, input_shape=(8, 8, 1))
    plan = BatchPlan.make(32, 1)

    def key(config):
        return reuse.build_key(config, runtime, info, plan)

    base = _single("digits_embedded")
    checked = 0
    for section in ("model", "data", "optim", "train", "runtime"):
        excluded = compile_key.KEY_EXCLUDED.get(section, ())
        for name, value in base[section].items():
            if name == "decay_epochs":
                continue  # below: its values are excluded, its length is not
            config = _single("digits_embedded")
            config[section][name] = _changed(value)
            if name in excluded:
                assert key(config) == key(base), f"{section}.{name} is excluded"
            else:
                assert key(config) != key(base), f"{section}.{name} changes the traced program"
            checked += 1
    assert checked > 50  # every field of those sections was tried
    # A field the engine does not know yet recompiles by default.
    config = _single("digits_embedded")
    config.train.unlock()
    config.train.some_new_field = 1
    assert key(config) != key(base)
    # The decay boundaries are schedule variables, their number a shape of the schedule.
    one, other, two = (_single("digits_embedded") for _ in range(3))
    one.optim.decay_epochs, other.optim.decay_epochs = [1.0], [3.0]
    two.optim.decay_epochs = [1.0, 3.0]
    assert key(one) == key(other) != key(two)


def test_metrics_writer_writes_only_on_the_chief(tmp_path):
    chief, other = tmp_path / "chief", tmp_path / "other"
    for path, is_chief in ((chief, True), (other, False)):
        w = MetricsWriter(str(path), is_chief, "run")
        w.scalars("train", 3, {"loss": 0.5, "bad": float("nan"), "none": None})
        w.history([{"step": 3, "train_accuracy": 0.9}])
        w.log("step %d", 3)
        w.flush()
    assert not other.exists()
    assert json.loads((chief / "metrics.jsonl").read_text()) == {"step": 3, "train_accuracy": 0.9}
    tags = set()
    for f in tf.io.gfile.glob(str(chief / "train" / "events*")):
        for ev in tf.compat.v1.train.summary_iterator(f):
            tags |= {v.tag for v in ev.summary.value}
    assert tags == {"loss"}  # non-finite and missing values are skipped


def _summaries(folder) -> dict:
    """{tag: [(step, Summary.Value)]} of every event file in `folder`."""
    out = {}
    for f in sorted(tf.io.gfile.glob(str(folder / "events*"))):
        for ev in tf.compat.v1.train.summary_iterator(f):
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((ev.step, v))
    return out


def test_metrics_writer_events_are_those_of_tf_summary_scalar(tmp_path):
    """The writer's events hold what tf.summary.scalar writes (the reference): the same tags,
    steps, float32 tensors and scalars-plugin metadata, so TensorBoard reads them alike."""
    values = [(0, {"loss": 2.25, "lr": 0.1}), (7, {"loss": 0.5, "lr": 1e-3, "acc": 1})]
    w = MetricsWriter(str(tmp_path / "ours"), True, "run")
    for step, v in values:
        w.scalars("train", step, v)
    w.close()
    ref = tf.summary.create_file_writer(str(tmp_path / "ref" / "train"))
    with ref.as_default():
        for step, v in values:
            for k, x in v.items():
                tf.summary.scalar(k, x, step=step)
    ref.close()
    ours, want = _summaries(tmp_path / "ours" / "train"), _summaries(tmp_path / "ref" / "train")
    assert sorted(ours) == sorted(want) == ["acc", "loss", "lr"]
    for tag in want:
        assert [s for s, _ in ours[tag]] == [s for s, _ in want[tag]]
        for (_, a), (_, b) in zip(ours[tag], want[tag], strict=True):
            assert a.metadata.plugin_data.plugin_name == b.metadata.plugin_data.plugin_name
            assert tf.make_ndarray(a.tensor).dtype == tf.make_ndarray(b.tensor).dtype
            assert tf.make_ndarray(a.tensor) == tf.make_ndarray(b.tensor)


def test_runs_of_one_seed_measure_the_initial_model_once(tmp_path, monkeypatch):
    """The step-0 evaluations and gradient diversity depend on the seed's initial weights only:
    the learning rates of a grid share them (same numbers, measured once), another seed does
    not."""

    def config(lr_multiplier, seed):
        c = _single(
            "digits_embedded",
            global_batch=64,
            max_epochs=1.0,
            eval_every_examples=1000,
            gradient_at_init=True,
            seed=seed,
        )
        c.optim.lr_multiplier = lr_multiplier
        return c

    calls = []
    real_probe, real_eval = GradientProbe.__call__, Stepper.evaluate
    monkeypatch.setattr(
        GradientProbe, "__call__", lambda *a: calls.append("probe") or real_probe(*a)
    )
    monkeypatch.setattr(Stepper, "evaluate", lambda *a: calls.append("eval") or real_eval(*a))
    from wide_tf.engine.tf.strategy import setup_runtime

    runtime = setup_runtime(config(1.0, 0).runtime)
    train.clear_cache()
    results, counts = [], []
    for i, (lr, seed) in enumerate([(1.0, 0), (4.0, 0), (1.0, 5)]):
        del calls[:]
        results.append(train.train_and_evaluate(config(lr, seed), str(tmp_path / str(i)), runtime))
        counts.append((calls.count("probe"), calls.count("eval")))
    first, same_seed, other_seed = results
    assert [c[0] for c in counts] == [1, 0, 1]  # the probe, at step 0 only (no later cadence)
    assert counts[1][1] == counts[0][1] - 2  # the two step-0 evaluations are reused
    assert counts[2][1] == counts[0][1]
    assert same_seed["gradient"]["history"] == first["gradient"]["history"]
    assert other_seed["gradient"]["history"][0]["step"] == 0
    assert other_seed["gradient"]["history"][0] != first["gradient"]["history"][0]
    step0 = [
        json.loads((tmp_path / str(i) / "metrics.jsonl").read_text().splitlines()[0])
        for i in range(3)
    ]
    assert step0[0]["step"] == step0[1]["step"] == step0[2]["step"] == 0
    assert step0[1] == step0[0] and step0[2] != step0[0]
    train.clear_cache()


def test_run_state_round_trips_and_reads_older_checkpoints():
    st = RunState(
        step=7, status="reached", steps_to_target=5, history=[{"step": 5}], noise={"a": 1}
    )
    assert RunState.from_json(st.to_json(), step=0) == st
    old = json.dumps({"history": [], "status": None, "train_log": [], "train_time_s": 1.0})
    assert RunState.from_json(old, step=40) == RunState(step=40, train_time_s=1.0)


def test_probe_on_two_replicas_matches_one(tmp_path):
    """The compiled probe runs through strategy.run; on two replicas it measures what one does."""
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    results = []
    for devices in ([], ["/cpu:0", "/cpu:1"]):
        config = _single(
            "digits_embedded",
            global_batch=64,
            max_steps=2,
            gradient_at_init=True,
            probe_size=300,
            probe_chunk=128,
        )
        config.runtime.devices = devices
        results.append(train.train_and_evaluate(config, str(tmp_path / str(len(devices)))))
    one, two = (r["gradient"]["history"][0] for r in results)
    assert one["step"] == two["step"] == 0
    for k in ("diversity", "batch_bound", "noise_scale"):
        assert two[k] == pytest.approx(one[k], rel=1e-4)
    train.clear_cache()


def test_compiled_probe_matches_the_host_measurement():
    from wide_tf.engine.models import build_model
    from wide_tf.engine.tf import per_example

    config = _single("digits_embedded", probe_size=300, probe_chunk=128)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = build_model("mlp", 1, 16, 10, (8, 8, 1), norm="none")
    probe = GradientProbe(config, model, strategy)
    x, y = arrays.load_arrays(config.data, "train", limit=300)
    ref = per_example.gradient_stats(model, x, y, chunk_size=128)
    got = probe(model)
    for k in ("diversity", "batch_bound", "noise_scale"):
        assert got[k] == pytest.approx(float(ref[k]), rel=1e-4)
