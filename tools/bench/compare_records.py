"""Owns the comparison of two studies' records: the same study run by two versions of the code (a
worktree of an older commit beside this one), matched trial by trial, and whether every record
the answer reads is identical; with the seconds by kind where the records keep them.

    git worktree add --detach ../old 2ebcf68
    (cd ../old && PYTHONPATH=$PWD python -m wide_tf.main --config=configs/mlp.py:local \\
        --workers=1 --workdir=/tmp/ab/old) &
    python -m wide_tf.main --config=configs/mlp.py:local --workers=1 --workdir=/tmp/ab/new
    python -m tools.bench.compare_records /tmp/ab/old /tmp/ab/new

Trials are matched by name: the trial id less its last part, a hash of the whole config that
changes whenever a field is added to the config, as it did between versions.
"""

from __future__ import annotations

import argparse
import sys

from wide_tf.report.cost import study_time
from wide_tf.store import workdir as workdir_lib
from wide_tf.study.trials import trial_name


def record_key(rec: dict) -> list:
    """What the answer reads from a run: each target's status, steps and interpolated steps, and
    the run's status and length."""
    return [
        (t["metric"], t["value"], t["status"], t["steps_to_target"], t["steps_to_target_interp"])
        for t in rec["targets"]
    ] + [rec["status"], rec["steps"]]


def _by_name(workdir: str) -> dict:
    # Not `whole`: that checks today's schema, which an older version's records predate.
    return {trial_name(r["trial_id"]): r for r in workdir_lib.read_results(workdir)}


def compare(workdir_a: str, workdir_b: str) -> dict:
    """{'a', 'b', 'common', 'identical', 'differ': [names], 'only_a', 'only_b', 'time_a',
    'time_b'} for the two studies' records."""
    a, b = _by_name(workdir_a), _by_name(workdir_b)
    common = sorted(set(a) & set(b))
    differ = [k for k in common if record_key(a[k]) != record_key(b[k])]
    return {
        "a": len(a),
        "b": len(b),
        "common": len(common),
        "identical": len(common) - len(differ),
        "differ": differ,
        "only_a": sorted(set(a) - set(b)),
        "only_b": sorted(set(b) - set(a)),
        "time_a": _seconds(a.values()),
        "time_b": _seconds(b.values()),
    }


def _seconds(records) -> dict | None:
    """The runs' seconds summed by kind (the report's own sum); None where no record keeps them."""
    total, counted, _ = study_time(list(records))
    return total if counted else None


def format_comparison(out: dict, label_a: str = "A", label_b: str = "B") -> str:
    lines = [
        f"trials: {out['a']} in {label_a}, {out['b']} in {label_b}, {out['common']} in both; "
        f"identical records (every target's status, steps and interpolated steps, the run's "
        f"status and length): {out['identical']}/{out['common']}"
    ]
    for name in out["differ"][:5]:
        lines.append(f"  differs: {name}")
    for label, only in ((label_a, out["only_a"]), (label_b, out["only_b"])):
        if only:
            lines.append(f"  only in {label}: {len(only)} (first: {only[0]})")
    for label, t in ((label_a, out["time_a"]), (label_b, out["time_b"])):
        if t is None:
            lines.append(f"  {label}: no seconds by kind in its records")
        else:
            total = sum(t.values())
            parts = ", ".join(f"{k} {v:.0f} s ({v / total:.0%})" for k, v in t.items() if total)
            lines.append(f"  {label}: runs' seconds {total:.0f}: {parts}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir_a")
    parser.add_argument("workdir_b")
    args = parser.parse_args(argv)
    out = compare(args.workdir_a, args.workdir_b)
    if not out["common"]:
        print(
            f"no trial is in both {args.workdir_a} ({out['a']}) and {args.workdir_b} "
            f"({out['b']}): give two workdirs of the same study",
            file=sys.stderr,
        )
        return 2
    print(format_comparison(out, args.workdir_a, args.workdir_b))
    return 0 if not out["differ"] else 1


if __name__ == "__main__":
    sys.exit(main())
