"""The benchmark's output: structure, and that every number is consistent with its raw timings.

No timing assertions: how fast anything runs depends on the machine and its load."""

import contextlib
import io
import json
import math
import statistics

import pytest

from tools.bench import speed as bench


@pytest.fixture(scope="module")
def rows():
    # One in-process run of the quick bench, shared by the tests below (it takes ~15 s).
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main(["--quick", "--json", "--repeats=2"]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _finite_positive(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def test_every_line_is_a_named_row(rows):
    assert rows[0]["kind"] == "meta" and rows[0]["name"] == "environment"
    assert {r["kind"] for r in rows} == {"meta", "speed", "ratio", "count", "cost"}
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), "row names are unique"


def test_speed_rows_match_their_raw_seconds(rows):
    speed = [r for r in rows if r["kind"] == "speed"]
    cases = bench.default_cases(quick=True)
    # Every model, three contenders: the loop, fit with steps_per_execution = the loop's, fit
    # default.
    assert {r["name"] for r in speed} == {
        f"{c}/{case.name}"
        for case in cases
        for c in ("loop", f"fit_spe{case.steps_per_loop}", "fit_spe1")
    }
    for r in speed:
        assert len(r["seconds"]) == 2 and all(_finite_positive(s) for s in r["seconds"])
        examples = r["batch"] * r["steps_per_call"]
        assert r["examples_per_s"] == pytest.approx(examples / statistics.median(r["seconds"]))
        assert r["examples_per_s_best"] == pytest.approx(examples / min(r["seconds"]))
        assert r["examples_per_s_best"] >= r["examples_per_s"]
        assert _finite_positive(r["params"])


def test_loop_over_fit_ratios_are_per_round_medians(rows):
    ratios = [r for r in rows if r["name"].startswith("loop_over_")]
    assert len(ratios) == 4
    for r in ratios:
        per_round = [o / lo for lo, o in zip(r["loop_seconds"], r["other_seconds"])]
        assert r["ratio"] == pytest.approx(statistics.median(per_round))
        assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
        assert r["ratio_best"] == pytest.approx(min(r["other_seconds"]) / min(r["loop_seconds"]))
        assert r["at_least_as_fast"] == (r["ratio"] >= 1.0)


def test_transfer_and_trace_counts_per_host_loop(rows):
    (r,) = [r for r in rows if r["kind"] == "count"]
    assert r["reads_per_loop"] == (r["reads"][1] - r["reads"][0]) / 8  # runs of 4 and 12 loops
    assert r["reads_per_loop"] <= 2  # one packed read per loop (plus at most a stray one)
    assert r["traces_per_loop"] == 0


def test_trial_fixed_cost_row_and_no_retrace_over_a_learning_rate_grid(rows):
    (r,) = [r for r in rows if r["kind"] == "cost"]
    assert len(r["fixed_s"]) == 3 and all(math.isfinite(v) for v in r["fixed_s"])
    assert r["fixed_s_later"] == pytest.approx(statistics.median(r["fixed_s"][1:]))
    assert r["traces_first_trial"] > 0 and r["retraces_later_trials"] == 0


def test_diversity_rows_for_fast_and_naive_paths(rows):
    fast = [r for r in rows if r["name"].startswith("diversity_fast/")]
    naive = [r for r in rows if r["name"].startswith("diversity_naive/")]
    assert len(fast) == len(naive) == 2  # two models at the quick batch size
    for r in fast:
        assert all(_finite_positive(v) for v in r["measure_s_all"] + r["step_s_all"])
        per_round = [m / s for m, s in zip(r["measure_s_all"], r["step_s_all"])]
        assert r["ratio"] == pytest.approx(statistics.median(per_round))
        assert r["meets_target"] == (r["ratio"] <= bench.DIVERSITY_TARGET)
    for r in naive:
        for k in ("ratio", "measure_s", "step_s", "per_example_s"):
            assert _finite_positive(r[k]), (r["name"], k, r[k])
        assert r["measure_s"] == pytest.approx(r["per_example_s"] * r["batch"])
        assert r["ratio"] == pytest.approx(r["measure_s"] / r["step_s"])
        # --quick times the naive loop on 8 of the 16 examples and says it scaled.
        assert r["scaled"] and r["timed_examples"] == 8 and "scaled" in r["what"]


def test_table_lists_every_row(rows):
    table = bench.format_table(rows)
    for r in rows[1:]:
        assert r["name"] in table
    assert "loop at least as fast" in table or "loop SLOWER" in table
    tie = dict(
        rows[0],
        kind="ratio",
        name="loop_over_x/m",
        ratio=0.98,
        ratio_min=0.9,
        ratio_max=1.1,
        ratio_best=1.0,
        at_least_as_fast=False,
    )
    assert "loop SLOWER (within noise)" in bench.format_table([tie])


def test_bad_options_are_refused():
    with pytest.raises(SystemExit):
        bench.parse_args(["--only=everything"])


def test_workers_part_times_one_study_with_one_and_two_workers():
    """--only=workers: the quick study (configs/mlp.py:smoke) once with each worker count; the
    ratio is the per-round one, both runs record the same trials. Not part of the default run."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main(["--only=workers", "--quick", "--json", "--repeats=1"]) == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    (r,) = [r for r in rows if r["kind"] == "speedup"]
    assert len(r["one_worker_s"]) == len(r["two_workers_s"]) == 1
    assert all(_finite_positive(v) for v in r["one_worker_s"] + r["two_workers_s"])
    assert r["ratio"] == pytest.approx(r["one_worker_s"][0] / r["two_workers_s"][0])
    assert r["same_trials"] and r["trials"] == 4
    assert r["meets_target"] == (r["ratio"] >= 1.7)
    assert "workers_2_over_1" in bench.format_table(rows)
