"""Owns what the verdict paragraph says about its own strength: the power of the study's design
at its estimated noise (`min_detectable`) and two sensitivity lines (`sensitivity`).

* **Power.** A simulated study draws each member's log B_x(1+eps) from that member's own
  sampling replicates (the study's design at its estimated noise: the cell effects, the seed noise
  with its (member, seed) share, the budgets' censoring, the evaluation cadence's rounding),
  shifted onto a line of slope b, plus the members' scatter about the line (tau^2, the slope's
  REML estimate); the rule's slope, interval, leave-one-out check and check without the member of
  the largest leverage (`wide_tf.analysis.stats.power`) then decide it. The minimum detectable
  slope is the smallest b found 80% of the time. It is not read off the realised interval's q,
  which on 5 df is itself noisy (issue 22: q = 0.245 gave "0.15", while the design found a slope
  of 0.35 in 28-35% of simulated studies).
* **Overhead.** Every finished run's steps-to-target plus k (a run pushed past its budget counts
  as not reaching the target), the whole analysis re-run: the smallest k at which the slope's
  interval holds 0 (searched to 1 step, up to `MAX_OVERHEAD`). An effect that a 10-step optimizer
  transient erases is a statement about that transient.
* **Leverage.** The verdict with the member of the largest leverage left out.

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
MAX_OVERHEAD = 512
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
        budget = budget_steps(r)
        if budget is not None and (rr.get("steps_to_target") or 0) > budget:
            rr.update(status="not_reached", steps=budget, steps_to_target=None)
            rr["steps_to_target_interp"] = None
        elif rr.get("epochs_to_target") is not None and rr.get("steps_to_target") is not None:
            rr["epochs_to_target"] = rr["steps_to_target"] * rr["batch_size"] / rr["num_train"]
        out.append(rr)
    return out


def _holds_zero(records, k, eps, n_boot) -> bool:
    d = dec.decide(summarize_members(with_overhead(records, k), eps, n_boot))
    return d.model_free_slope is None or d.model_free_slope.decision == 0


def overhead_to_erase(records: Sequence[dict], eps: float, n_boot: int = SENSITIVITY_BOOTSTRAP):
    """The smallest whole k (steps per run) at which the slope's interval holds 0: 0 when it
    already does, None when even MAX_OVERHEAD does not."""
    if _holds_zero(records, 0, eps, n_boot):
        return 0
    lo, hi = 0, 4
    while not _holds_zero(records, hi, eps, n_boot):
        lo, hi = hi, hi * 2
        if hi > MAX_OVERHEAD:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _holds_zero(records, mid, eps, n_boot) else (mid, hi)
    return hi


def without_heaviest(d: dec.Decision) -> tuple[str, dec.Decision] | None:
    """(the member of the largest leverage, the decision without it)."""
    sl = d.model_free_slope
    if sl is None:
        return None
    heavy = d.model_free_members[int(np.argmax(sl.leverage))]
    return heavy, dec.decide([s for s in d.members if s.info.name != heavy])


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    min_detectable: float | None
    overhead: int | None  # steps per run that erase the effect (0: nothing to erase)
    heaviest: str | None
    without_heaviest: dec.Decision | None
    checked: bool = True  # False: power only (no records to re-run)

    def sentences(self, axis: str) -> list[str]:
        out = []
        if self.min_detectable is not None:
            out.append(
                f"Power: simulated at its own noise (each member drawn from its replicates, "
                f"the members' scatter added), this design finds a slope on log {axis} of "
                f"{self.min_detectable:.2f} or more 80% of the time."
            )
        if not self.checked:
            return out
        if self.overhead == 0:
            out.append("Sensitivity: the interval already holds 0 without any added steps.")
        elif self.overhead is None:
            out.append(
                f"Sensitivity: even {MAX_OVERHEAD} extra steps per run leave the interval off 0."
            )
        else:
            out.append(
                f"Sensitivity: adding {self.overhead} step{'s' if self.overhead != 1 else ''} to "
                "every run's steps-to-target (an "
                "optimizer ramp, say) makes the slope's interval hold 0."
            )
        if self.without_heaviest is not None:
            sl = self.without_heaviest.model_free_slope
            num = "" if sl is None else f", slope {sl.value:+.2f} ({sl.low:+.2f} to {sl.high:+.2f})"
            out.append(
                f"Without its highest-leverage member ({self.heaviest}) the verdict is "
                f"{self.without_heaviest.outcome.upper()}{num}."
            )
        return out


def sensitivity(records, d: dec.Decision, eps: float, power_studies: int = POWER_STUDIES):
    """Power, and with the study's records the overhead that erases the effect and the verdict
    without the heaviest member (None without a model-free slope)."""
    if d.model_free_slope is None:
        return None
    mds = min_detectable(d, power_studies)
    if records is None:
        return Sensitivity(mds, None, None, None, checked=False)
    heavy = without_heaviest(d)
    return Sensitivity(
        mds,
        overhead_to_erase(records, eps),
        heavy[0] if heavy else None,
        heavy[1] if heavy else None,
    )
