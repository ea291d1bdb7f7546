"""The run's seam: the Controller, its actions, the evaluation economy and the result builder reach
a backend only through engine/interface.py, read its typed payloads' fields alone, read the run as
plain data, and load no TensorFlow; a pure-Python backend runs a whole run through the shared
driver; the progress line keeps its wall-clock cadence (a fake clock)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import subprocess
import sys
import typing

import pytest

from wide_tf.engine import actions, interface, loop
from wide_tf.engine.state import RunPlan, RunState
from wide_tf.engine.targets import Targets
from wide_tf.schema import defaults

ENGINE = pathlib.Path(__file__).resolve().parents[1] / "wide_tf" / "engine"
SHARED = ("loop", "actions", "evaluation", "result", "targets", "state", "interface")
# The backend objects as the shared modules name them, and the protocol each must keep to.
ROLES = {"trainer": interface.Trainer, "evaluator": interface.Evaluator}
ROLES["checkpointer"] = interface.Checkpointer


def _members(protocol) -> set[str]:
    return {
        n
        for n in list(vars(protocol)) + list(getattr(protocol, "__annotations__", {}))
        if not n.startswith("_")
    }


def _reached(path: pathlib.Path) -> dict[str, set[str]]:
    """role -> the attributes the module reads of it (`trainer.x`, `self.trainer.x`)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if name in ROLES:
            out.setdefault(name, set()).add(node.attr)
    return out


@pytest.mark.parametrize("module", ["loop", "actions", "evaluation", "result"])
def test_the_shared_driver_reaches_the_backend_only_through_its_interface(module):
    path = ENGINE / f"{module}.py"
    # No `run` object reaches the shared driver: attributes of one are not read.
    assert re.findall(r"\brun_?\.[a-z_]+", path.read_text()) == []
    for role, attrs in _reached(path).items():
        assert attrs <= _members(ROLES[role]), (
            f"{module} reads {role}.{attrs - _members(ROLES[role])}"
        )
    if module == "result":  # the record is built from plain data alone
        assert _reached(path) == {}


def test_the_controller_knows_at_most_six_things_of_the_backend():
    # At most 6 attributes of the backend in the controller module: the Trainer's restore,
    # describe, train, span, measure and finish (the Evaluator is the economy's).
    reached = _reached(ENGINE / "loop.py")
    assert sum(len(a) for a in reached.values()) <= 6, reached


def test_the_coupling_rule_catches_a_reach_past_the_interface(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(self):\n    return self.trainer.built.model\n")
    assert _reached(bad) == {"trainer": {"built"}}
    assert not _reached(bad)["trainer"] <= _members(interface.Trainer)


# ---- the typed payloads -----------------------------------------------------------------------

PAYLOADS = {
    ("Trainer", "describe"): interface.RunFacts,
    ("Trainer", "train"): interface.HostCall,
    ("Trainer", "measure"): interface.GradientStats,
}
FIELDS = {
    interface.RunFacts: [
        "model",
        "params",
        "learning_rate",
        "probe_examples",
        "runtime",
        "dtype_policy",
        "batch_plan",
    ],
    interface.HostCall: ["scalars", "diverged"],
    interface.GradientStats: ["diversity", "batch_bound", "noise_scale"],
    interface.SetMetrics: ["loss", "accuracy", "examples"],
}
# The names under which the shared modules hold a payload, and its type.
HELD = {"facts": interface.RunFacts, "call": interface.HostCall, "stats": interface.GradientStats}


def test_what_crosses_the_interface_is_a_typed_payload_with_these_fields():
    for (role, method), payload in PAYLOADS.items():
        hints = typing.get_type_hints(getattr(getattr(interface, role), method))
        assert hints["return"] is payload, (role, method)
    hints = typing.get_type_hints(interface.Evaluator.evaluate)
    assert hints["return"] == dict[str, interface.SetMetrics] | None
    for payload, names in FIELDS.items():
        assert dataclasses.is_dataclass(payload)
        assert [f.name for f in dataclasses.fields(payload)] == names, payload


@pytest.mark.parametrize("module", ["loop", "actions", "evaluation", "result"])
def test_the_shared_driver_reads_only_the_payloads_fields(module):
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            payload = HELD.get(node.value.id)
            if payload is not None:
                assert node.attr in FIELDS[payload], f"{module} reads {node.value.id}.{node.attr}"


def test_the_controller_asks_for_the_facts_once_a_run(tmp_path):
    trainer, _, result = _run_fake(tmp_path)
    assert trainer.described == 1
    # The noise scale's average comes from the run's state, not from a second describe().
    assert result["gradient"]["noise_scale_ema"] is None  # the fake never updates it


def test_the_shared_driver_loads_no_tensorflow():
    code = (
        "import importlib, sys\n"
        f"for m in {list(SHARED)!r}: importlib.import_module('wide_tf.engine.' + m)\n"
        "print(','.join(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ---- a second backend, in plain Python --------------------------------------------------------


class _Trainer:
    """A 'model' whose training accuracy rises by 0.01 per step (the loss falls with it)."""

    described = 0

    def restore(self, state):
        self.state = state

    def train(self, num_steps):
        self.state.step += num_steps
        scalars = {
            "batch_loss": 1.0 - self.state.step / 100,
            "batch_accuracy": 0.5,
            "learning_rate": 0.1,
            "examples_per_s": 1.0,
        }
        return interface.HostCall(scalars, diverged=False)

    def span(self, lengths, bound, last_pass=True):
        return None  # this backend cannot: the Controller trains and evaluates per interval

    def measure(self, step):
        return interface.GradientStats(diversity=1.0, batch_bound=2.0, noise_scale=3.0)

    def describe(self):
        self.described += 1
        return interface.RunFacts(
            model="fake",
            params=7,
            learning_rate=0.1,
            probe_examples=10,
            runtime="python",
            dtype_policy="float32",
            batch_plan={"replicas": 1, "micro_batches": 1, "micro_batch": 32},
        )

    def finish(self):
        pass


class _Evaluator:
    def __init__(self, trainer):
        self.trainer, self.examples, self.calls = trainer, {"train": 100, "test": 50}, []

    def evaluate(self, step, sets=("train", "test"), bound=None, snapshot=False):
        self.calls.append((step, tuple(sets), bound is not None))
        acc = min(1.0, step / 100)
        return {k: interface.SetMetrics(loss=1.0 - acc, accuracy=acc, examples=1) for k in sets}

    def hold(self):
        pass


class _Checkpointer:
    def __init__(self):
        self.saved = []

    def load(self):
        return None

    def save(self, state):
        self.saved.append(state.step)

    def close(self):
        pass


class _Metrics:
    def __init__(self):
        self.lines = []

    def scalars(self, kind, step, values):
        pass

    def log(self, message, *args, warning=False, debug=False):
        self.lines.append(message % args)

    history = flush = close = lambda self, *a: None


def _run_fake(tmp_path):
    config = defaults.base_config("mlp", "digits_embedded")
    t = config.train
    t.target_metric, t.target_value, t.max_steps = "train_accuracy", 0.5, 80
    t.eval_every_examples, t.global_batch, t.steps_per_loop = 320, 32, 4
    t.gradient_every_examples = 0
    plan = RunPlan.make(config, "fake", 1000, 32)
    trainer, metrics, ckpt = _Trainer(), _Metrics(), _Checkpointer()
    evaluator = _Evaluator(trainer)
    record = {
        "config": config,
        "trial": {"trial_id": "fake"},
        "workdir": str(tmp_path),
        "chief": False,
    }
    targets = Targets(config, 32, 1000, metrics.log)
    result = loop.Controller(trainer, evaluator, ckpt, plan, targets, metrics, record).run()
    return trainer, evaluator, result


def test_a_pure_python_backend_runs_through_the_shared_controller(tmp_path):
    trainer, evaluator, result = _run_fake(tmp_path)
    # Evaluations every 10 steps; the target (accuracy 0.5) is first met at step 50, where the
    # run stops; the crossing interpolates between steps 40 (0.4) and 50 (0.5).
    assert result["status"] == "reached" and result["steps"] == 50
    assert result["steps_to_target"] == 50 and result["steps_to_target_interp"] == 50.0
    assert result["params"] == 7 and result["runtime"] == "python"
    assert [c[0] for c in evaluator.calls][:3] == [0, 10, 20]
    assert any(c[2] for c in evaluator.calls)  # the economy bounded the training set's passes
    assert not (tmp_path / "result.json").exists()  # not the chief: nothing written


# ---- the progress line on its wall-clock cadence ----------------------------------------------


def test_the_progress_line_follows_the_wall_clock_not_the_evaluations():
    config = defaults.base_config("mlp", "digits_embedded")
    config.train.max_steps = 1000
    plan = RunPlan.make(config, "run", 10_000, 100)
    now, lines = [0.0], []
    line = actions.ProgressLine(
        plan, lambda fmt, s: lines.append(s), every_s=30, clock=lambda: now[0]
    )
    line.start(0)
    now[0] = 29.0
    assert line(100, {"batch_loss": 0.5}) is None  # not 30 s yet
    now[0] = 40.0
    out = line(200, {"batch_loss": 0.25})
    # 200 steps of 100 examples in 40 s; 800 steps left at 0.2 s each.
    assert out == (
        "progress: step 200/1000  epoch 2.00  loss 0.2500  500 ex/s  "
        "ETA 2m40s (to the budget; a target may stop it sooner)"
    )
    now[0] = 60.0
    assert line(300, {"batch_loss": 0.2}) is None  # 20 s since the last line
    now[0] = 75.0
    assert "step 400/1000" in line(400, {"batch_loss": 0.1}) and len(lines) == 2
    assert actions.duration(3725) == "1h02m" and actions.duration(42) == "42s"


def test_a_resumed_run_estimates_from_its_own_steps_here():
    config = defaults.base_config("mlp", "digits_embedded")
    config.train.max_steps = 1000
    plan = RunPlan.make(config, "run", 10_000, 100)
    now = [100.0]
    line = actions.ProgressLine(plan, lambda *a: None, every_s=30, clock=lambda: now[0])
    line.start(500)  # resumed at step 500
    now[0] = 130.0
    # 400 steps left at 0.3 s each (from step 0 it would be 0.05 s each: 20 s)
    assert "ETA 2m00s" in line(600, {"batch_loss": 0.1})


def test_run_state_is_plain_data():
    assert RunState.from_json(RunState(step=3).to_json(), 3) == RunState(step=3)
