"""Tests of wide_tf.analysis on hand-made result tables whose answers are computed by hand."""

import json

import numpy as np
import pytest

from wide_tf import analysis as A


def rec(member="m", batch=32, lr=0.1, mult=1.0, seed=0, status="reached", steps=None, n_train=1000,
        width=64, depth=2, params=10000, arch="mlp", tid=None, **extra):
    r = {"trial_id": tid or f"{member}-{batch}-{lr}-{seed}", "member": member, "arch": arch, "depth": depth,
         "width": width, "params": params, "batch_size": batch, "lr_multiplier": mult, "learning_rate": lr,
         "optimizer": "sgd", "seed": seed, "num_train": n_train, "status": status,
         "steps_to_target": steps if status == "reached" else None,
         "epochs_to_target": steps * batch / n_train if status == "reached" else None,
         "best_test_accuracy": 0.9, "final": {"train_accuracy": 0.99, "test_accuracy": 0.9}}
    r.update(extra)
    return r


def member_records(member, width, depth, steps_by_batch, *, params=10000, n_train=1000, seeds=(0,),
                   best_mult=1.0, arch="mlp"):
    """A 3-point LR grid per batch: best_mult reaches in S steps, the other reached LR in 2S, the
    largest LR diverges. steps None: every LR fails to reach the target."""
    out = []
    mults = (0.5, 1.0, 2.0, 4.0) if best_mult == 2.0 else (0.5, 1.0, 2.0)
    for b, s in steps_by_batch.items():
        for m in mults:
            for seed in seeds:
                if s is None:
                    st, status = None, "not_reached"
                elif m == max(mults):
                    st, status = None, "diverged"
                elif m == best_mult:
                    st, status = s, "reached"
                else:
                    st, status = 2 * s, "reached"
                out.append(rec(member, b, 0.1 * m, m, seed, status, st, n_train, width, depth, params, arch))
    return out


# ---------------------------------------------------------------- parsing

def test_parse_results_skips_torn_lines_and_dedupes():
    a = rec(tid="t1", steps=10)
    b = dict(rec(tid="t1", steps=12))
    text = json.dumps(a) + "\n\n" + json.dumps(b) + "\n" + '{"trial_id": "t2", "mem'
    records, bad = A.parse_results(text)
    assert bad == 1
    assert len(records) == 1 and records[0]["steps_to_target"] == 12  # last line of a trial wins


# ---------------------------------------------------------------- seeds and best LR

def test_aggregation_requires_every_seed_and_means_steps():
    recs = [rec(seed=0, steps=100), rec(seed=1, steps=140), rec(seed=2, steps=120)]
    (s,) = A.aggregate_settings(recs)
    assert s.reached and s.n_seeds == 3
    assert s.steps_to_target == pytest.approx(120.0)
    assert s.steps_std == pytest.approx(np.std([100, 140, 120]))
    assert s.epochs_to_target == pytest.approx(120 * 32 / 1000)
    recs[1] = rec(seed=1, status="not_reached")
    (s,) = A.aggregate_settings(recs)
    assert not s.reached and s.steps_to_target is None and s.n_reached == 2 and s.n_not_reached == 1


def test_best_lr_selection_with_failures_and_grid_edges():
    recs = [
        rec(lr=0.01, mult=0.1, seed=0, status="not_reached"), rec(lr=0.01, mult=0.1, seed=1, status="not_reached"),
        rec(lr=0.03, mult=0.3, seed=0, steps=200), rec(lr=0.03, mult=0.3, seed=1, steps=220),
        # fewest steps on seed 0, but seed 1 fails: not a reached setting
        rec(lr=0.1, mult=1.0, seed=0, steps=100), rec(lr=0.1, mult=1.0, seed=1, status="not_reached"),
        rec(lr=0.3, mult=3.0, seed=0, status="diverged"), rec(lr=0.3, mult=3.0, seed=1, status="diverged"),
    ]
    (cell,) = A.select_best(A.aggregate_settings(recs))
    assert cell.learning_rate == pytest.approx(0.03) and cell.lr_multiplier == pytest.approx(0.3)
    assert cell.steps_to_target == pytest.approx(210.0)
    assert not cell.lr_at_grid_edge
    assert (cell.n_trials, cell.n_reached, cell.n_not_reached, cell.n_diverged) == (8, 3, 3, 2)
    assert cell.grid_lrs == pytest.approx((0.01, 0.03, 0.1, 0.3))

    # Best at the largest LR tried -> edge; at the smallest -> edge.
    (cell,) = A.select_best(A.aggregate_settings([rec(lr=0.1, steps=50), rec(lr=0.05, steps=80)]))
    assert cell.learning_rate == pytest.approx(0.1) and cell.lr_at_grid_edge
    (cell,) = A.select_best(A.aggregate_settings(
        [rec(lr=0.05, steps=50), rec(lr=0.1, steps=80), rec(lr=0.2, status="diverged")]))
    assert cell.learning_rate == pytest.approx(0.05) and cell.lr_at_grid_edge
    # A diverged larger LR brackets the optimum: not an edge.
    (cell,) = A.select_best(A.aggregate_settings(
        [rec(lr=0.05, steps=80), rec(lr=0.1, steps=50), rec(lr=0.2, status="diverged")]))
    assert cell.learning_rate == pytest.approx(0.1) and not cell.lr_at_grid_edge
    # Ties go to the smaller learning rate.
    (cell,) = A.select_best(A.aggregate_settings(
        [rec(lr=0.01, steps=90), rec(lr=0.05, steps=60), rec(lr=0.1, steps=60), rec(lr=0.2, steps=70)]))
    assert cell.learning_rate == pytest.approx(0.05)
    # Nothing reached: no best, no edge, counts kept.
    (cell,) = A.select_best(A.aggregate_settings(
        [rec(lr=0.05, status="not_reached"), rec(lr=0.1, status="diverged")]))
    assert cell.best is None and cell.steps_to_target is None and not cell.lr_at_grid_edge
    assert (cell.n_not_reached, cell.n_diverged) == (1, 1)


# ---------------------------------------------------------------- max_batch

def cells_for(steps_by_batch, n_train=1000):
    return A.select_best(A.aggregate_settings(
        [rec(batch=b, status="reached" if s else "not_reached", steps=s, n_train=n_train)
         for b, s in steps_by_batch.items()]))


def test_max_batch_hand_table():
    # epochs = S * B / 1000: B=10 -> 1.0, 20 -> 1.1, 40 -> 1.2, 80 -> 1.6, 160 -> 2.24
    cells = cells_for({10: 100, 20: 55, 40: 30, 80: 20, 160: 14})
    mb = A.max_batch(cells, 0.25)  # threshold 1.25: 10, 20, 40 pass, 80 fails
    assert mb.value == 40 and mb.reference_batch == 10
    assert mb.reference_epochs == pytest.approx(1.0) and mb.threshold == pytest.approx(1.25)
    assert not mb.at_ceiling and mb.largest_batch == 160 and mb.gaps == ()
    assert A.max_batch(cells, 0.1).value == 20    # 1.1 <= 1.1 exactly: within
    assert A.max_batch(cells, 0.0).value == 10
    assert A.max_batch(cells, 0.6).value == 80
    top = A.max_batch(cells, 2.0)
    assert top.value == 160 and top.at_ceiling


def test_max_batch_undefined_and_gaps():
    mb = A.max_batch(cells_for({10: None, 20: 55, 40: 30}), 0.25)
    assert mb.value is None and "B=10" in mb.reason and "never reached" in mb.reason
    # B=20 never reached but B=40 is within the threshold: the literal definition gives 40.
    mb = A.max_batch(cells_for({10: 100, 20: None, 40: 30, 80: 30}), 0.25)
    assert mb.value == 40 and mb.gaps == (20,)
    assert A.max_batch([], 0.25).value is None


# ---------------------------------------------------------------- critical batch size

def test_fit_exact_curve():
    b = 2.0 ** np.arange(4, 12)
    fit = A.fit_critical_batch(b, 1000 * (1 + 300 / b))
    assert fit.reason is None
    assert fit.b_crit == pytest.approx(300, rel=1e-9) and fit.s_min == pytest.approx(1000, rel=1e-9)
    assert fit.r2_log == pytest.approx(1.0) and fit.rel_rms < 1e-9


def test_fit_recovers_b_crit_under_multiplicative_noise():
    rng = np.random.default_rng(0)
    b = 2.0 ** np.arange(4, 14)  # 16 .. 8192 around B_crit = 300
    errs = []
    for _ in range(20):
        s = 1000 * (1 + 300 / b) * np.exp(rng.normal(0, 0.05, b.size))
        fit = A.fit_critical_batch(b, s)
        assert fit.reason is None and fit.r2_log > 0.99
        errs.append(fit.b_crit / 300 - 1)
        assert fit.s_min == pytest.approx(1000, rel=0.1)
    assert np.max(np.abs(errs)) < 0.25 and abs(np.mean(errs)) < 0.08


def test_fit_relative_weighting_beats_unweighted_on_small_batches():
    # An outlier-free curve with a 10% error at the smallest batch only: an unweighted fit in S
    # lets that one point dominate; the relative fit stays close.
    b = 2.0 ** np.arange(4, 12)
    s = 1000 * (1 + 300 / b)
    s[0] *= 1.10
    fit = A.fit_critical_batch(b, s)
    x = 1 / b
    a, slope = np.polyfit(x, s, 1)[::-1]
    assert abs(fit.b_crit / 300 - 1) < abs(slope / a / 300 - 1)


def test_fit_rejections():
    assert A.fit_critical_batch([32, 64], [100, 60]).b_crit is None
    r = A.fit_critical_batch([32, 64], [100, 60]).reason
    assert "3" in r
    rising = A.fit_critical_batch([32, 64, 128, 256], [100, 110, 120, 130])
    assert rising.b_crit is None and "B_crit" in rising.reason
    falling_faster = A.fit_critical_batch([32, 64, 128, 256], [100, 40, 15, 5])
    assert falling_faster.b_crit is None and "S_min" in falling_faster.reason


# ---------------------------------------------------------------- verdict

BATCHES = (32, 64, 128, 256, 512)
N = 4096


def steps_for(b_crit, s_min=400.0, batches=BATCHES):
    return {b: s_min * (1 + b_crit / b) for b in batches}


def three_members(b_crits, **kw):
    # Fixed-budget family: wider = shallower. max_batch(0.25) with batches from 32 is the largest B
    # with B + Bc <= 1.25 (32 + Bc), i.e. B <= 40 + Bc / 4.
    spec = [("mlp-d8-w128", 128, 8), ("mlp-d4-w181", 181, 4), ("mlp-d2-w256", 256, 2)]
    recs = []
    for (name, w, d), bc in zip(spec, b_crits):
        recs += member_records(name, w, d, steps_for(bc) if isinstance(bc, (int, float)) else bc,
                               n_train=N, **kw)
    return recs


def run_verdict(recs, eps=0.25, **kw):
    return A.verdict(A.summarize_members(recs, eps), eps, **kw)


def test_verdict_supported():
    recs = three_members([32, 128, 512])  # bounds 48, 72, 168 -> max_batch 32, 64, 128
    sums = A.summarize_members(recs, 0.25)
    assert [s.info.name for s in sums] == ["mlp-d8-w128", "mlp-d4-w181", "mlp-d2-w256"]
    assert [s.max_batch.value for s in sums] == [32, 64, 128]
    assert [s.crit.b_crit for s in sums] == pytest.approx([32, 128, 512], rel=1e-6)
    v = A.verdict(sums, 0.25)
    assert v.outcome == A.SUPPORTED and v.reasons == ()
    for s in ("SUPPORTED", "eps = 0.25", "max_batch 32", "max_batch 64", "max_batch 128",
              "B_crit 32", "B_crit 512", "B_crit is increasing"):
        assert s in v.text, s


def test_verdict_not_supported():
    v = run_verdict(three_members([512, 128, 32]))
    assert v.outcome == A.NOT_SUPPORTED and "NOT SUPPORTED" in v.text
    assert "decreasing" in v.text


def test_verdict_inconclusive_equal():
    v = run_verdict(three_members([128, 128, 128]))  # all max_batch 64
    assert v.outcome == A.INCONCLUSIVE and any("same max_batch (64)" in r for r in v.reasons)


def test_verdict_inconclusive_mixed_trend():
    v = run_verdict(three_members([32, 512, 128]))  # 32, 128, 64
    assert v.outcome == A.INCONCLUSIVE and any("not monotone" in r for r in v.reasons)


def test_verdict_inconclusive_ceiling():
    # Perfect scaling everywhere: every member keeps epochs flat to the largest batch.
    v = run_verdict(three_members([1e6, 1e6, 1e6]))
    assert v.outcome == A.INCONCLUSIVE and any("ceiling" in r for r in v.reasons)
    assert "512+" in v.text


def test_verdict_ceiling_of_the_widest_only_still_decides():
    v = run_verdict(three_members([32, 128, 1e6]))
    assert v.outcome == A.SUPPORTED


def test_verdict_inconclusive_missing_member_data():
    missing = steps_for(32)
    missing[32] = None  # the smallest batch never reached
    v = run_verdict(three_members([missing, 128, 512]))
    assert v.outcome == A.INCONCLUSIVE
    assert any("mlp-d8-w128 has no max_batch" in r for r in v.reasons)


def test_verdict_inconclusive_grid_edge_unless_ignored():
    recs = three_members([32, 128, 512])
    # Make the largest LR at B=64 of the widest member reach in fewer steps: best at the grid edge.
    for r in recs:
        if r["member"] == "mlp-d2-w256" and r["batch_size"] == 64 and r["lr_multiplier"] == 2.0:
            r.update(status="reached", steps_to_target=10.0, epochs_to_target=10.0 * 64 / N)
    v = run_verdict(recs)
    assert v.outcome == A.INCONCLUSIVE and any("mlp-d2-w256 B=64" in r for r in v.reasons)
    v2 = run_verdict(recs, ignore_grid_edges=True)
    assert v2.outcome == A.SUPPORTED and any("edge" in c for c in v2.caveats)


def test_verdict_single_member_and_empty():
    v = run_verdict(member_records("mlp-d2-w256", 256, 2, steps_for(128), n_train=N))
    assert v.outcome == A.INCONCLUSIVE and any("only one member" in r for r in v.reasons)
    v = A.verdict([], 0.25)
    assert v.outcome == A.INCONCLUSIVE and "no trial" in v.text


def test_verdict_equal_width_members():
    recs = (member_records("a", 64, 2, steps_for(32), n_train=N)
            + member_records("b", 64, 4, steps_for(512), n_train=N))
    v = run_verdict(recs)
    assert v.outcome == A.INCONCLUSIVE and any("do not differ in width" in r for r in v.reasons)


def test_verdict_notes_unequal_budgets():
    recs = []
    for (name, w, d, p), bc in zip([("n", 64, 2, 10_000), ("w", 256, 2, 100_000)], [32, 512]):
        recs += member_records(name, w, d, steps_for(bc), n_train=N, params=p)
    v = run_verdict(recs)
    assert v.outcome == A.SUPPORTED and any("parameter budget" in c for c in v.caveats)


def test_analyze_groups_by_arch_and_handles_empty():
    out = A.analyze([], 0.25)
    assert out["summaries"] == [] and out["verdicts"][""].outcome == A.INCONCLUSIVE
    out = A.analyze(three_members([32, 128, 512]), 0.25)
    assert list(out["verdicts"]) == ["mlp"] and out["verdicts"]["mlp"].outcome == A.SUPPORTED


def test_batch_bound_at_init():
    recs = [rec(steps=10, gradient={"history": [{"step": 10, "examples": 320, "batch_bound": 5.0},
                                      {"step": 0, "examples": 0, "batch_bound": 40.0}]}),
            rec(tid="x", steps=10, gradient={"history": [{"step": 0, "examples": 0, "batch_bound": 60.0}],
                                   "noise_scale_ema": 12.0}),
            rec(tid="y", steps=10)]
    assert A.batch_bound_at_init(recs) == [40.0, 60.0]
    (s,) = A.summarize_members(recs)
    assert s.batch_bound_init == pytest.approx(50.0) and s.noise_scale_ema == pytest.approx(12.0)
