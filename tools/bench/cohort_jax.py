"""Owns the cohort benchmark on JAX: K runs of one study member trained as one compiled program
(jax.vmap over the Keras model's stateless call: each run its own weights, batch-norm statistics,
learning rate and data order) against the same member trained one run at a time, per run-step,
with the achieved FLOP/s beside what this machine's matmul reaches.

  python -m tools.bench.cohort_jax                                   # local MLPs, K 1..16
  python -m tools.bench.cohort_jax --models=wrn --batches=16,128 --cohorts=1,2,4,8
  python -m tools.bench.cohort_jax --threads=0                       # every core (a GPU: its own)
  python -m tools.bench.cohort_jax --engine --batches=4,32,176 --cohorts=1,3,6

`--engine` times the real engine path instead: one cell of the local MLP study (its first round:
three rates on two seeds, more seeds for a larger K), its K runs through
engine/train.train_and_evaluate_cohort against the same K runs one at a time through
train_and_evaluate, wall seconds side by side in one process, rounds alternating, each after a
warm-up of its own that compiles (the cohort's warm-up minus its timed median: the first cohort of
that K's compilation). Every run is the real one (evaluations, targets, checkpoints, records) at
a budget of `--epochs` epochs.

It sets KERAS_BACKEND=jax for itself (run it as its own process). The members: the local MLP
study's (configs/mlp.py:local, 8x8 inputs) and the Fashion-MNIST WRN study's
(configs/wrn.py:fashion7, 7x7 inputs); the inputs are random (the cost does not depend on their
values), so no data set is needed. A call runs `--steps` steps of plain SGD (the study's
arithmetic without its evaluation cadence: the regime of a span), batches gathered on the device
from each run's own permutation. One thread by default (a study's worker is pinned to one core).
Times are wall medians of interleaved rounds; FLOPs count a forward and a backward pass as three
times the forward's multiply-adds (2 FLOPs each) per example: a kernel's size, times its output
positions for a convolution."""

from __future__ import annotations

import argparse
import os
import sys
import time


def _environment(threads: int) -> None:
    """Before JAX's import: the Keras backend and, for `threads` > 0, XLA's CPU threads."""
    os.environ["KERAS_BACKEND"] = "jax"
    if threads > 0:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen=false "
            f"intra_op_parallelism_threads={threads}".strip()
        )


def _members(model: str) -> dict:
    """{depth: (width, input shape, norm)} of the study's family."""
    from wide_tf.checks import loader
    from wide_tf.schema import families

    if model == "mlp":
        config, shape = loader.load_config("configs/mlp.py:local"), (8, 8, 1)
    else:
        config, shape = loader.load_config("configs/wrn.py:fashion7"), (7, 7, 1)
    norm = config.model.norm
    members = families.from_config(
        model, config.sweep.family, num_classes=10, input_shape=shape, norm=norm
    )
    return {m.depth: (m.width, shape, norm, config.model.ghost_batch_size) for m in members}


def _median(values):
    s = sorted(values)
    return s[len(s) // 2]


def matmul_flops(repeats: int = 5) -> float:
    """FLOP/s of a jitted float32 1024x1024 matmul on this machine (the ceiling of the rows)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (1024, 1024), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2 * 1024**3 / _median(times)


def _forward_macs(model) -> int:
    """Multiply-adds of one example's forward pass: each kernel's size, times its output's
    positions for a convolution (a dense layer's: one)."""
    import numpy as np

    macs = 0
    for layer in model.layers:
        kernel = getattr(layer, "kernel", None)
        if kernel is None:
            continue
        positions = int(np.prod(layer.output.shape[1:-1])) if len(layer.output.shape) > 2 else 1
        macs += int(np.prod(kernel.shape)) * positions
    return macs


class Cohort:
    """K runs of one member as one program: `__call__()` runs `steps` SGD steps of every run."""

    def __init__(self, model_name, depth, member, batch, runs, steps, n=1438):
        import jax
        import jax.numpy as jnp
        import keras
        import numpy as np

        from wide_tf.engine.loss import per_example_loss
        from wide_tf.engine.models import build_model

        width, shape, norm, ghost = member
        keras.utils.set_random_seed(0)
        model = build_model(model_name, depth, width, 10, shape, norm=norm, ghost_batch_size=ghost)
        self.params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        self.forward_macs = _forward_macs(model)
        self.runs, self.steps, self.batch = runs, steps, batch
        key = jax.random.key(1)
        x = jax.random.normal(key, (n, *shape), jnp.float32)
        y = jax.random.randint(jax.random.key(2), (n,), 0, 10)
        epochs = 1 + (steps * batch) // n
        orders = jnp.stack(
            [
                jnp.concatenate(
                    [jax.random.permutation(jax.random.key(100 * r + e), n) for e in range(epochs)]
                )
                for r in range(runs)
            ]
        )
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        # Each run its own copy (slightly apart, as other seeds would be) and learning rate.
        stack = lambda vs: [  # noqa: E731
            jnp.stack([v * (1.0 + 0.01 * r) for r in range(runs)]) for v in vs
        ]
        self.state = (stack(trainable), stack(non_trainable))
        lrs = jnp.asarray([0.05 * 2.0 ** (r % 3) for r in range(runs)], jnp.float32)

        def loss(tv, ntv, xb, yb):
            logits, ntv = model.stateless_call(tv, ntv, xb, training=True)
            return jnp.mean(per_example_loss(yb, logits)), ntv

        def one_run(tv, ntv, lr, order):
            def step(i, carry):
                tv, ntv = carry
                idx = jax.lax.dynamic_slice(order, (i * batch,), (batch,))
                (_, ntv), g = jax.value_and_grad(loss, has_aux=True)(tv, ntv, x[idx], y[idx])
                return [p - lr * d for p, d in zip(tv, g)], ntv

            return jax.lax.fori_loop(0, steps, step, (tv, ntv))

        batched = jax.vmap(one_run, in_axes=(0, 0, 0, 0))
        self._fn = jax.jit(lambda tv, ntv: batched(tv, ntv, lrs, orders))
        self()  # compile

    def __call__(self):
        import jax

        out = self._fn(*self.state)
        jax.block_until_ready(out)


def bench(model_name, depth, member, batch, cohorts, steps, rounds) -> list[dict]:
    """One (member, batch): every K's seconds a run-step, interleaved round by round."""
    contenders = {k: Cohort(model_name, depth, member, batch, k, steps) for k in cohorts}
    times = {k: [] for k in cohorts}
    order = list(cohorts)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            t0 = time.perf_counter()
            contenders[k]()
            times[k].append((time.perf_counter() - t0) / (k * steps))
    params = contenders[cohorts[0]].params
    flops = 6 * contenders[cohorts[0]].forward_macs * batch  # per run-step
    alone = _median(times[cohorts[0]]) if cohorts[0] == 1 else None
    rows = []
    for k in cohorts:
        per = _median(times[k])
        rows.append(
            {
                "model": f"{model_name}-d{depth}",
                "params": params,
                "batch": batch,
                "K": k,
                "ms_per_run_step": per * 1e3,
                "examples_per_s_per_run": batch / per / k,
                "examples_per_s_all": batch / per,
                "vs_one_at_a_time": None if alone is None else alone / per,
                "gflops": flops / per / 1e9,
            }
        )
    return rows


def _cell_configs(depth: int, batch: int, k: int, epochs: float) -> list:
    """K configs of the local study's cell (depth, batch): its first round's trials (three rates
    on two seeds), then the same rates on further seeds; a budget of `epochs` epochs."""
    from wide_tf.checks import loader
    from wide_tf.study import trials as trials_lib

    config = loader.load_config("configs/mlp.py:local")
    config.sweep.batch_sizes = (batch,)
    config.runtime.backend = "jax"
    config.train.gradient_every_examples = 0  # the probe is per run either way, not the cohort's
    cell = [
        t.config
        for t in trials_lib.expand(config, 10, (8, 8, 1))
        if t.member.depth == depth and t.batch_size == batch and t.role == "tune"
    ]
    configs = []
    for i in range(k):
        c = cell[i % len(cell)].copy_and_resolve_references()
        c.train.seed = int(c.train.seed) + 10 * (i // len(cell))
        c.train.max_epochs, c.train.min_steps = float(epochs), 0
        configs.append(c)
    return configs


def engine_bench(depth: int, batch: int, cohorts: list, epochs: float, rounds: int) -> list[dict]:
    """Per K: the wall seconds of K runs one at a time and as one cohort (medians of `rounds`,
    alternating), the cohort's first (compiling) wall, and the steps the K runs took."""
    import shutil
    import tempfile

    from wide_tf.engine import train

    root = tempfile.mkdtemp(prefix="cohort_bench_")
    runtime = None
    counter = [0]

    def fresh(k: int) -> list[str]:
        counter[0] += 1
        return [os.path.join(root, str(counter[0]), str(i)) for i in range(k)]

    def alone(configs):
        return [
            train.train_and_evaluate(c, w, runtime) for c, w in zip(configs, fresh(len(configs)))
        ]

    def together(configs):
        return train.train_and_evaluate_cohort(configs, fresh(len(configs)), runtime)

    rows = []
    try:
        for k in cohorts:
            configs = _cell_configs(depth, batch, k, epochs)
            runtime = runtime or train.runtime_for(configs[0])
            alone(configs)  # warm-up: the build and its compiled step
            t0 = time.perf_counter()
            records = together(configs) if k > 1 else alone(configs)
            first = time.perf_counter() - t0
            times = {"alone": [], "cohort": []}
            for r in range(rounds):
                for name in ("alone", "cohort")[:: 1 if r % 2 == 0 else -1]:
                    t0 = time.perf_counter()
                    (together if name == "cohort" and k > 1 else alone)(configs)
                    times[name].append(time.perf_counter() - t0)
            a, c = _median(times["alone"]), _median(times["cohort"])
            rows.append(
                {
                    "K": k,
                    "steps": sum(int(rec["steps"]) for rec in records),
                    "alone_s": a,
                    "cohort_s": c,
                    "speedup": a / c,
                    "first_s": first,
                }
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _engine_main(a, depths, batches, cohorts) -> int:
    from absl import logging

    logging.set_verbosity(logging.WARNING)
    members = _members("mlp")
    depths = depths or [min(members), max(members)]
    print(f"engine path, local MLP study cells, {a.epochs:g} epochs a run, threads {a.threads}")
    print(
        "| member | batch | K | steps (all runs) | one at a time (s) | cohort (s) "
        "| cohort speed-up | cohort's first (compiling) call of K (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for d in depths:
        for b in batches:
            for row in engine_bench(d, b, cohorts, a.epochs, a.rounds):
                print(
                    f"| mlp-d{d} | {b} | {row['K']} | {row['steps']} | {row['alone_s']:.2f} | "
                    f"{row['cohort_s']:.2f} | {row['speedup']:.2f}x | {row['first_s']:.2f} |",
                    flush=True,
                )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.cohort_jax",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", default="mlp", help="mlp (the local study) or wrn (fashion7)")
    p.add_argument("--depths", default="", help="members by depth; default: shallowest, deepest")
    p.add_argument("--batches", default="4,8,32,64,128,176")
    p.add_argument("--cohorts", default="1,2,4,8,16", help="run counts K (1 first: the baseline)")
    p.add_argument("--steps", type=int, default=200, help="steps a call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="XLA CPU threads; 0: XLA's default")
    p.add_argument("--engine", action="store_true", help="time the engine's cohort entry point")
    p.add_argument("--epochs", type=float, default=2.0, help="--engine: each run's budget")
    a = p.parse_args(argv)
    try:
        batches = [int(v) for v in a.batches.split(",")]
        cohorts = [int(v) for v in a.cohorts.split(",")]
        depths = [int(v) for v in a.depths.split(",") if v]
    except ValueError:
        print(
            "error: the list flags take comma-separated integers, e.g. --batches=4,176",
            file=sys.stderr,
        )
        return 2
    if a.engine and (a.models != "mlp" or not a.epochs > 0):
        print(
            "error: --engine times the local MLP study's cells: --models=mlp, --epochs > 0",
            file=sys.stderr,
        )
        return 2
    if a.models not in ("mlp", "wrn") or min(cohorts) < 1 or a.steps < 1 or a.rounds < 1:
        print(
            "error: --models is mlp or wrn; --cohorts, --steps and --rounds are >= 1",
            file=sys.stderr,
        )
        return 2
    _environment(a.threads)
    if a.engine:
        return _engine_main(a, depths, batches, cohorts)
    import jax

    members = _members(a.models)
    depths = depths or [min(members), max(members)]
    missing = [d for d in depths if d not in members]
    if missing:
        print(
            f"error: no {a.models} member of depth {missing[0]}; pick one of "
            f"{', '.join(map(str, sorted(members)))}",
            file=sys.stderr,
        )
        return 2
    ceiling = matmul_flops()
    device = jax.devices()[0]
    print(
        f"{device.platform} ({device.device_kind}), threads {a.threads or 'default'}; "
        f"float32 1024x1024 matmul: {ceiling / 1e9:.1f} GFLOP/s"
    )
    print(
        "| member | params | batch | K | ms a run-step | examples/s a run | examples/s all "
        "| vs one at a time | GFLOP/s | of matmul |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in depths:
        for b in batches:
            for row in bench(a.models, d, members[d], b, cohorts, a.steps, a.rounds):
                vs = row["vs_one_at_a_time"]
                print(
                    f"| {row['model']} | {row['params']} | {b} | {row['K']} | "
                    f"{row['ms_per_run_step']:.4f} | {row['examples_per_s_per_run']:.0f} | "
                    f"{row['examples_per_s_all']:.0f} | {'-' if vs is None else f'{vs:.2f}x'} | "
                    f"{row['gflops']:.2f} | {100 * row['gflops'] * 1e9 / ceiling:.1f}% |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
