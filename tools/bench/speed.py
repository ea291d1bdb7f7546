"""Owns the speed benchmark: the package's training loop against Keras `model.fit`, and the cost of
an exact gradient-diversity measurement relative to one training step.

    python -m tools.bench.speed          # both parts, an aligned table (a few minutes on 2 cores)
    python -m tools.bench.speed --only=loop --json --repeats=7
    python -m tools.bench.speed --only=workers   # one study with --workers=1 and 2 (minutes)
    python -m tools.bench.speed --only=study_cost   # 42 local-study trials, before/with the
                                                      # evaluation economy (about 10 minutes)

Shared machines are noisy, so every comparison is made inside one run with the contenders
interleaved (loop, fit, loop, fit, ...) and summarised by the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tools.bench import study_cost  # noqa: E402
from tools.bench.common import OVERHEAD_CASE, Case, default_cases  # noqa: E402
from tools.bench.diversity_cost import DIVERSITY_TARGET, bench_diversity  # noqa: E402
from tools.bench.host import _Counters, bench_transfers, bench_trial_cost  # noqa: E402
from tools.bench.table import format_table  # noqa: E402
from tools.bench.train_loop import bench_loop  # noqa: E402
from tools.bench.worker_speedup import bench_workers  # noqa: E402

__all__ = [
    "DIVERSITY_TARGET",
    "OVERHEAD_CASE",
    "Case",
    "_Counters",
    "bench_diversity",
    "bench_loop",
    "bench_transfers",
    "bench_trial_cost",
    "bench_workers",
    "default_cases",
    "format_table",
    "main",
    "parse_args",
    "run",
]


def _environment() -> dict:
    return {
        "kind": "meta",
        "name": "environment",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.speed", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--only",
        choices=("loop", "overhead", "diversity", "workers", "study_cost"),
        default=None,
        help="run one part only (default: all but workers and study_cost, which run whole "
        "studies or slices of one: minutes)",
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny models and batches (seconds; for tests)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved rounds per comparison (default 5, 2 with --quick)",
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of a table"
    )
    p.add_argument(
        "--batches",
        default=None,
        help="diversity batch sizes, comma-separated (default 256,1024; 16 with --quick)",
    )
    p.add_argument(
        "--chunk_size",
        type=int,
        default=256,
        help="gradient_stats chunk (256 = the probe chunk a run uses)",
    )
    p.add_argument(
        "--naive_subset",
        type=int,
        default=None,
        help="examples the naive loop is timed on before scaling to B (0 = skip the naive "
        "loop; default 64, 8 with --quick)",
    )
    p.add_argument(
        "--models",
        default=None,
        help="loop part: only these model names, comma-separated (e.g. mlp-d1-w32, the "
        "overhead-bound case)",
    )
    p.add_argument(
        "--groups",
        type=int,
        default=None,
        help="study_cost: (member, batch) groups of the slice (default 7 = 42 trials; 1 with "
        "--quick, on configs/mlp.py:smoke)",
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def run(args) -> list[dict]:
    """All rows of the benchmark that `args` asks for (see parse_args)."""
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    batches = [int(b) for b in (args.batches or ("16" if args.quick else "256,1024")).split(",")]
    naive_subset = args.naive_subset if args.naive_subset is not None else (8 if args.quick else 64)
    cases = default_cases(args.quick)
    if args.models:
        cases = [c for c in cases if c.name in args.models.split(",")]
    rows = [_environment()]
    if args.only in (None, "loop"):
        for case in cases:
            rows += bench_loop(case, repeats, args.seed)
    if args.only in (None, "overhead"):
        rows += bench_transfers()
        rows += bench_trial_cost(args.quick)
    if args.only in (None, "diversity"):
        for case in cases:
            for b in batches:
                rows += bench_diversity(case, b, repeats, args.chunk_size, naive_subset, args.seed)
    if args.only == "workers":
        rows += bench_workers(args.quick, args.repeats or (1 if args.quick else 2))
    if args.only == "study_cost":
        spec = "configs/mlp.py:smoke" if args.quick else study_cost.DEFAULT_CONFIG
        groups = args.groups or (2 if args.quick else study_cost.DEFAULT_GROUPS)
        rows += study_cost.bench_study_cost(spec, groups)
    end = _environment()
    rows[0]["load_average_1m_end"] = end["load_average_1m"]
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    rows = run(args)
    rows[0]["wall_s"] = round(time.perf_counter() - start, 1)
    if args.json:
        for r in rows:
            print(json.dumps(r), flush=True)
    else:
        print(format_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
