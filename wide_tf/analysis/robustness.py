"""Owns what the verdict paragraph says about its own strength: the power of the study's design
at its estimated noise (`min_detectable`, `power_at`) and the overhead curve (`sensitivity`).

* **Power.** A simulated study draws each member's log B_x(1+eps) from that member's own
  sampling replicates (the study's design at its estimated noise: the cell effects, the seed noise
  with its (member, seed) share, the budgets' censoring, the evaluation cadence's rounding),
  shifted onto a line of slope b, plus the members' scatter about the line (tau^2, the slope's
  REML estimate); the rule's slope, interval, leave-one-out check and check without the member of
  the largest leverage (`wide_tf.analysis.stats.power`) then decide it. The minimum detectable
  slope is the smallest b found 80% of the time. It is not read off the realised interval's q,
  which on 5 df is itself noisy (q = 0.245 gave "0.15", while the design found a slope
  of 0.35 in 28-35% of simulated studies).
  Beside it, the design's power at the slope it observed (`power_at`; post hoc, so read it as
  what a replicate of the same size would find if the observed slope were the truth).
* **Overhead, as a curve.** Every finished run's steps-to-target plus k (a run pushed past its
  budget counts as not reaching the target), the whole analysis re-run at each k of
  `OVERHEAD_STEPS`: the slope and its interval against k (`overhead_curve`), not one "k that
  erases it", whose value moves between machines (3 to 7 steps on the main study) while the
  curve does not. An effect that a 10-step optimizer transient erases is a statement about that
  transient.
* **Leverage** is the rule's own check (`decision.heaviest_check`): the slope without the member
  of the largest leverage at `decision.HEAVIEST_LEVEL`; no 95% verdict is formed without it.

Pure NumPy on records and summaries; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis import decision as dec
from wide_tf.analysis.cells import budget_steps
from wide_tf.analysis.members import summarize_members
from wide_tf.analysis.stats import power

POWER_STUDIES = 1000
SENSITIVITY_BOOTSTRAP = 200


def _design(d: dec.Decision, n: int, seed: int):
    """(x, v, noise rows (n, m)) of the model-free slope's members."""
    use, _ = dec.member_entries(
        [s for s in d.members if s.info.name in d.model_free_members], "model_free"
    )
    rng = np.random.default_rng(seed)
    x = np.log([dec.axis_value(u[0], d.axis) for u in use])
    v = np.array([u[2] for u in use])
    cols = []
    for s, y, _, _ in use:
        reps = s.curve.log_b_model_free_sampling_reps
        reps = reps[np.isfinite(reps)]
        cols.append(rng.choice(reps, size=n) - y)
    tau = math.sqrt(d.model_free_slope.tau2)
    noise = np.stack(cols, axis=1) + tau * rng.standard_normal((n, len(use)))
    return x, v, noise


def min_detectable(d: dec.Decision, n: int = POWER_STUDIES, seed: int = 0) -> float | None:
    """The slope (either sign, on the decision's log axis) that this design detects 80% of the
    time at its estimated noise (module docstring); None without a model-free slope or when even
    a slope of 4 is not."""
    if d.model_free_slope is None:
        return None
    x, v, noise = _design(d, n, seed)
    return power.min_detectable(x, v, noise, dec.HEAVIEST_LEVEL)


def with_overhead(records: Sequence[dict], k: float) -> list[dict]:
    """The records with k steps added to every finished run's steps-to-target."""
    out = []
    for r in records:
        if r.get("status") != "reached" or not k:
            out.append(r)
            continue
        rr = dict(r)
        for f in ("steps_to_target", "steps_to_target_interp"):
            if rr.get(f) is not None:
                rr[f] = float(rr[f]) + k
        # The budget the run declared (a reached run's own `steps` is where it stopped at the
        # target, not its budget: without a declared one, nothing is pushed past it).
        declared = (r.get("protocol") or {}).get("max_steps") or (r.get("protocol") or {}).get(
            "max_epochs"
        )
        budget = budget_steps(r) if declared else None
        if budget is not None and (rr.get("steps_to_target") or 0) > budget:
            rr.update(status="not_reached", steps=budget, steps_to_target=None)
            rr["steps_to_target_interp"] = None
        elif rr.get("epochs_to_target") is not None and rr.get("steps_to_target") is not None:
            rr["epochs_to_target"] = rr["steps_to_target"] * rr["batch_size"] / rr["num_train"]
        out.append(rr)
    return out


# Steps added to every run's steps-to-target: the points of the overhead curve. 0 is the study
# itself; the small values resolve the first steps (an effect in S_min of a few steps moves at
# once), 10 and 20 are an optimizer ramp's size (momentum 0.9: about 10 steps).
OVERHEAD_STEPS = (0, 1, 2, 3, 5, 10, 20)
PER_STEP_UPTO = 10  # the slope's change per added step is fitted over the curve's points <= this


@dataclasses.dataclass(frozen=True)
class OverheadCurve:
    """The model-free slope (with its 95% interval) against steps added to every run."""

    steps: tuple  # k, steps per run
    slopes: tuple  # meta.MetaSlope | None at each k (None: no slope could be fitted)

    def at(self, k: int):
        return dict(zip(self.steps, self.slopes)).get(k)

    @property
    def per_step(self) -> float | None:
        """The slope's least-squares change per added step over k <= PER_STEP_UPTO (a
        description of the curve, no interval: each point carries its own)."""
        pts = [
            (k, s.value)
            for k, s in zip(self.steps, self.slopes)
            if s is not None and k <= PER_STEP_UPTO
        ]
        if len(pts) < 2:
            return None
        k, v = np.array(pts, dtype=float).T
        return float(np.polyfit(k, v, 1)[0])

    def sentence(self, axis: str) -> str:
        pts = [
            f"{s.value:+.2f} ({s.low:+.2f} to {s.high:+.2f}) at +{k}"
            for k, s in zip(self.steps, self.slopes)
            if s is not None and k
        ]
        if not pts:
            return ""
        rate = self.per_step
        trend = "" if rate is None else f"; {rate:+.3f} per step up to +{PER_STEP_UPTO}"
        return (
            f"Overhead: with k steps added to every run's steps-to-target, the slope on log "
            f"{axis} is " + ", ".join(pts) + trend + "."
        )


def overhead_curve(
    records: Sequence[dict],
    eps: float,
    steps: Sequence[int] = OVERHEAD_STEPS,
    n_boot: int = SENSITIVITY_BOOTSTRAP,
) -> OverheadCurve:
    """The slope and its interval with k steps added to every finished run, the whole analysis
    re-run at each k of `steps` (a run pushed past its budget counts as not reaching the
    target)."""
    out = []
    for k in steps:
        d = dec.decide(summarize_members(with_overhead(records, k), eps, n_boot))
        out.append(d.model_free_slope)
    return OverheadCurve(tuple(steps), tuple(out))


def power_at(d: dec.Decision, slope: float, n: int = POWER_STUDIES, seed: int = 0):
    """The share of simulated studies of this design, at its estimated noise (as for
    `min_detectable`), that decide a true slope `slope` in its own direction; None without a
    model-free slope."""
    if d.model_free_slope is None or not slope:
        return None
    x, v, noise = _design(d, n, seed)
    return float(power.power_curve(x, v, noise, [slope], dec.HEAVIEST_LEVEL)[0])


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    min_detectable: float | None
    curve: OverheadCurve | None  # the slope against steps added (None: no records to re-run)
    power_observed: float | None = None  # the design's power at the slope it observed

    def sentences(self, d: dec.Decision) -> list[str]:
        out = []
        sl = d.model_free_slope
        if self.min_detectable is not None:
            seen = ""
            if self.power_observed is not None and sl is not None and sl.decision:
                seen = f", and the observed {sl.value:+.2f} in {self.power_observed:.0%} of studies"
            out.append(
                f"Power: simulated at its own noise (members drawn from their replicates, their "
                f"scatter added), this design finds a slope on log {d.axis} of "
                f"{self.min_detectable:.2f} or more 80% of the time{seen}."
            )
        if self.curve is not None and sl is not None and sl.decision:  # an effect to perturb
            line = self.curve.sentence(d.axis)
            out += [line] if line else []
        return out


def sensitivity(records, d: dec.Decision, eps: float, power_studies: int = POWER_STUDIES):
    """Power (at 80% and at the observed slope), and with the study's records the slope against
    steps added to every run (None without a model-free slope)."""
    if d.model_free_slope is None:
        return None
    mds = min_detectable(d, power_studies)
    seen = power_at(d, d.model_free_slope.value, power_studies)
    curve = None if records is None else overhead_curve(records, eps)
    return Sensitivity(mds, curve, seen)
