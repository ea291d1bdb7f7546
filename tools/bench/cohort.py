"""Owns the step-cost benchmark: the package's training call (the executor's graph and the fused
XLA loop) against a minimal compiled loop doing the same math, at the local study's shapes, and
what each per-step extra and an evaluation pass cost; all contenders interleaved round by round
in one process, so a shared machine's load falls on each alike.

  python -m tools.bench.cohort                      # members 2 and 12, batches 4..176
  python -m tools.bench.cohort --depths=1,2,12 --batches=4,176 --repeats=9 --json=out.json

One thread by default (a study's worker is pinned to one core). Each call runs the steps of one
evaluation interval of the local study (144 examples: 36 steps at batch 4, one at 176), as the
study does; `min@200` is the minimal loop at 200 steps a call (the per-call cost spread thin),
`min xK` K runs stacked on a leading axis (a cohort's candidate), per run-step. Times are the
process's CPU milliseconds a step (an evaluation pass: a pass), medians of the rounds; the JSON
rows also hold the wall medians."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _threads(n: int) -> None:
    """Before TensorFlow's import: its thread pools and OpenMP's at `n`."""
    for k in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ[k] = str(n)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _median(values):
    s = sorted(values)
    return s[len(s) // 2]


def _local_config(depth: int, batch: int):
    """configs/mlp.py:local's member of this depth at this batch, one run (seed 0)."""
    from configs import mlp
    from wide_tf.schema import families

    config = mlp.get_config("local")
    spec = config.sweep.family
    members = families.from_config(
        "mlp", spec, num_classes=10, input_shape=(8, 8, 1), norm=config.model.norm
    )
    member = next((m for m in members if m.depth == depth), None)
    if member is None:
        raise SystemExit(
            f"error: the local study has no member of depth {depth}; pick one of "
            f"{', '.join(str(m.depth) for m in members)}"
        )
    config.sweep = None
    config.model.depth, config.model.width = member.depth, member.width
    config.train.global_batch = batch
    return config, member


class Minimal:
    """The same MLP, loss and plain SGD as raw TensorFlow ops in one XLA while loop: batches
    gathered on the device from a fixed order, nothing else unless asked. `sums`: the loss sum
    and hits added up every step (what the package reads per call); `norms`: the gradient,
    parameter and update norms every step (the package takes them on a call's last step)."""

    def __init__(self, depth, width, batch, x, y, lr, sums=False, norms=False):
        import numpy as np
        import tensorflow as tf

        rng = np.random.default_rng(0)
        dims = [int(np.prod(x.shape[1:]))] + [width] * depth + [10]
        w = [
            tf.Variable(rng.standard_normal((a, b)).astype(np.float32) * np.float32((2 / a) ** 0.5))
            for a, b in zip(dims[:-1], dims[1:])
        ]
        bias = [tf.Variable(np.zeros(b, np.float32)) for b in dims[1:]]
        xs, ys, n = tf.constant(x.reshape(len(x), -1)), tf.constant(y), len(y)
        order = tf.constant(rng.permutation(n).astype(np.int32))
        pos = tf.Variable(0, dtype=tf.int32)
        variables = w + bias

        def sq(ts):
            return tf.add_n([tf.reduce_sum(tf.square(t)) for t in ts])

        @tf.function(jit_compile=True, autograph=False)
        def loop(k):
            def body(i, acc):
                p = pos.read_value()
                idx = tf.gather(order, (p + tf.range(batch)) % n)
                pos.assign((p + batch) % n)
                xb, yb = tf.gather(xs, idx), tf.gather(ys, idx)
                with tf.GradientTape() as tape:
                    h = xb
                    for j in range(depth):
                        h = tf.nn.relu(h @ w[j] + bias[j])
                    logits = h @ w[-1] + bias[-1]
                    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits)
                    loss = tf.reduce_sum(losses) / batch
                grads = tape.gradient(loss, variables)
                extra = tf.zeros([4])
                if sums:
                    hits = tf.cast(
                        tf.equal(tf.argmax(logits, -1, output_type=tf.int32), yb), tf.float32
                    )
                    extra += tf.stack([tf.reduce_sum(losses), tf.reduce_sum(hits), 0.0, 0.0])
                if norms:
                    before = [tf.identity(v) for v in variables]
                for v, g in zip(variables, grads):
                    v.assign_sub(lr * g)
                if norms:
                    upd = sq([v - b for v, b in zip(variables, before)])
                    extra += tf.stack([0.0, 0.0, sq(grads) + sq(variables), upd])
                return i + 1, acc + extra

            return tf.while_loop(lambda i, a: i < k, body, [tf.constant(0), tf.zeros([4])])[1]

        self.loop = loop

    def __call__(self, k: int):
        import tensorflow as tf

        return self.loop(tf.constant(k)).numpy()


class Stacked:
    """`runs` copies of the minimal loop's MLP trained as one program (a cohort's candidate on
    TensorFlow): weights with a leading run axis, each layer one batched matmul (einsum) over
    the runs, each run its own data order; plain SGD, nothing else. A call's time divided by
    `runs` is a run-step's, to set beside the minimal loop's step."""

    def __init__(self, depth, width, batch, x, y, lr, runs):
        import numpy as np
        import tensorflow as tf

        rng = np.random.default_rng(0)
        dims = [int(np.prod(x.shape[1:]))] + [width] * depth + [10]
        w = [
            tf.Variable(
                rng.standard_normal((runs, a, b)).astype(np.float32) * np.float32((2 / a) ** 0.5)
            )
            for a, b in zip(dims[:-1], dims[1:])
        ]
        bias = [tf.Variable(np.zeros((runs, 1, b), np.float32)) for b in dims[1:]]
        xs, ys, n = tf.constant(x.reshape(len(x), -1)), tf.constant(y), len(y)
        order = tf.constant(np.stack([rng.permutation(n) for _ in range(runs)]).astype(np.int32))
        pos = tf.Variable(0, dtype=tf.int32)
        variables = w + bias
        self.runs = runs

        @tf.function(jit_compile=True, autograph=False)
        def loop(k):
            def body(i, acc):
                p = pos.read_value()
                idx = tf.gather(order, (p + tf.range(batch)) % n, axis=1)  # [runs, batch]
                pos.assign((p + batch) % n)
                xb, yb = tf.gather(xs, idx), tf.gather(ys, idx)
                with tf.GradientTape() as tape:
                    h = xb
                    for j in range(depth):
                        h = tf.nn.relu(tf.einsum("kbi,kio->kbo", h, w[j]) + bias[j])
                    logits = tf.einsum("kbi,kio->kbo", h, w[-1]) + bias[-1]
                    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits)
                    loss = tf.reduce_sum(losses) / batch  # each run's own mean: disjoint weights
                grads = tape.gradient(loss, variables)
                for v, g in zip(variables, grads):
                    v.assign_sub(lr * g)
                return i + 1, acc + loss

            return tf.while_loop(lambda i, a: i < k, body, [tf.constant(0), tf.constant(0.0)])[1]

        self.loop = loop

    def __call__(self, k: int):
        import tensorflow as tf

        return self.loop(tf.constant(k)).numpy()


def _cpu_timed(fn) -> float:
    """This process's CPU seconds in `fn` (a first call's trace and compile): on a shared machine
    the wall time of a compile counts the other processes' share too."""
    t = time.process_time()
    fn()
    return time.process_time() - t


def bench_cell(depth: int, batch: int, repeats: int, cohort_sizes=(8,)) -> dict:
    """One (member, batch) cell: seconds a step of each contender (medians of interleaved
    rounds), an evaluation pass's, and the first call's (trace and compile)."""
    import tensorflow as tf

    from wide_tf.engine import arrays
    from wide_tf.engine import train as train_lib
    from wide_tf.engine.tf import fused

    config, member = _local_config(depth, batch)
    runtime = train_lib.runtime_for(config)
    ctl, backend = train_lib.setup(config, tempfile.mkdtemp(), runtime, {"trial_id": "bench"})
    ctl.restore()
    plan, built = ctl.plan, backend.built
    n = min(s for s in plan.eval_steps if s > 0)  # one evaluation interval's steps
    stepper, stream = built.stepper, backend.trainer.stream
    lr = float(built.optimizer.learning_rate.numpy())

    compile_s = {}
    executor = lambda: stepper.train(stream, n)  # noqa: E731
    compile_s["executor"] = _cpu_timed(executor)
    held = fused.HeldOrders(stream, fused.HeldOrders.epochs_for(n * batch, stream.n))
    fused_fn = fused.build_train_fn(stepper, held)
    compile_s["fused"] = _cpu_timed(lambda: fused_fn(n).numpy())
    x, y = arrays.load_arrays(config.data, "train")
    minimal = {
        "min": Minimal(depth, member.width, batch, x, y, lr),
        "min+sums": Minimal(depth, member.width, batch, x, y, lr, sums=True),
        "min+sums+norms": Minimal(depth, member.width, batch, x, y, lr, sums=True, norms=True),
    }
    stacked = {f"min x{k}": Stacked(depth, member.width, batch, x, y, lr, k) for k in cohort_sizes}
    for name, m in {**minimal, **stacked}.items():
        compile_s[name] = _cpu_timed(lambda m=m: m(n))
    minimal["min"](200)
    eval_set = built.eval_sets["train"]
    eval_set.sums()  # the executor's pass, traced
    host_pass = eval_set._fn
    xla_pass = tf.function(host_pass, jit_compile=True, autograph=False)
    compile_s["eval_xla"] = _cpu_timed(lambda: xla_pass(*eval_set.data, _whole(eval_set)).numpy())

    def reset():  # a run that diverged in the loop would count no more steps
        stepper.diverged.assign(False)

    contenders = {
        "executor": lambda: (reset(), executor()),
        "fused": lambda: (reset(), fused_fn(n).numpy()),
        **{k: (lambda m=m: m(n)) for k, m in minimal.items()},
        "min@200": lambda: minimal["min"](200),
        **{k: (lambda m=m: m(n)) for k, m in stacked.items()},
        "eval_executor": lambda: host_pass(*eval_set.data, _whole(eval_set)).numpy(),
        "eval_xla": lambda: xla_pass(*eval_set.data, _whole(eval_set)).numpy(),
    }
    times = {k: [] for k in contenders}
    walls = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            wall = time.perf_counter()
            times[k].append(_cpu_timed(contenders[k]))
            walls[k].append(time.perf_counter() - wall)
    steps = {k: 200 if k == "min@200" else 1 if k.startswith("eval") else n for k in times}
    steps.update({k: n * m.runs for k, m in stacked.items()})  # a run-step's time
    # CPU seconds of this process (all its threads): on a shared machine a call's wall time also
    # counts the time-slices of other processes; the wall medians are kept beside them.
    per_step = {k: _median(v) / steps[k] for k, v in times.items()}
    wall_per_step = {k: _median(v) / steps[k] for k, v in walls.items()}
    train_lib.clear_cache()
    flops = 6 * member.params * batch  # forward and backward, multiply-adds counted twice
    return {
        "depth": depth,
        "width": member.width,
        "batch": batch,
        "steps_per_call": n,
        "ms_per_step": {k: round(v * 1e3, 4) for k, v in per_step.items()},
        "wall_ms_per_step": {k: round(v * 1e3, 4) for k, v in wall_per_step.items()},
        "fused_over_min": per_step["fused"] / per_step["min"],
        "executor_over_min": per_step["executor"] / per_step["min"],
        "executor_over_fused": per_step["executor"] / per_step["fused"],
        "min_gflops": flops / per_step["min"] / 1e9,
        "compile_s": {k: round(v, 3) for k, v in compile_s.items()},
        "stacked_over_min": {
            k: per_step[k] / per_step["min"] for k in stacked
        },  # below 1: a stacked run-step costs less than a lone run's step
    }


def _whole(eval_set):
    import math

    import tensorflow as tf

    return tf.constant([-math.inf, math.inf, float(eval_set.num_examples)], tf.float32)


def table(rows, key: str = "wall_ms_per_step") -> str:
    """A Markdown table of the rows: milliseconds a step (`key`: wall or CPU medians), a
    stacked run-step's, the ratios, an evaluation pass's and the first calls' CPU seconds."""
    stacked = sorted({k for r in rows for k in r[key] if k.startswith("min x")})
    steps = ["executor", "fused", "min", "min+sums", "min+sums+norms", "min@200", *stacked]
    head = (
        "| depth x width | batch | steps/call | "
        + " | ".join(steps)
        + " | fused/min | executor/fused | eval pass executor / XLA | "
        "first call executor / fused (CPU s) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        m, c = r[key], r["compile_s"]
        lines.append(
            f"| {r['depth']} x {r['width']} | {r['batch']} | {r['steps_per_call']} | "
            + " | ".join(f"{m[k]:.3f}" for k in steps)
            + f" | {m['fused'] / m['min']:.2f} | {m['executor'] / m['fused']:.2f} | "
            f"{m['eval_executor']:.2f} / {m['eval_xla']:.2f} | "
            f"{c['executor']:.2f} / {c['fused']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.cohort",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--depths", default="2,12", help="local members by depth (1-6, 8, 10, 12)")
    p.add_argument("--batches", default="4,8,32,64,128,176")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds per cell")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow and OpenMP threads")
    p.add_argument("--cohorts", default="8", help="run counts of the stacked minimal loop")
    p.add_argument("--json", default="", help="also write the rows here")
    a = p.parse_args(argv)
    try:
        depths = [int(v) for v in a.depths.split(",")]
        batches = [int(v) for v in a.batches.split(",")]
        cohorts = [int(v) for v in a.cohorts.split(",") if v]
    except ValueError:
        print(
            "error: --depths and --batches take comma-separated integers, e.g. --batches=4,176",
            file=sys.stderr,
        )
        return 2
    if a.repeats < 1 or a.threads < 1:
        print("error: --repeats and --threads must be at least 1", file=sys.stderr)
        return 2
    _threads(a.threads)
    rows = []
    for d in depths:
        for b in batches:
            rows.append(bench_cell(d, b, a.repeats, cohorts))
            print(json.dumps(rows[-1]), flush=True)
    print("wall milliseconds a step (medians):")
    print(table(rows, "wall_ms_per_step"))
    print("CPU milliseconds a step of this process (medians):")
    print(table(rows, "ms_per_step"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
