"""Owns the bit-for-bit check of a port of the engine's arithmetic: every variable (model and
optimizer, each replica's copy), the step scalars, the schedule's values and the LARS trust ratios
of 27 short runs through the compiled step (MLP and WRN; no norm, batch and ghost batch norm; SGD,
momentum with warm-up, Nesterov, LARS, AdamW; constant, cosine, polynomial and multistep
schedules; one and two replicas, one and two micro-batches), written to one .npz; and two such
files compared byte for byte. Run on two versions of the code (the keras.ops port:
docs/design.md):

    git archive OLD | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tools/bench/step_bytes.py /tmp/old.npz
    python -m tools.bench.step_bytes /tmp/new.npz
    python -m tools.bench.step_bytes --compare /tmp/old.npz /tmp/new.npz

(The first form runs this file against the old package.) About 3 CPU-minutes; `--only=ghost,lars`
keeps the runs whose name holds one of the words.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

GLOBAL_BATCH = 32


def _cases() -> list[tuple]:
    """(name, arch, depth, width, norm, optimizer, replicas, micro-batches, optim fields)."""
    cases = []
    warm = dict(momentum_warmup_steps=3, weight_decay=1e-3)
    ramp, decay = dict(momentum_warmup_steps=2), dict(weight_decay=1e-3)
    for arch, depth, width in (("mlp", 2, 16), ("wrn", 10, 1)):
        for norm in ("none", "batch", "ghost"):
            cases.append(
                (f"{arch}-{norm}-momwarm", arch, depth, width, norm, "momentum", 1, 1, warm)
            )
            cases.append((f"{arch}-{norm}-lars", arch, depth, width, norm, "lars", 1, 1, warm))
        for norm in ("batch", "ghost"):
            lars = dict(weight_decay=1e-3, lars_trust_ratio="decayed_grad", lars_clip=True)
            cases += [
                (f"{arch}-{norm}-lars-r2m2", arch, depth, width, norm, "lars", 2, 2, lars),
                (f"{arch}-{norm}-nest-r1m2", arch, depth, width, norm, "nesterov", 1, 2, ramp),
                (f"{arch}-{norm}-sgd-r2m1", arch, depth, width, norm, "sgd", 2, 1, decay),
            ]
    multistep = dict(schedule="multistep", decay_epochs=[1.0, 2.0], weight_decay=1e-2)
    cases += [
        ("mlp-none-sgd-poly", "mlp", 2, 16, "none", "sgd", 1, 1, dict(schedule="polynomial")),
        ("mlp-none-adamw-multi", "mlp", 2, 16, "none", "adamw", 1, 1, multistep),
        ("mlp-batch-mom-const", "mlp", 2, 16, "batch", "momentum", 2, 2, dict(schedule="constant")),
    ]
    return cases


def _run(out: dict, name, arch, depth, width, norm, opt_name, replicas, micro, fields) -> None:
    import keras
    import tensorflow as tf

    from wide_tf.engine import optim
    from wide_tf.engine.models import build_model
    from wide_tf.engine.tf.step import BatchPlan, Stepper
    from wide_tf.schema import defaults

    if replicas == 1:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        reduce = tf.distribute.ReductionToOneDevice()
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], reduce)
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 2.0, size=(64, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=64).astype(np.int32)
    keras.utils.set_random_seed(3)
    cfg = defaults.optim_config(opt_name, base_lr=0.5)
    cfg.update(dict(dict(schedule="cosine", warmup_fixed="steps", warmup_steps=2), **fields))
    with strategy.scope():
        model = build_model(arch, depth, width, 4, (8, 8, 3), norm=norm, ghost_batch_size=4)
        opt = optim.build_optimizer(cfg, GLOBAL_BATCH, 4, 10, model.trainable_variables)
        opt.build(model.trainable_variables)
        plan = BatchPlan.make(GLOBAL_BATCH, replicas, GLOBAL_BATCH // replicas // micro)
        diagnostics = optim.optimizer_spec(opt_name).diagnostics
        stepper = Stepper(model, opt, strategy, plan, diagnostics=diagnostics)

    def batches(ctx):
        per = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(per, drop_remainder=True).repeat()

    it = iter(strategy.distribute_datasets_from_function(batches))
    for call in range(2):
        for k, v in stepper.train(it, 3).items():
            out[f"{name}/scalar{call}/{k}"] = np.float64(v)
    for i, v in enumerate(list(model.variables) + list(opt.variables)):
        for r, local in enumerate(strategy.experimental_local_results(v.value)):
            out[f"{name}/{i}:{v.name}@{r}"] = local.numpy()
    schedule = tf.function(opt._learning_rate)
    lrs = [float(schedule(tf.constant(s, tf.int64))) for s in range(12)]
    out[f"{name}/lr"] = np.array(lrs, np.float32)
    if isinstance(opt, optim.LARS):
        grads = [tf.ones_like(v) * 0.01 for v in model.trainable_variables]
        ratios = tf.function(lambda: optim.lars_trust_ratios(opt, grads, model.trainable_variables))
        out[f"{name}/ratios"] = ratios().numpy()


def record(path: str, only: list[str]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]  # two logical CPUs: the two-replica runs
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    out: dict = {}
    for case in _cases():
        if not only or any(word in case[0] for word in only):
            _run(out, *case)
    np.savez(path, **out)
    print(f"{len(out)} arrays -> {path}")
    return 0


def compare(a_path: str, b_path: str) -> int:
    """0 when every array of `b` is in `a` with the same bytes; else the differing ones listed."""
    with np.load(a_path) as a, np.load(b_path) as b:
        missing = sorted(set(b.files) - set(a.files))
        differ = [k for k in b.files if k in a.files and a[k].tobytes() != b[k].tobytes()]
        for k in differ:
            d = np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))
            rel = d / np.maximum(np.abs(a[k].astype(np.float64)), 1e-30)
            print(f"{k}: max |diff| {d.max():.3g}, max relative {rel.max():.3g}")
        print(
            f"{len(b.files)} arrays compared: {len(differ)} differ, {len(missing)} only in {b_path}"
        )
    return 1 if differ or missing else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="OUT.npz, or with --compare A.npz B.npz")
    parser.add_argument("--compare", action="store_true", help="compare two files byte for byte")
    parser.add_argument("--only", default="", help="comma-separated words a run's name must hold")
    args = parser.parse_args(argv)
    if args.compare:
        if len(args.paths) != 2:
            parser.error("--compare takes two .npz files")
        return compare(*args.paths)
    if len(args.paths) != 1:
        parser.error("give one output .npz file")
    return record(args.paths[0], [w for w in args.only.split(",") if w])


if __name__ == "__main__":
    sys.exit(main())
