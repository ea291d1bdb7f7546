"""Owns the benchmark of a kept build's per-run cost: the runs of one (member, batch) cell of the
local study (its learning rates x seeds, in a study's order) trained in one kept build, once
seeded as the engine does (engine/seeding.py: Python, NumPy and Keras) and once with
keras.utils.set_random_seed (which sets TensorFlow's seed too, clearing every kept function's
kernels), the two sides alternating cell by cell in one process.

  python -m tools.bench.reuse_cost                       # depths 2 and 12, batches 4 and 176
  python -m tools.bench.reuse_cost --depths=8 --batches=32 --rounds=3

For each side: the first training call of a run (the run's first steps, after the kept build's
reset) against the median of its later calls, the run's training, evaluation and probe seconds
(the runs after the cell's first, whose build is kept), and whether the records are identical
(every target's status, steps and interpolated steps, the run's steps and final accuracies)."""

from __future__ import annotations

import argparse
import sys
import tempfile

from tools.bench.cohort import _local_config, _median, _threads

SIDES = ("seed_host", "keras_set_random_seed")


def _runs(depth: int, batch: int, side: str, multipliers, seeds) -> list[dict]:
    """The cell's runs in one kept build (the first builds it); per run its calls' seconds."""
    import keras

    from wide_tf.engine import timing, train
    from wide_tf.engine.tf import reuse

    seed_host = reuse.seeding.seed_host
    if side == "keras_set_random_seed":
        reuse.seeding.seed_host = keras.utils.set_random_seed
    out, runtime = [], None
    try:
        train.clear_cache()
        for m in multipliers:
            for s in seeds:
                config, _ = _local_config(depth, batch)
                config.optim.lr_multiplier, config.train.seed = float(m), int(s)
                runtime = runtime or train.runtime_for(config)  # one strategy: the build's key
                calls = []
                with timing.listening(lambda k, t0, sec, n, calls=calls: calls.append((k, sec))):
                    r = train.train_and_evaluate(config, tempfile.mkdtemp(), runtime)
                train_calls = [sec for k, sec in calls if k == "train"]
                out.append(
                    {
                        "first_train_ms": train_calls[0] * 1e3,
                        "median_train_ms": _median(train_calls) * 1e3,
                        "time_s": r["time_s"],
                        "record": _record(r),
                    }
                )
    finally:
        reuse.seeding.seed_host = seed_host
        train.clear_cache()
    return out


def _record(r: dict):
    return [
        [(t["status"], t["steps_to_target"], t["steps_to_target_interp"]) for t in r["targets"]],
        r["status"],
        r["steps"],
        r["final"]["train_accuracy"],
        r["final"]["test_accuracy"],
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.reuse_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--depths", default="2,12", help="local members by depth (1-6, 8, 10, 12)")
    p.add_argument("--batches", default="4,176")
    p.add_argument("--multipliers", default="0.5,1,2", help="the cell's learning-rate factors")
    p.add_argument("--seeds", default="0,1", help="the cell's seeds")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    a = p.parse_args(argv)
    try:
        depths = [int(v) for v in a.depths.split(",")]
        batches = [int(v) for v in a.batches.split(",")]
        mults = [float(v) for v in a.multipliers.split(",")]
        seeds = [int(v) for v in a.seeds.split(",")]
    except ValueError:
        print(
            "error: the list flags take comma-separated numbers, e.g. --batches=4,176",
            file=sys.stderr,
        )
        return 2
    if a.rounds < 1 or len(mults) * len(seeds) < 2:
        print("error: need --rounds >= 1 and at least two runs a cell", file=sys.stderr)
        return 2
    _threads(1)  # a study's worker is pinned to one core
    print(
        "side                   depth batch  first call ms  later calls ms  "
        "train s  eval s  probe s  (runs after the first, summed)  records"
    )
    for d in depths:
        for b in batches:
            for r in range(a.rounds):
                got = {}
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    got[side] = _runs(d, b, side, mults, seeds)
                same = sum(x["record"] == y["record"] for x, y in zip(*(got[s] for s in SIDES)))
                for side in SIDES:
                    kept = got[side][1:]  # the first run builds (and traces) the cell
                    total = {
                        k: sum(x["time_s"].get(k, 0.0) for x in kept)
                        for k in ("train", "eval", "probe")
                    }
                    first = _median([x["first_train_ms"] for x in kept])
                    later = _median([x["median_train_ms"] for x in kept])
                    print(
                        f"{side:<22} {d:>5} {b:>5} {first:>14.2f} {later:>15.2f}"
                        f" {total['train']:>8.3f} {total['eval']:>7.3f} {total['probe']:>8.3f}"
                        f"  ({len(kept)} runs)  identical {same}/{len(got[side])}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
