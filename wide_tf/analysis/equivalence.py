"""Owns the equivalence reading: when an interval that holds 0 may be called "no detectable
effect" rather than "inconclusive".

An interval that holds 0 says nothing by itself: a study too small to see anything gives one.
"No detectable effect" is a claim that the effect the paper predicts is absent, so it needs a
study designed to make it:

* an **equivalence margin** stated before the study ran (`Equivalence.margin`, a slope on the
  decision's log axis; by default the noise-free slope of log B_x(1+eps) that B_crit ~ width^0.5
  gives the design at the narrowest member's measured B_crit, `noise_free_slope`);
* the 95% interval's end on the side the paper predicts (above 0 on log width, below 0 on log
  depth) inside the margin;
* the design's simulated **power** to read "no detectable effect" when the truth is zero at least
  `MIN_POWER` (80%), and its **size**, the same reading when the truth sits at the margin, at most
  `MAX_SIZE` (5%) (`wide_tf.analysis.rule_power` simulates both; a frozen design records them).

Anything short of that is "inconclusive", with the reason. `wide_tf.analysis.decision` applies it
to every interval that holds 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from wide_tf.analysis.stats import generators as gen

MIN_POWER = 0.80  # "no detectable effect" read in at least this share of null studies
MAX_SIZE = 0.05  # ... and in at most this share of studies whose truth is at the margin
MARGIN_ALPHA = 0.5  # the margin's effect: B_crit ~ width^0.5


@dataclasses.dataclass(frozen=True)
class Equivalence:
    """A margin stated in advance, and the design's simulated power and size at it."""

    margin: float  # > 0: the slope the paper's effect would give this design (log axis)
    power_null: float | None = None  # P("no detectable effect" | truth 0), simulated
    size_margin: float | None = None  # P("no detectable effect" | truth at the margin)
    source: str = ""  # where the numbers come from (a frozen design's hash, a simulation)

    def __post_init__(self):
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin)):
            raise ValueError(f"equivalence margin {self.margin!r} is not a finite number")
        if self.margin <= 0:
            raise ValueError(f"equivalence margin {self.margin} must be > 0")

    def design_problem(self) -> str | None:
        """Why this design may not read "no detectable effect" (None when it may)."""
        if self.power_null is None or self.size_margin is None:
            return "its power and size at the margin were not simulated"
        if self.power_null < MIN_POWER:
            return (
                f"its simulated power to read no effect when there is none is "
                f"{self.power_null:.0%}, below {MIN_POWER:.0%}"
            )
        if self.size_margin > MAX_SIZE:
            return (
                f"its simulated size at the margin is {self.size_margin:.0%}, above {MAX_SIZE:.0%}"
            )
        return None

    @classmethod
    def from_dict(cls, d: dict | None) -> Equivalence | None:
        if not d or d.get("margin") is None:
            return None
        return cls(
            float(d["margin"]),
            None if d.get("power_null") is None else float(d["power_null"]),
            None if d.get("size_margin") is None else float(d["size_margin"]),
            str(d.get("source", "")),
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def inside_margin(low: float, high: float, margin: float, sign: int = 1) -> bool:
    """The interval's end on the predicted side (`sign` +1: above 0, -1: below 0) lies inside
    the margin."""
    return high < margin if sign > 0 else low > -margin


def reading(low: float, high: float, eq: Equivalence | None, sign: int = 1) -> str | None:
    """None when an interval that holds 0 may be read "no detectable effect" under `eq`; else
    the reason it is inconclusive."""
    if eq is None:
        return (
            "the interval holds 0, but no equivalence margin was stated before the study ran "
            "for this reading, so it cannot say the effect is absent"
        )
    problem = eq.design_problem()
    if problem:
        return f"the interval holds 0, but the design cannot read no effect: {problem}"
    if not inside_margin(low, high, eq.margin, sign):
        end = high if sign > 0 else low
        return (
            f"the interval holds 0 but reaches {end:+.2f}, past the equivalence margin "
            f"{sign * eq.margin:+.2f}"
        )
    return None


def noise_free_slope(
    b_crit_ref: float,
    widths: Sequence[float],
    batches: Sequence[int],
    alpha: float = MARGIN_ALPHA,
    eps: float = 1.0,
) -> float:
    """The least-squares slope of log B_x(1+eps) on log width of the noise-free curves
    S_min (1 + B_crit / B) with B_crit = b_crit_ref (w / w_narrowest)^alpha, as the design's
    batches measure it (a B_x past the largest batch enters at that batch, as the rule enters a
    censored member)."""
    w = np.asarray(widths, dtype=float)
    if w.size < 2 or np.ptp(np.log(w)) <= 0:
        raise ValueError("the margin needs at least two different widths")
    top = float(max(batches))
    bx = [min(gen.b_plus(b_crit_ref * (wi / w.min()) ** alpha, 1.0, batches, eps), top) for wi in w]
    x = np.log(w) - np.log(w).mean()
    return float(np.sum(x * np.log(bx)) / np.sum(x**2))
