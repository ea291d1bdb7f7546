"""Owns the numbers of the noise-scale prediction of the critical batch (docs/prediction.md):
B_simple read off each run's gradient history at the target crossing (and averaged over the run),
per member with an interval over seeds, against the sweep's measured B_crit and model-free critical
batch B_x(1+eps); the width slope of log B_simple; and the sentence that reads them. The predict
study and its cost are `wide_tf.analysis.predict_study`'s; the report section and plot are
`wide_tf.report.prediction_section`'s.

Pure Python and NumPy on result.json records and analysis summaries, so every number is
unit-tested on hand-made records (tests/analysis/test_predict.py).

Why the value at the target: McCandlish et al. (2018) find the noise scale grows as the loss
falls (about 10x over a run), so the value at initialisation underestimates the batch at which
the *end* of training stops scaling. Steps-to-target is dominated by the late, slow part of the
run, so B_simple where the run crosses the target is the prediction; the step-weighted average over
the run (McCandlish's "averaged over training") is kept beside it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis.stats import baseline
from wide_tf.study import lr_grid

Z95 = 1.959963984540054

# ----------------------------------------------------------------------------------------------
# One run: B_simple along training, at the target and averaged over the run
# ----------------------------------------------------------------------------------------------

INTERPOLATED = "interpolated"  # two measurements bracket the crossing
EXTRAPOLATED = "extrapolated"  # past the last measurement by at most one measurement interval
MEASURED = "measured"  # a measurement at the crossing's step


def primary_target(rec: dict) -> dict:
    """The run's target: of `rec["targets"]` (several targets per run) the one `rec["target"]`
    names, else the first (the primary); without `targets`, the top-level fields (status,
    steps_to_target, steps_to_target_interp)."""
    targets = rec.get("targets")
    if not (isinstance(targets, list) and targets and isinstance(targets[0], dict)):
        return rec
    # A record re-aimed at another target (analysis.cells.records_for_target) names it in "target".
    want = rec.get("target") or {}
    for t in targets:
        if (t.get("metric"), t.get("value")) == (want.get("metric"), want.get("value")):
            return t
    return targets[0]


def target_step(rec: dict) -> float | None:
    """The step at which the run crossed its primary target (interpolated between evaluations
    when recorded), or None when it did not reach it."""
    t = primary_target(rec)
    if t.get("status", rec.get("status")) != "reached":
        return None
    v = t.get("steps_to_target_interp")
    if v is None:
        v = t.get("steps_to_target")
    return None if v is None else float(v)


def noise_history(rec: dict) -> tuple[np.ndarray, np.ndarray]:
    """(steps, B_simple) of the run's exact probe measurements with a finite positive B_simple,
    by step (one value per step)."""
    hist = ((rec.get("gradient") or {}).get("history")) or []
    pts = {}
    for h in hist:
        v, s = h.get("noise_scale"), h.get("step")
        if v is None or s is None:
            continue
        v = float(v)
        if math.isfinite(v) and v > 0:
            pts[float(s)] = v
    steps = np.array(sorted(pts), dtype=float)
    return steps, np.array([pts[s] for s in steps], dtype=float)


def at_step(steps: np.ndarray, values: np.ndarray, step: float) -> tuple[float | None, str]:
    """B_simple at `step`, interpolated linearly in log B_simple over steps between the two
    measurements around it. Past the last measurement it is extrapolated from the last two, by at
    most one measurement interval (a run that stops at the target usually ends between two probe
    measurements); further than that, or before the first measurement, None."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    if steps.size == 0 or step < steps[0]:
        return None, "no measurement"
    hit = np.flatnonzero(np.isclose(steps, step, rtol=0, atol=1e-9))
    if hit.size:
        return float(values[hit[0]]), MEASURED
    if step < steps[-1]:
        return float(np.exp(np.interp(step, steps, np.log(values)))), INTERPOLATED
    if steps.size < 2 or step - steps[-1] > steps[-1] - steps[-2]:
        return None, "the run ended more than one measurement interval after the last measurement"
    slope = (np.log(values[-1]) - np.log(values[-2])) / (steps[-1] - steps[-2])
    return float(np.exp(np.log(values[-1]) + slope * (step - steps[-1]))), EXTRAPOLATED


def run_average(steps: np.ndarray, values: np.ndarray, step: float) -> float | None:
    """B_simple averaged over the run up to `step`, weighted by steps (the trapezoid rule on the
    measurements, with the value at `step` from `at_step`): McCandlish's run-averaged variant.
    None without a measurement at the start and one at or near the end."""
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    end, _ = at_step(steps, values, step)
    if end is None or steps.size == 0 or steps[0] > 0 or step <= 0:
        return None
    keep = steps < step
    x = np.append(steps[keep], step)
    y = np.append(values[keep], end)
    return float(np.trapezoid(y, x) / (x[-1] - x[0]))


@dataclasses.dataclass(frozen=True)
class RunNoise:
    """One run's noise scale: at initialisation, at the target crossing, averaged over the run,
    and the two-batch estimator's final value (None where not measured)."""

    trial_id: str
    member: str
    batch_size: int
    seed: int
    target_step: float
    at_init: float | None
    at_target: float | None
    how: str  # INTERPOLATED | EXTRAPOLATED | MEASURED | why at_target is None
    run_average: float | None
    two_batch: float | None
    n_measurements: int


def run_noise(rec: dict) -> RunNoise | None:
    """The run's noise-scale readings; None when it did not reach its target."""
    s = target_step(rec)
    if s is None:
        return None
    steps, values = noise_history(rec)
    at, how = at_step(steps, values, s)
    tb = (rec.get("gradient") or {}).get("noise_scale_ema")
    return RunNoise(
        trial_id=str(rec.get("trial_id", "")),
        member=rec["member"],
        batch_size=int(rec["batch_size"]),
        seed=int(rec.get("seed") or 0),
        target_step=s,
        at_init=float(values[0]) if steps.size and steps[0] == 0 else None,
        at_target=at,
        how=how,
        run_average=run_average(steps, values, s),
        two_batch=float(tb) if tb is not None and math.isfinite(tb) and tb > 0 else None,
        n_measurements=int(steps.size),
    )


# ----------------------------------------------------------------------------------------------
# Intervals over seeds, ratios, slopes
# ----------------------------------------------------------------------------------------------


def t_quantile(df: int, q: float = 0.975) -> float:
    """Student-t quantile (SciPy, which scikit-learn already requires)."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A positive quantity estimated in log space: the geometric mean `value` with a 95%
    interval (None with one observation), the standard error of its log and the count."""

    value: float
    low: float | None
    high: float | None
    se_log: float | None  # of log(value); with n < 2 unknown
    n: int

    @property
    def log(self) -> float:
        return math.log(self.value)


def geometric(values: Sequence[float]) -> Estimate | None:
    """Geometric mean of positive values with a t interval on their logs (n - 1 df): seeds are
    independent runs, and log B_simple is closer to normal than B_simple."""
    v = np.log([float(x) for x in values if x is not None and x > 0 and math.isfinite(x)])
    if v.size == 0:
        return None
    m = float(v.mean())
    if v.size < 2:
        return Estimate(math.exp(m), None, None, None, 1)
    se = float(v.std(ddof=1) / math.sqrt(v.size))
    h = t_quantile(v.size - 1) * se
    return Estimate(math.exp(m), math.exp(m - h), math.exp(m + h), se, int(v.size))


def se_log_of_interval(low: float | None, high: float | None) -> float | None:
    """The standard error of a log quantity from its 95% interval (normal approximation)."""
    if low is None or high is None or not (low > 0 and high > 0):
        return None
    return (math.log(high) - math.log(low)) / (2 * Z95)


def ratio(pred: Estimate | None, measured) -> Estimate | None:
    """predicted / measured with a 95% interval from both uncertainties combined in log space
    (the seed interval of the prediction and the bootstrap interval of the measurement, taken as
    independent). `measured` is a critical_batch.Interval; a bound (beyond the batches tried) or
    an open interval gives the point ratio only."""
    if pred is None or measured is None or not measured.value or measured.value <= 0:
        return None
    r = pred.value / measured.value
    open_ = measured.is_bound or measured.low_open or measured.high_open
    se_m = None if open_ else se_log_of_interval(measured.low, measured.high)
    if pred.se_log is None or se_m is None:
        return Estimate(r, None, None, None, pred.n)
    # The prediction's t interval as an equivalent normal standard error, so both add in quadrature.
    se_p = (math.log(pred.high) - math.log(pred.low)) / (2 * Z95)
    se = math.hypot(se_p, se_m)
    return Estimate(r, r * math.exp(-Z95 * se), r * math.exp(Z95 * se), se, pred.n)


def width_slope(widths: Sequence[float], estimates: Sequence[Estimate | None]):
    """Slope of log(estimate) on log(width) across members with a random-effects interval
    (`wide_tf.analysis.stats.meta.random_effects_slope`: each member weighted by its seed
    variance plus the between-member variance). None with fewer than three members carrying a
    variance (the t interval has m - 2 df)."""
    use = [
        (w, e)
        for w, e in zip(widths, estimates)
        if e is not None and e.se_log is not None and w is not None and w > 0
    ]
    if len(use) < 3 or len({w for w, _ in use}) < 2:
        return None
    from wide_tf.analysis.stats.meta import random_effects_slope

    x = np.log([float(w) for w, _ in use])
    y = np.array([e.log for _, e in use])
    var = np.array([e.se_log**2 for _, e in use])
    return random_effects_slope(x, y, var)


def interval_estimate(iv) -> Estimate | None:
    """A critical_batch.Interval as an Estimate (its bootstrap interval as a normal se in log
    space); None for a bound or an interval with an open end, which has no standard error."""
    if iv is None or not iv.value or iv.is_bound or iv.low_open or iv.high_open:
        return None
    return Estimate(iv.value, iv.low, iv.high, se_log_of_interval(iv.low, iv.high), 0)


# ----------------------------------------------------------------------------------------------
# Per member: predicted against measured
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemberPrediction:
    name: str
    width: float | None
    depth: int | None
    batch_size: int | None  # the cell whose runs made the prediction
    runs: tuple  # RunNoise of that cell's chosen-rate runs that reached the target
    at_target: Estimate | None
    run_average: Estimate | None
    at_init: Estimate | None
    two_batch: Estimate | None
    b_crit: object | None  # critical_batch.Interval from the sweep's fit
    b_model_free: object | None  # critical_batch.Interval: the sweep's model-free critical batch
    ratio_b_crit: Estimate | None  # at_target / B_crit
    ratio_model_free: Estimate | None  # at_target / model-free
    ratio_avg_b_crit: Estimate | None  # run_average / B_crit

    @property
    def n_extrapolated(self) -> int:
        return sum(r.how == EXTRAPOLATED for r in self.runs)


def prediction_runs(summary, records: Sequence[dict]) -> tuple[int | None, list[RunNoise]]:
    """The chosen-rate runs, on every seed, of the member's smallest batch whose learning rate was
    chosen (the cell the prediction is read from), as RunNoise (reached runs only)."""
    for cell in summary.cells:
        if cell.best_multiplier is None:
            continue
        runs = [
            run_noise(r)
            for r in records
            if r["member"] == summary.info.name
            and int(r["batch_size"]) == cell.batch_size
            and lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == cell.best_multiplier
        ]
        return cell.batch_size, sorted(
            (r for r in runs if r is not None), key=lambda r: (r.seed, r.trial_id)
        )
    return None, []


def member_prediction(summary, records: Sequence[dict]) -> MemberPrediction:
    batch, runs = prediction_runs(summary, records)
    at = geometric([r.at_target for r in runs])
    avg = geometric([r.run_average for r in runs])
    b_crit = summary.curve.b_crit if summary.curve else None
    model_free = summary.b_model_free
    return MemberPrediction(
        name=summary.info.name,
        width=summary.info.width,
        depth=summary.info.depth,
        batch_size=batch,
        runs=tuple(runs),
        at_target=at,
        run_average=avg,
        at_init=geometric([r.at_init for r in runs]),
        two_batch=geometric([r.two_batch for r in runs]),
        b_crit=b_crit,
        b_model_free=model_free,
        ratio_b_crit=ratio(at, b_crit),
        ratio_model_free=ratio(at, model_free),
        ratio_avg_b_crit=ratio(avg, b_crit),
    )


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The whole check of one study: members, slopes, the pooled ratio and what it says."""

    members: tuple  # MemberPrediction, narrowest first
    slope_predicted: object | None  # MetaSlope of log B_simple(target) on log width
    slope_measured: object | None  # the sweep's slope of log B_crit (a MetaSlope)
    slope_model_free: object | None  # the sweep's slope of its model-free batch (the verdict's)
    pooled_ratio: Estimate | None  # geometric mean over members of at_target / B_crit
    pooled_ratio_model_free: Estimate | None  # ... of at_target / the model-free batch
    has_history: bool  # some run measured B_simple after initialisation
    gradient_every_examples: int | None
    eval_every_examples: int | None
    sweep: bool  # the study measured more than one batch per member
    spent: dict  # what the study's finished runs cost (measured_cost)
    against_constant: baseline.AgainstConstant | None = None  # the size, against a constant

    @property
    def n_extrapolated(self) -> int:
        return sum(m.n_extrapolated for m in self.members)


def _cfg(config: dict | None, section: str, key: str):
    try:
        return (config or {})[section][key]
    except (KeyError, TypeError):
        return None


def compare(
    records: Sequence[dict],
    summaries,
    config: dict | None = None,
    sweep_slope=None,
    model_free_slope=None,
):
    """The prediction for every member of `summaries` (`members.summarize_members` of
    `records`), against the sweep's measurements. `sweep_slope` and `model_free_slope` are the
    study's own slopes of log B_crit and of its model-free batch B_x(1+eps) on log width (the
    verdict's: `verdict.decide(...).b_crit_slope` and `.model_free_slope`)."""
    members = tuple(member_prediction(s, records) for s in summaries)
    has_history = any(
        any(
            (h.get("step") or 0) > 0 and h.get("noise_scale") is not None
            for h in ((r.get("gradient") or {}).get("history") or [])
        )
        for r in records
    )
    widths = [m.width for m in members]
    logs = [m.ratio_b_crit.log for m in members if m.ratio_b_crit is not None]
    logs_mf = [m.ratio_model_free.log for m in members if m.ratio_model_free is not None]
    return Comparison(
        members=members,
        slope_predicted=width_slope(widths, [m.at_target for m in members]),
        slope_measured=sweep_slope,
        slope_model_free=model_free_slope,
        pooled_ratio=geometric([math.exp(v) for v in logs]) if logs else None,
        pooled_ratio_model_free=geometric([math.exp(v) for v in logs_mf]) if logs_mf else None,
        has_history=has_history,
        gradient_every_examples=_cfg(config, "train", "gradient_every_examples"),
        eval_every_examples=_cfg(config, "train", "eval_every_examples"),
        sweep=any(len({c.batch_size for c in s.cells}) > 1 for s in summaries),
        spent=measured_cost(records),
        against_constant=_against_constant(members),
    )


def _against_constant(members) -> baseline.AgainstConstant | None:
    """The members with B_simple at the target and a B_crit inside the batches tried."""
    use = [
        (m.at_target.value, m.b_crit.value)
        for m in members
        if m.at_target is not None
        and m.b_crit is not None
        and m.b_crit.value
        and not m.b_crit.is_bound
    ]
    return baseline.against_constant([a for a, _ in use], [b for _, b in use]) if use else None


def measured_cost(records: Sequence[dict]) -> dict:
    """What the finished runs cost: runs, training examples, exact-probe examples (measurements x
    probe size, the probe size from the run's protocol, else its training set) and the summed
    wall time in seconds."""
    examples = probes = wall = 0.0
    for r in records:
        examples += float(r.get("steps") or 0) * float(r.get("batch_size") or 0)
        n = ((r.get("protocol") or {}).get("probe_size")) or r.get("num_train") or 0
        probes += len(((r.get("gradient") or {}).get("history")) or []) * float(n)
        wall += float(r.get("wall_time_s") or 0)
    return {"runs": len(records), "examples": examples, "probe_examples": probes, "wall_s": wall}


def agreement_words(r: Estimate) -> str:
    """How close a predicted / measured ratio is, in the terms the literature uses."""
    lo = r.low if r.low is not None else r.value
    hi = r.high if r.high is not None else r.value
    if 0.5 <= lo and hi <= 2.0:
        return "within a factor of 2"
    if 0.1 <= lo and hi <= 10.0:
        return "within an order of magnitude (McCandlish et al. 2018's claim)"
    if hi < 0.1:
        return f"an underestimate by more than 10x (about {1 / r.value:.0f}x)"
    if lo > 10.0:
        return f"an overestimate by more than 10x (about {r.value:.0f}x)"
    return "not resolved: its interval reaches beyond a factor of 10"


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def fmt_est(e: Estimate | None, unit: str = "seed") -> str:
    """'175 (163 to 189)': the value and its 95% interval; '(1 seed)' when it has none."""
    if e is None:
        return "-"
    if e.low is None:
        return _num(e.value) + (f" (1 {unit})" if e.n == 1 else "")
    return f"{_num(e.value)} ({_num(e.low)} to {_num(e.high)})"


def fmt_slope(sl) -> str:
    if sl is None:
        return "-"
    return f"{sl.value:+.2f} (95% CI {sl.low:+.2f} to {sl.high:+.2f})"


def slopes_differ(a, b) -> tuple[float, float, float] | None:
    """(difference, low, high) of two slopes, their standard errors combined as independent."""
    if a is None or b is None or a.se is None or b.se is None:
        return None
    d = a.value - b.value
    se = math.hypot(a.se, b.se)
    return d, d - Z95 * se, d + Z95 * se


def sentence(c: Comparison) -> str:
    """One sentence: does the noise scale predict the critical batch here, and its width trend."""
    if not c.has_history:
        return (
            "No run measured B_simple after initialisation, so the noise scale cannot be read at "
            "the target: " + cadence_fix(c)
        )
    if not c.sweep:
        return (
            "This study measured one batch size per member: the B_simple column is its prediction "
            "of B_crit, checked against no sweep here (docs/local_agreement.md holds what such a "
            "prediction has been worth on the local sweeps)."
        )
    if c.pooled_ratio is None:
        return (
            "No member has both a B_simple at the target and a fitted B_crit, so the prediction "
            "cannot be checked on this study."
        )
    r = c.pooled_ratio
    parts = [
        f"The noise scale at the target is {fmt_est(r, 'member')} times the measured B_crit "
        "(geometric mean "
        f"over {r.n} members, 95% CI over members): {agreement_words(r)}."
    ]
    if c.pooled_ratio_model_free is not None:
        parts.append(
            "Against the model-free critical batch it is "
            f"{fmt_est(c.pooled_ratio_model_free, 'member')} times."
        )
    if c.against_constant is not None:
        parts.append(constant_sentence(c.against_constant))
    # The trend against the verdict's own slope (the model-free batch), else B_crit's.
    theirs, name = c.slope_model_free, "the sweep's model-free batch"
    if theirs is None:
        theirs, name = c.slope_measured, "the sweep's B_crit"
    d = slopes_differ(c.slope_predicted, theirs)
    if d is None:
        parts.append(
            "Its width trend cannot be compared (fewer than three members with a B_simple "
            "interval, or no sweep slope)."
        )
    else:
        same = d[1] <= 0 <= d[2]
        parts.append(
            f"Across width, log B_simple changes at slope {fmt_slope(c.slope_predicted)} against "
            f"{fmt_slope(theirs)} for {name}: "
            + (
                f"their difference is not resolved ({d[0]:+.2f}, 95% CI {d[1]:+.2f} to "
                f"{d[2]:+.2f}): the noise scale neither reproduces nor refutes the trend."
                if same
                else f"the noise scale gets the trend wrong (difference {d[0]:+.2f}, 95% CI "
                f"{d[1]:+.2f} to {d[2]:+.2f})."
            )
        )
    return " ".join(parts)


def _fold(f: baseline.Fold) -> str:
    return f"{f.value:.3g} ({f.low:.3g} to {f.high:.3g})"


def constant_sentence(k: baseline.AgainstConstant) -> str:
    """The right size, against a constant: which misses a member's B_crit by less."""
    d, lo, hi = k.difference
    verdict = {
        "noise scale": "the noise scale is closer",
        "constant": "the constant is closer",
        "not resolved": "which is closer is not resolved",
    }[k.closer]
    return (
        f"Against a constant: B_simple misses a member's B_crit by a factor of "
        f"{_fold(k.noise_scale)} (root mean square in log over {k.n} members, 95% "
        f"bootstrap interval over members), one constant for every member (the geometric mean of "
        f"their B_crit, {_num(k.constant_value)}, given the measured scale) by "
        f"{_fold(k.constant)}, and B_simple with its own mean ratio divided out by "
        f"{_fold(k.rescaled)}; the difference in log error is {d:+.2f} (95% CI "
        f"{lo:+.2f} to {hi:+.2f}): {verdict}."
    )


def cadence_fix(c: Comparison) -> str:
    every = c.eval_every_examples or 0
    want = every if every > 0 else "one epoch of examples"
    return (
        f"train.gradient_every_examples is {c.gradient_every_examples or 0}; set it to the "
        f"evaluation cadence (train.eval_every_examples = {want}), e.g. "
        f"--config.train.gradient_every_examples={every if every > 0 else 'N'}, so the exact "
        "probe runs at every evaluation and a measurement lands at the target crossing."
    )
