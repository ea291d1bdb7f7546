"""Owns the report's section "Where the time went": the study's seconds by kind (result.json's
"time_s", engine/timing.py), summed over its runs, with each kind's share and the examples each
kind processed; runs from before the accounting (no "time_s") are counted apart."""

from __future__ import annotations

from collections.abc import Sequence

from wide_tf.schema import result_fields

_WHAT = {
    "setup": "models, optimizers and evaluation sets built or reset",
    "compile": "the first call of each compiled function (tracing, XLA)",
    "train": "training steps",
    "eval": "evaluation passes (most stop early: docs/evaluation.md)",
    "probe": "the exact gradient probe",
    "checkpoint": "checkpoints and metrics",
    "other": "the loop's remaining host time (summaries, hand-overs; a tf.data stream's start)",
}


def study_time(records: Sequence[dict]) -> tuple[dict, int, int]:
    """(seconds by kind summed over the records that have "time_s", how many have it, how many
    do not)."""
    total = {k: 0.0 for k in result_fields.TIME_KINDS}
    counted = 0
    for r in records:
        t = r.get("time_s")
        if not isinstance(t, dict):
            continue
        counted += 1
        for k in total:
            total[k] += float(t.get(k) or 0.0)
    return total, counted, len(records) - counted


def md_time(records: Sequence[dict]) -> list[str]:
    total, counted, missing = study_time(records)
    if not counted:
        return []
    whole = sum(total.values())
    lines = [
        "## Where the time went",
        "",
        f"Seconds of the {counted} runs by kind, summed over runs (engine/timing.py; a study's "
        "wall time is about this divided by its workers, plus TensorFlow's start-up in each).",
        "",
        "| kind | seconds | share | what |",
        "| --- | ---: | ---: | --- |",
    ]
    for k in result_fields.TIME_KINDS:
        share = total[k] / whole if whole else 0.0
        lines.append(f"| {k} | {total[k]:.1f} | {share:.0%} | {_WHAT[k]} |")
    lines.append(f"| all | {whole:.1f} | 100% | |")
    if missing:
        lines += ["", f"{missing} run(s) predate the accounting and are not counted."]
    return lines + [""]
