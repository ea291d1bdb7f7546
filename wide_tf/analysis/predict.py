"""Owns the noise-scale prediction of the critical batch (issue 18; docs/prediction.md): B_simple
read off each run's gradient history at the target crossing (and averaged over the run), per
member with an interval over seeds, against the sweep's measured B_crit and model-free batch; the
width slope of log B_simple; the `predict` study (`as_predict_config`) and its cost against the
full sweep; and the agreement measured on the local sweeps (`LOCAL_AGREEMENT`).

Pure Python and NumPy on result.json records and analysis summaries: config files import it
before TensorFlow starts, and every number is unit-tested on hand-made records
(tests/test_predict.py).

Why the value at the target: McCandlish et al. (2018) find the noise scale grows as the loss
falls (about 10x over a run), so the value at initialisation underestimates the batch at which
the *end* of training stops scaling. Steps-to-target is dominated by the late, slow part of the
run, so B_simple where the run crosses the target is the prediction; the step-weighted average over
the run (McCandlish's "averaged over training") is kept beside it.

    python -m wide_tf.analysis.predict --workdir=DIR          # the agreement table of a finished
    study python -m wide_tf.analysis.predict --config=configs/mlp.py:local   # what its predict
    study costs
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.spec import plan as plan_lib
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
    # A record re-aimed at another target (analysis.records_for_target) names it in "target".
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
    """The prediction for every member of `summaries` (analysis.summarize_members of `records`),
    against the sweep's measurements. `sweep_slope` and `model_free_slope` are the study's own
    slopes of log B_crit and of its model-free batch on log width (the verdict's:
    `analysis.decide(...).b_crit_slope` and `.primary_slope`)."""
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
    )


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
            "of B_crit, checked against no sweep here (see the local-sweep table for what such a "
            "prediction has been worth)."
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
                f"the two slopes are consistent (difference {d[0]:+.2f}, 95% CI {d[1]:+.2f} to "
                f"{d[2]:+.2f})."
                if same
                else f"the noise scale gets the trend wrong (difference {d[0]:+.2f}, 95% CI "
                f"{d[1]:+.2f} to {d[2]:+.2f})."
            )
        )
    return " ".join(parts)


def cadence_fix(c: Comparison) -> str:
    every = c.eval_every_examples or 0
    want = every if every > 0 else "one epoch of examples"
    return (
        f"train.gradient_every_examples is {c.gradient_every_examples or 0}; set it to the "
        f"evaluation cadence (train.eval_every_examples = {want}), e.g. "
        f"--config.train.gradient_every_examples={every if every > 0 else 'N'}, so the exact "
        "probe runs at every evaluation and a measurement lands at the target crossing."
    )


# ----------------------------------------------------------------------------------------------
# The predict study: any study config, one small batch per member
# ----------------------------------------------------------------------------------------------

PROBE_CAP = 4096  # the largest exact probe a predict study uses (as_predict_config)


def as_predict_config(
    config,
    batch: int | None = None,
    seeds: int = 3,
    max_lr_extensions: int = 1,
    probe_cap: int = PROBE_CAP,
):
    """Turns a study config into its `predict` study, in place (and returns it): the same members,
    target, optimizer and learning-rate grid, at one batch size (`batch`, default the sweep's
    smallest), the grid on the tuning seed with at most `max_lr_extensions` extensions, the chosen
    rate on `seeds` seeds in all, and the exact B_simple measured at every evaluation (and at
    initialisation) on a probe of at most `probe_cap` training examples. A given learning rate: set
    `sweep.lr_multipliers = [m]` and `sweep.extend_lr_grid = False` afterwards.

    The report of such a study carries the prediction (wide_tf/report/prediction.py)."""
    s, t = config.sweep, config.train
    if s is None or not list(s.batch_sizes):
        raise ValueError("as_predict_config needs a study config with sweep.batch_sizes")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    s.batch_sizes = [int(batch or min(s.batch_sizes))]
    tuning = list(s.seeds)[:1] or [0]
    more = [x for x in list(s.confirm_seeds) + list(range(1, seeds + 1)) if x not in tuning]
    s.seeds = tuning
    s.confirm_seeds = list(dict.fromkeys(more))[: seeds - 1]
    s.max_lr_extensions = min(s.max_lr_extensions, max_lr_extensions)
    # At every evaluation: with stop_at_target the run ends at the evaluation that sees the target,
    # so a measurement lands on (or one interval after) the interpolated crossing.
    # With eval_every_examples = 0 a study evaluates once an epoch: measure once an epoch too.
    n_train = _num_train(config)
    every = int(t.eval_every_examples) or n_train
    if not every:
        raise ValueError(
            f"as_predict_config: set train.eval_every_examples (data set {config.data.name!r} "
            "has no known size, so no epoch to measure once per)"
        )
    t.gradient_every_examples = every
    t.gradient_at_init = True
    # A probe of the whole of a large training set would cost more than the training between two
    # measurements (60,000 MNIST digits every 30,000 examples); a probe of n examples measures
    # B_simple up to about n, so the cap only matters for sets far larger than the critical batch.
    if n_train and probe_cap and (t.probe_size or n_train) > probe_cap:
        t.probe_size = int(probe_cap)
    return config


def _num_train(config) -> int | None:
    from wide_tf.config import validate  # TensorFlow-free: the sizes of the known data sets

    try:
        return validate._dataset(config)[0]
    except Exception:  # noqa: BLE001  (an unknown data set is validate's to report, not ours)
        return None


# ----------------------------------------------------------------------------------------------
# Cost: the predict study against the full sweep (plans, from the configs alone)
# ----------------------------------------------------------------------------------------------

# The cost model of configs/wrn.py (docs/tpu.md, "What the WRN study costs"): 1.3 GFLOP per training
# example (3 x the 0.42 GFLOP forward pass of WRN-16-2.95), evaluation adds about 26%, a v4 chip
# peaks at 275 TFLOP/s bf16, and networks this small reach 2-10% of peak (an assumption).
WRN_FLOP_PER_EXAMPLE = 1.3e9
WRN_EVAL_OVERHEAD = 0.26
V4_CHIP_PEAK_FLOPS = 275e12
UTILISATION = (0.02, 0.10)
# One exact probe example costs about 2 training examples (wide_tf.tools.bench: exact diversity /
# one training step 1.6-2.0 for WRN-16-2 and the large MLP at B = 256 and 1,024;
# docs/benchmarks.md).
PROBE_COST_PER_EXAMPLE = 2.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a study will run, at most: trials (with every grid extension taken) and training
    examples (every trial to its budget; trials that stop at the target use fewer)."""

    members: int
    batches: tuple
    runs_min: int
    runs_max: int
    examples_max: float  # training examples, every run to its budget
    probe_examples_max: float  # exact-probe examples (each about 2 training examples of compute)

    def chip_hours(self, flop_per_example: float = WRN_FLOP_PER_EXAMPLE) -> tuple[float, float]:
        """(low, high) v4 chip-hours on the cost model of docs/tpu.md."""
        flop = flop_per_example * (
            self.examples_max * (1 + WRN_EVAL_OVERHEAD)
            + PROBE_COST_PER_EXAMPLE * self.probe_examples_max
        )
        return tuple(flop / (V4_CHIP_PEAK_FLOPS * u) / 3600 for u in reversed(UTILISATION))


def plan(config, num_train: int, members: int | None = None) -> Plan:
    """The plan of a study config whose training set has `num_train` examples."""
    s, t = config.sweep, config.train
    if members is None:  # the family's members: widths at a fixed depth, else depths
        members = len(s.family.widths if s.family.kind == "width" else s.family.depths) or 1
    m = members
    batches = tuple(int(b) for b in s.batch_sizes)
    grid = len(s.lr_multipliers) * len(s.seeds)
    ext = (s.max_lr_extensions if s.extend_lr_grid else 0) * len(s.seeds)
    confirm = len(s.confirm_seeds)
    per_cell_min, per_cell_max = grid + confirm, grid + ext + confirm
    examples = probes = 0.0
    for b in batches:
        steps = plan_lib.budget_steps(
            max_steps=t.max_steps,
            max_epochs=t.max_epochs,
            min_steps=t.min_steps,
            num_train=num_train,
            batch=b,
        )
        examples += per_cell_max * steps * b
        probe_n = t.probe_size or num_train
        if t.gradient_every_examples:
            probes += per_cell_max * probe_n * (steps * b // t.gradient_every_examples + 1)
        elif t.gradient_at_init:
            probes += per_cell_max * probe_n
    return Plan(
        members=m,
        batches=batches,
        runs_min=m * len(batches) * per_cell_min,
        runs_max=m * len(batches) * per_cell_max,
        examples_max=m * examples,
        probe_examples_max=m * probes,
    )


# ----------------------------------------------------------------------------------------------
# What the prediction was worth on the local sweeps (measured; see docs/prediction.md)
# ----------------------------------------------------------------------------------------------

# From `python -m wide_tf.analysis.predict --workdir=DIR --study=NAME --source=TEXT` on the local
# studies (it prints the entry); each entry says where its numbers came from. Ratios are B_simple at
# the target / the sweep's fitted B_crit. Replace an entry when its study's design changes.
LOCAL_AGREEMENT: tuple = (
    {
        "study": "configs/mlp.py:local (7 MLPs at 50k parameters, widths 64-667, 8x8 digits, "
        "target 97%)",
        "source": "the 458-run sweep of main's design (edbe519) at 16e19f7 with "
        "--config.train.gradient_every_examples=288, run 2026-12-01 on a shared 2-core "
        "machine (32m08s wall); B_simple read at batch 8 on 5 seeds per member",
        "pooled_ratio": "2.37 (1.47 to 3.83)",
        "pooled_ratio_model_free": "1.59 (0.905 to 2.78)",
        "slope_predicted": "-0.19 (95% CI -0.81 to +0.43)",
        "slope_measured": "+0.41 (95% CI +0.21 to +0.61)",
        "slope_model_free": "+0.30 (95% CI +0.19 to +0.42)",
        "rows": [
            {
                "member": "mlp-d12-w64",
                "width": 64.0,
                "predicted": "320 (225 to 456)",
                "measured": "48.8 (95% CI 36.9 to 64.7)",
                "ratio": "6.55 (4.17 to 10.3)",
                "measured_model_free": "59.4 (95% CI 45.5 to 80.4)",
                "ratio_model_free": "5.39 (3.42 to 8.48)",
            },
            {
                "member": "mlp-d8-w79",
                "width": 79.0,
                "predicted": "137 (65.6 to 287)",
                "measured": "46.3 (95% CI 37.5 to 55.8)",
                "ratio": "2.96 (1.38 to 6.37)",
                "measured_model_free": "71.5 (95% CI 53.8 to 85.5)",
                "ratio_model_free": "1.92 (0.885 to 4.16)",
            },
            {
                "member": "mlp-d6-w92",
                "width": 92.0,
                "predicted": "77.2 (23.6 to 252)",
                "measured": "49.5 (95% CI 45.3 to 53.8)",
                "ratio": "1.56 (0.476 to 5.11)",
                "measured_model_free": "79.4 (95% CI 62.7 to 94.3)",
                "ratio_model_free": "0.971 (0.292 to 3.23)",
            },
            {
                "member": "mlp-d4-w117",
                "width": 117.0,
                "predicted": "149 (94.7 to 234)",
                "measured": "54.7 (95% CI 41.8 to 73)",
                "ratio": "2.72 (1.6 to 4.62)",
                "measured_model_free": "79.1 (95% CI 54.6 to 100)",
                "ratio_model_free": "1.88 (1.09 to 3.24)",
            },
            {
                "member": "mlp-d3-w140",
                "width": 140.0,
                "predicted": "95 (34.5 to 262)",
                "measured": "61.3 (95% CI 49.4 to 76)",
                "ratio": "1.55 (0.55 to 4.37)",
                "measured_model_free": "93.4 (95% CI 61.4 to 132)",
                "ratio_model_free": "1.02 (0.344 to 3.01)",
            },
            {
                "member": "mlp-d2-w189",
                "width": 189.0,
                "predicted": "115 (59.5 to 223)",
                "measured": "60.5 (95% CI 38.9 to 92.1)",
                "ratio": "1.9 (0.865 to 4.19)",
                "measured_model_free": "93 (95% CI 54.8 to 140)",
                "ratio_model_free": "1.24 (0.551 to 2.78)",
            },
            {
                "member": "mlp-d1-w667",
                "width": 667.0,
                "predicted": "139 (71.7 to 270)",
                "measured": "79.8 (95% CI 46.8 to 153)",
                "ratio": "1.74 (0.716 to 4.24)",
                "measured_model_free": "130 (95% CI 86 to 176)",
                "ratio_model_free": "1.07 (0.503 to 2.27)",
            },
        ],
    },
    {
        "study": "the earlier configs/mlp.py:local (4 MLPs at 50k parameters, widths 79-667, "
        "8x8 digits, target 99%)",
        "source": "the 230-run sweep at daad131 with --config.train.gradient_every_examples=720, "
        "run 2026-12-01 on a shared 2-core machine (12m26s wall); B_simple read at batch 16 on 5 "
        "seeds per member; the sweep's B_crit equal to the README's of daad131",
        "pooled_ratio": "1.69 (0.859 to 3.32)",
        "slope_predicted": "+0.08 (95% CI -0.70 to +0.86)",
        "slope_measured": "-0.23 (95% CI -0.55 to +0.08)",
        "rows": [
            {
                "member": "mlp-d8-w79",
                "width": 79.0,
                "predicted": "169 (107 to 269)",
                "measured": "92.9 (95% CI 51.1 to 179)",
                "ratio": "1.82 (0.838 to 3.97)",
            },
            {
                "member": "mlp-d4-w117",
                "width": 117.0,
                "predicted": "163 (77.3 to 344)",
                "measured": "150 (95% CI 112 to 198)",
                "ratio": "1.09 (0.488 to 2.42)",
            },
            {
                "member": "mlp-d2-w189",
                "width": 189.0,
                "predicted": "177 (79 to 396)",
                "measured": "126 (95% CI 102 to 157)",
                "ratio": "1.4 (0.608 to 3.22)",
            },
            {
                "member": "mlp-d1-w667",
                "width": 667.0,
                "predicted": "203 (72.8 to 566)",
                "measured": "69.2 (95% CI 45.2 to 109)",
                "ratio": "2.93 (0.962 to 8.94)",
            },
        ],
    },
    {
        "study": "the earlier configs/wrn.py:local (WRN-52/28/10 at 50k parameters, k "
        "0.25-0.79, 8x8 digits, target 99%)",
        "source": "predicted by configs/wrn.py:predict_local at 08e37ba (16 runs at batch 16, 3 "
        "seeds per member, B_simple once an epoch: --config.train.gradient_every_examples=1440; "
        "10m38s wall on a shared 2-core machine), measured: daad131's 70-run sweep of the same "
        "protocol (its B_crit intervals), so predicted and measured come from different runs; "
        "WRN-10 reaches the target in 1.5-2 epochs, so its value is extrapolated from 2-3 "
        "measurements",
        "pooled_ratio": "1.79 (0.253 to 12.6)",
        "slope_predicted": "+0.37 (95% CI -3.32 to +4.06)",
        "slope_measured": "-0.93 (95% CI -1.40 to -0.49)",
        "rows": [
            {
                "member": "wrn-52-0.25",
                "width": 0.25,
                "predicted": "218 (46.8 to 1,017)",
                "measured": "203 (95% CI 136 to 293)",
                "ratio": "1.07 (0.22 to 5.25)",
            },
            {
                "member": "wrn-28-0.36",
                "width": 0.36,
                "predicted": "233 (34.3 to 1,578)",
                "measured": "194 (95% CI 131 to 277)",
                "ratio": "1.2 (0.171 to 8.43)",
            },
            {
                "member": "wrn-10-0.79",
                "width": 0.79,
                "predicted": "327 (208 to 514)",
                "measured": "74 (95% CI 51 to 108)",
                "ratio": "4.42 (2.46 to 7.95)",
            },
        ],
    },
)


def format_local_agreement(entries: Sequence[dict] = LOCAL_AGREEMENT) -> list[str]:
    """Markdown lines: the agreement measured on the local sweeps, with their sources."""
    if not entries:
        return ["No local sweep has been measured with the gradient cadence yet."]
    lines = []
    for e in entries:
        mf = e.get("slope_model_free")
        lines += [
            f"**{e['study']}** ({e['source']}): B_simple at the target / B_crit, pooled over "
            f"members: {e['pooled_ratio']}"
            + (
                f"; / the model-free batch: {e['pooled_ratio_model_free']}"
                if e.get("pooled_ratio_model_free", "-") != "-"
                else ""
            )
            + f". Width slope of log B_simple {e['slope_predicted']}; the sweep's: log B_crit "
            f"{e['slope_measured']}" + (f", model-free {mf}" if mf and mf != "-" else "") + ".",
            "",
            "| member | width | B_simple at target | measured B_crit | ratio | model-free batch "
            "| ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['member']} | {r['width']:g} | {r['predicted']} | {r['measured']} | "
            f"{r['ratio']} | {r.get('measured_model_free', '-')} | "
            f"{r.get('ratio_model_free', '-')} |"
            for r in e["rows"]
        ]
        lines.append("")
    return lines


def agreement_entry(c: Comparison, study: str, source: str) -> dict:
    """A LOCAL_AGREEMENT entry (formatted strings) from a study's comparison."""
    from wide_tf.analysis import verdict as analysis

    return {
        "study": study,
        "source": source,
        "pooled_ratio": fmt_est(c.pooled_ratio, "member"),
        "pooled_ratio_model_free": fmt_est(c.pooled_ratio_model_free, "member"),
        "slope_predicted": fmt_slope(c.slope_predicted),
        "slope_measured": fmt_slope(c.slope_measured),
        "slope_model_free": fmt_slope(c.slope_model_free),
        "rows": [
            {
                "member": m.name,
                "width": float(m.width or 0),
                "predicted": fmt_est(m.at_target),
                "measured": analysis.fmt_interval(m.b_crit),
                "ratio": fmt_est(m.ratio_b_crit),
                "measured_model_free": analysis.fmt_interval(m.b_model_free),
                "ratio_model_free": fmt_est(m.ratio_model_free),
            }
            for m in c.members
        ],
    }


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


def cost_lines(config, spec: str = "the study") -> list[str]:
    """The predict study of `config` against the full sweep: runs, training examples (every run
    to its budget: an upper bound) and, for a WRN, v4 chip-hours on docs/tpu.md's cost model."""
    import copy

    from wide_tf.config import validate

    n_train = validate._dataset(config)[0]
    full = plan(config, n_train)
    small = plan(as_predict_config(copy.deepcopy(config)), n_train)
    lines = [
        f"{spec}: {full.members} members, batches {', '.join(map(str, full.batches))}; "
        f"its predict study: batch {small.batches[0]}",
        f"  runs: full sweep {full.runs_min}-{full.runs_max}, predict {small.runs_min}-"
        f"{small.runs_max} ({small.runs_max / full.runs_max:.0%} of the sweep at most)",
        f"  training examples, every run to its budget: full sweep {full.examples_max:.3g}, "
        f"predict {small.examples_max:.3g} ({small.examples_max / full.examples_max:.0%}); exact "
        f"probe examples {full.probe_examples_max:.3g} vs {small.probe_examples_max:.3g}",
    ]
    if config.model.arch == "wrn" and validate.DATASETS[config.data.name][4] is not None:
        (flo, fhi), (plo, phi) = full.chip_hours(), small.chip_hours()
        lines.append(
            "  v4 chip-hours at 2-10% of peak (docs/tpu.md cost model, runs to their budget): "
            f"full sweep {flo:.0f}-{fhi:.0f}, predict {plo:.1f}-{phi:.1f}"
        )
    return lines


def _fail(message: str) -> int:
    import sys

    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv=None) -> int:
    """`--workdir=DIR`: the agreement table of a finished study (and its LOCAL_AGREEMENT entry
    with `--source=TEXT`); `--config=SPEC`: what its predict study costs against the sweep."""
    import argparse
    import json

    ap = argparse.ArgumentParser(
        prog="python -m wide_tf.analysis.predict", description=main.__doc__
    )
    ap.add_argument("--workdir", help="a study workdir: the noise-scale prediction against it")
    ap.add_argument("--config", help="a study config (configs/wrn.py): its predict study's cost")
    ap.add_argument("--source", help="with --workdir: print a LOCAL_AGREEMENT entry with this")
    ap.add_argument("--study", help="with --source: the study's name in that entry")
    args = ap.parse_args(argv)
    if not (args.workdir or args.config):
        return _fail("nothing to do; pass --workdir=DIR (a finished study) or --config=SPEC")
    if args.config:
        from wide_tf.config import loader as configs_loader
        from wide_tf.config import validate

        try:
            config = configs_loader.load_config(args.config)
        except validate.UsageError as e:
            return _fail(str(e).splitlines()[0])
        if config.get("sweep") is None or config.get("kind", "study") != "study":
            return _fail(f"{args.config} is not a study with a sweep; pass a study config")
        print("\n".join(cost_lines(config, args.config)))
    if args.workdir:
        from wide_tf import report
        from wide_tf.analysis import verdict as analysis
        from wide_tf.report import prediction

        try:
            config, records, _ = report.read_workdir(args.workdir)
        except report.ReportError as e:
            return _fail(f"{e}; pass the workdir of a study (python -m wide_tf.main ...)")
        if not records:
            return _fail(f"{args.workdir} holds no finished trial; run the study first")
        result = analysis.analyze(records, analysis.DEFAULT_EPS)
        c = prediction.compare_study(config, records, result)
        print("\n".join(prediction.md_prediction(c)))
        if args.source:
            entry = agreement_entry(c, args.study or args.workdir, args.source)
            print(json.dumps(entry, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
