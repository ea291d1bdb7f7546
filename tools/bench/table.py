"""Owns the benchmark's table: its rows (speeds, counts, costs, speed-ups, ratios) as aligned,
human-readable text."""

from __future__ import annotations


def format_table(rows: list[dict]) -> str:
    """Aligned, human-readable: speeds first, then ratios."""
    lines = []
    for m in (r for r in rows if r["kind"] == "meta"):
        lines.append(
            f"# {m['name']}: "
            + ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("kind", "name"))
        )
    lines += _speed_lines([r for r in rows if r["kind"] == "speed"])
    for r in rows:
        if r["kind"] in _SENTENCES:
            lines += ["", _SENTENCES[r["kind"]](r)]
    lines += _ratio_lines([r for r in rows if r["kind"] == "ratio"])
    cost = [r for r in rows if r["kind"] == "study_cost"]
    if cost:
        from tools.bench.study_cost import format_study_cost

        lines += ["", format_study_cost(cost)]
    return "\n".join(lines)


def _block(rows: list[dict], header, line) -> list[str]:
    """A blank line, a header and one line per row, the first column as wide as the longest name
    (`header(w)` and `line(r, w)` format them); nothing for no rows."""
    if not rows:
        return []
    w = max(len(r["name"]) for r in rows)
    return ["", header(w)] + [line(r, w) for r in rows]


def _speed_lines(speed: list[dict]) -> list[str]:
    return _block(
        speed,
        lambda w: (
            f"{'training speed':<{w}}  {'ex/s (median)':>13}  {'ex/s (best)':>11}  "
            f"{'s/call':>8}  {'batch':>5}  {'steps/call':>10}"
        ),
        lambda r, w: (
            f"{r['name']:<{w}}  {r['examples_per_s']:>13.0f}  "
            f"{r['examples_per_s_best']:>11.0f}  {r['seconds_median']:>8.3f}  "
            f"{r['batch']:>5d}  {r['steps_per_call']:>10d}"
        ),
    )


def _count_line(r: dict) -> str:
    return (
        f"{r['name']}: {r['reads_per_loop']:.1f} device-to-host reads and "
        f"{r['traces_per_loop']:.1f} traced model calls per host loop ({r['what']})"
    )


def _cost_line(r: dict) -> str:
    return (
        f"{r['name']}: fixed cost {r['fixed_s_later']:.3f} s per trial after the first "
        f"(first {r['fixed_s_first']:.3f} s; all: "
        + ", ".join(f"{v:.3f}" for v in r["fixed_s"])
        + f"); whole trial {r['trial_s_later']:.3f} s after the first"
        + f"; traced model calls {r['traces_first_trial']} in the first trial, "
        f"{r['retraces_later_trials']} in the later ones; steady step "
        f"{r['per_step_s'] * 1e3:.2f} ms, evaluation {r['per_eval_s'] * 1e3:.1f} ms"
    )


def _speedup_line(r: dict) -> str:
    return (
        f"{r['name']}: {r['ratio']:.2f}x (rounds {r['ratio_min']:.2f}-"
        f"{r['ratio_max']:.2f}; target >= {r['target']:g}: "
        + ("met" if r["meets_target"] else "MISSED")
        + f"); {r['trials']} trials; 1 worker "
        + ", ".join(f"{v:.1f}" for v in r["one_worker_s"])
        + " s, 2 workers "
        + ", ".join(f"{v:.1f}" for v in r["two_workers_s"])
        + " s"
        + ("" if r["same_trials"] else "; the two runs recorded DIFFERENT trials")
    )


# The rows written as one sentence each, after the speeds, in the rows' order.
_SENTENCES = {"count": _count_line, "cost": _cost_line, "speedup": _speedup_line}


def _ratio_note(r: dict) -> str:
    if "at_least_as_fast" in r:
        note = "loop at least as fast" if r["at_least_as_fast"] else "loop SLOWER"
        if r["ratio_min"] <= 1.0 <= r["ratio_max"]:  # rounds disagree on the winner
            note += " (within noise)"
        return note
    if "meets_target" in r:
        return f"target <= {r['target']:g}: " + ("met" if r["meets_target"] else "MISSED")
    if r.get("scaled"):
        return f"naive timed on {r['timed_examples']} examples, scaled linearly"
    return ""


def _ratio_line(r: dict, w: int) -> str:
    rng = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}" if "ratio_min" in r else ""
    meas = f"{r['measure_s']:.3f}" if "measure_s" in r else ""
    stp = f"{r['step_s']:.4f}" if "step_s" in r else ""
    best = f"{r['ratio_best']:.3f}" if "ratio_best" in r else ""
    return (
        f"{r['name']:<{w}}  {r['ratio']:>8.3f}  {best:>9}  {rng:>11}  {meas:>9}  "
        f"{stp:>8}  {_ratio_note(r)}"
    )


def _ratio_lines(ratios: list[dict]) -> list[str]:
    return _block(
        ratios,
        lambda w: (
            f"{'ratio':<{w}}  {'median':>8}  {'best/best':>9}  {'range':>11}  "
            f"{'measure s':>9}  {'step s':>8}  note"
        ),
        _ratio_line,
    )
