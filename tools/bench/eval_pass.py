"""Owns the evaluation benchmark: an evaluation pass at a large evaluation batch
on two replicas, the set streamed through tf.data (a new iterator per pass, the pass compiled once
per Stepper, i.e. per batch size: the code before) against the set held on the devices
(steps.DeviceEvalSet, compiled once per set), interleaved in one process, with the snapshot the
evaluation economy takes after a pass that stopped early.

    python -m tools.bench.eval_pass            # MNIST-shaped MLP, 10,000 examples, batch 1,024
    python -m tools.bench.eval_pass --quick    # seconds: the code paths, not the numbers
    python -m tools.bench.eval_pass --json

Counts: traced functions (timing.note_trace), device-to-host reads (host._Counters) and
batches per pass. On a TPU the streamed pass's loop runs on the host around one device program per
batch, whose condition reads the reduced sums back every batch; the held pass on a TPU is one
program (its loop inside the replica function): that count is by construction, not measured here
(no TPU; on CPUs both loops run in one graph). Shared machines are noisy: compare the ratios."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _two_cpus(tf) -> None:
    """Two logical CPU devices, configured before TensorFlow's runtime starts (as tests do)."""
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.eval_pass", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="a tiny model and set (seconds)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return p.parse_args(argv)


class _Setup:
    """The model, the sets (streamed and held) and the bounds of one benchmark."""

    def __init__(self, quick: bool):
        import keras
        import numpy as np
        import tensorflow as tf

        from wide_tf.engine.models import build_model
        from wide_tf.engine.tf import data
        from wide_tf.engine.tf.snapshot import Snapshot
        from wide_tf.engine.tf.step import DeviceEvalSet
        from wide_tf.schema import datasets

        self.strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        self._steppers = {}
        self.spec = datasets.get("mnist")
        shape = self.spec.input_shape
        self.n, self.eval_batch, width = (1000, 128, 32) if quick else (10_000, 1024, 512)
        self.batch_sizes = (64, 256) if quick else (256, 4096, 16384)
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, size=(self.n,) + tuple(shape), dtype=np.uint8)
        labels = rng.integers(0, 10, size=self.n).astype(np.int32)
        with self.strategy.scope():
            self.model = build_model("mlp", 2, width, 10, shape, norm="none")
            self.optimizer = keras.optimizers.SGD(0.1)
            self.optimizer.build(self.model.trainable_variables)
        self.snapshot = Snapshot(self.model, self.strategy)
        batches = -(-self.n // self.eval_batch)
        self.batches = batches

        def streamed():
            dataset = self.strategy.distribute_datasets_from_function(
                data._in_memory_eval_fn((images, labels), self.eval_batch)
            )
            return data.EvalDataset(dataset, batches, self.n)

        self.streamed = streamed
        packed = data.pack_images(tf.constant(images)).numpy()
        self.held = lambda: DeviceEvalSet(
            packed, labels, self.eval_batch, self.strategy, self.model, self.spec
        )
        # A bound that an untrained model rules out after two of the batches (its hits ~10%):
        # the kind of pass the economy stops early.
        self.stopping = (float(self.n - 1.4 * self.eval_batch), float("-inf"))

    def stepper(self, batch: int):
        """The Stepper of `batch` (one per batch size, as a study's groups make them)."""
        from wide_tf.engine.tf.step import BatchPlan, Stepper

        if batch in self._steppers:
            return self._steppers[batch]
        with self.strategy.scope():
            self._steppers[batch] = Stepper(
                self.model,
                self.optimizer,
                self.strategy,
                BatchPlan.make(batch, 2),
                input_spec=self.spec,
            )
        return self._steppers[batch]


def _old_pass(stepper, dataset, bound):
    """The streamed pass as the code before compiled it: once per Stepper (per batch size)."""
    from wide_tf.engine.tf import step as steps

    fn = getattr(stepper, "_bench_old_fn", None)
    if fn is None:
        fn = stepper._bench_old_fn = steps._build_eval_fn(
            stepper.model, stepper.strategy, stepper.jit_compile, stepper.input_spec
        )
    import tensorflow as tf

    b = steps._bound_tensor(bound, dataset.num_examples)
    sums = fn(iter(dataset.dataset), tf.constant(dataset.num_batches, tf.int32), b)
    return sums.numpy()


def _new_pass(stepper, held, bound):
    from wide_tf.engine.tf import step as steps

    return held.sums(steps._bound_tensor(bound, held.num_examples)).numpy()


def _measure(fn, repeats: int = 3):
    """(median seconds, traces, reads per call) of `fn()` called `repeats` times."""
    from tools.bench.common import _median
    from tools.bench.host import _Counters
    from wide_tf.engine import timing

    seconds, traces0 = [], timing._traces
    with _Counters() as counters:
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            seconds.append(time.perf_counter() - t0)
    return _median(seconds), timing._traces - traces0, counters.reads / repeats, out


def _compile_row(s: _Setup, variants) -> dict:
    """Traces and first-call seconds over a member's batch sizes (a new Stepper each)."""
    from wide_tf.engine import timing

    out = {}
    for name, make_pass, data_set in variants:
        traces0, t0 = timing._traces, time.perf_counter()
        first_calls = []
        for batch in s.batch_sizes:
            stepper = s.stepper(batch)
            c0 = time.perf_counter()
            make_pass(stepper, data_set, None)
            first_calls.append(time.perf_counter() - c0)
        out[f"{name}_traces"] = timing._traces - traces0
        out[f"{name}_first_call_s"] = first_calls
        out[f"{name}_seconds"] = time.perf_counter() - t0
    return {
        "kind": "eval_compile",
        "name": "eval/compile_per_member",
        "what": (
            f"traces of the evaluation pass over the batch sizes {list(s.batch_sizes)} of one "
            "member (a new Stepper each), and each batch size's first pass (s)"
        ),
        **out,
    }


def _pass_rounds(s: _Setup, variants, rounds: int):
    """Per variant: whole and stopped pass seconds, reads and traces (after the batch sizes'
    first passes: retraces), and the last sums; the snapshot's seconds. The variants
    interleaved, round after round."""
    stepper = s.stepper(s.batch_sizes[-1])
    per = {v[0]: {"whole": [], "stopped": [], "reads": [], "traces": 0} for v in variants}
    snapshot_s, sums = [], {}
    for _ in range(rounds):
        for name, make_pass, data_set in variants:
            got = []
            for bound, kind in ((None, "whole"), (s.stopping, "stopped")):
                call = functools.partial(make_pass, stepper, data_set, bound)
                sec, traces, reads, out = _measure(call)
                per[name][kind].append(sec)
                per[name]["traces"] += traces
                if kind == "whole":
                    per[name]["reads"].append(reads)
                got.append(out)
            sums[name] = got
        snapshot_s.append(_measure(s.snapshot.take)[0])
    return per, snapshot_s, sums


def bench_eval(quick: bool, rounds: int) -> list[dict]:
    """The rows: per-pass seconds, reads and batches (whole and stopped early), the traces and
    seconds of a member's batch sizes, the snapshot's seconds; before and after side by side."""
    from tools.bench.common import _median

    s = _Setup(quick)
    variants = (("before", _old_pass, s.streamed()), ("after", _new_pass, s.held()))
    rows = [_compile_row(s, variants)]
    per, snapshot_s, sums = _pass_rounds(s, variants, rounds)
    same = all((sums["before"][i] == sums["after"][i]).all() for i in (0, 1))
    stopped_batches = float(sums["after"][1][2]) / s.eval_batch
    row = {
        "kind": "eval_pass",
        "name": "eval/pass",
        "what": (
            f"one pass over {s.n} examples at evaluation batch {s.eval_batch} on 2 CPU replicas "
            f"(MirroredStrategy), MLP depth 2; median of {rounds} interleaved rounds"
        ),
        "batches_whole": s.batches,
        "batches_stopped": stopped_batches,
        "same_sums": bool(same),
        "snapshot_s": _median(snapshot_s),
        "tpu_programs_per_pass_before": f"{s.batches} whole, {stopped_batches:.0f} stopped "
        "(one per batch, by construction)",
        "tpu_programs_per_pass_after": "1 (by construction; not run here)",
    }
    for name, r in per.items():
        row[f"{name}_whole_s"] = _median(r["whole"])
        row[f"{name}_stopped_s"] = _median(r["stopped"])
        row[f"{name}_reads_per_pass"] = _median(r["reads"])
        row[f"{name}_retraces"] = r["traces"]
    for kind in ("whole", "stopped"):
        ratios = [b / a for b, a in zip(per["before"][kind], per["after"][kind])]
        row[f"speedup_{kind}"] = _median(ratios)
    return rows + [row]


def _run_config(quick: bool):
    """A run that evaluates every 1.5 steps at a large batch, as the paper configs do at 16,384:
    the embedded digits on 2 CPU replicas, batch 512, an evaluation every 768 examples (the
    economy on, three accuracy targets that the run does not all reach)."""
    from wide_tf.schema import defaults

    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = 2, 64, "none"
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy, config.runtime.devices = "cpu", ["/cpu:0", "/cpu:1"]
    t = config.train
    t.global_batch, t.eval_batch, t.eval_every_examples = 512, 256, 768
    t.max_steps = t.min_steps = 12 if quick else 60
    t.steps_per_loop = 10
    t.target_value, t.extra_targets = 0.95, ("train_accuracy:0.97", "train_accuracy:0.999")
    t.checkpoint_every_steps = 10**6
    return config


def _streamed_sets():
    """The code before, in this process: sets streamed through tf.data, the streamed pass
    compiled once per Stepper. Returns the undo."""
    from wide_tf.engine.tf import data, reuse
    from wide_tf.engine.tf import step as steps

    saved = (reuse._eval_set, steps.Stepper.eval_fn)

    def eval_set(config, runtime, model, info, split, limit):
        batch = config.train.eval_batch // runtime.num_replicas * runtime.num_replicas
        return data.make_eval_dataset(config.data, split, batch, runtime.strategy, limit=limit)

    def eval_fn(stepper, dataset):
        if getattr(stepper, "_bench_old_fn", None) is None:
            stepper._bench_old_fn = steps._build_eval_fn(
                stepper.model, stepper.strategy, stepper.jit_compile, stepper.input_spec
            )
        return stepper._bench_old_fn

    reuse._eval_set, steps.Stepper.eval_fn = eval_set, eval_fn

    def undo():
        reuse._eval_set, steps.Stepper.eval_fn = saved

    return undo


def _one_run(config, runtime, streamed: bool) -> tuple[dict, dict]:
    """One fresh run (the code before when `streamed`): its counts, and what its record says."""
    import tempfile

    from tools.bench.host import _Counters
    from wide_tf.engine import timing, train

    undo = _streamed_sets() if streamed else (lambda: None)
    events = []
    train.clear_cache()
    traces0 = timing._traces
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            _Counters() as counters,
            timing.listening(lambda kind, start, sec, n: events.append(kind)),
        ):
            r = train.train_and_evaluate(config, tmp, runtime)
    finally:
        undo()
        train.clear_cache()
    counts = {
        "eval_s": r["time_s"]["eval"],
        "eval_passes": events.count("eval"),
        "reads": counters.reads,
        "traces": timing._traces - traces0,
        "wall_s": r["wall_time_s"],
    }
    record = [(t["status"], t["steps_to_target_interp"]) for t in r["targets"]]
    return counts, record + [r["steps"], r["final"]["train_loss"], r["final"]["test_loss"]]


def bench_run(quick: bool, rounds: int) -> list[dict]:
    """Whole runs, before and after interleaved: evaluation passes, their seconds, reads, traces,
    and whether the records agree."""
    from tools.bench.common import _median
    from wide_tf.engine.tf.strategy import setup_runtime

    config = _run_config(quick)
    runtime = setup_runtime(config.runtime)
    per = {"before": {}, "after": {}}
    records = {}
    for _ in range(rounds):
        for name in per:
            counts, records[name] = _one_run(config, runtime, streamed=name == "before")
            for k, v in counts.items():
                per[name].setdefault(k, []).append(v)
    row = {
        "kind": "eval_run",
        "name": "eval/run",
        "what": (
            f"a run of {config.train.max_steps} steps at batch 512 on 2 CPU replicas evaluating "
            f"every 1.5 steps (the economy on); median of {rounds} interleaved rounds"
        ),
        "same_records": records["before"] == records["after"],
    }
    for name, r in per.items():
        for k, v in r.items():
            row[f"{name}_{k}"] = _median(v)
        row[f"{name}_s_per_pass"] = row[f"{name}_eval_s"] / max(row[f"{name}_eval_passes"], 1)
    ratios = [b / a for b, a in zip(per["before"]["eval_s"], per["after"]["eval_s"])]
    row["speedup_eval_s"] = _median(ratios)
    return [row]


def _table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        lines.append(f"# {r['name']}: {r['what']}")
        for k, v in r.items():
            if k not in ("kind", "name", "what"):
                lines.append(f"  {k:<32} {_fmt(v)}")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    _two_cpus(tf)
    rounds = args.rounds or (2 if args.quick else 5)
    rows = [
        {
            "kind": "meta",
            "name": "environment",
            "what": f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs",
            "load_average_1m": os.getloadavg()[0],
        }
    ]
    rows += bench_eval(args.quick, rounds)
    rows += bench_run(args.quick, 1 if args.quick else 2)
    rows[0]["load_average_1m_end"] = os.getloadavg()[0]
    if args.json:
        for r in rows:
            print(json.dumps(r), flush=True)
    else:
        print(_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
