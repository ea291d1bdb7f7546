"""Owns the comparison of a predictor with a constant: does a predicted quantity
(the noise scale's B_simple) miss the measured one (each member's B_crit) by less than one
constant for every member, the geometric mean of the measured values? The constant is given the
measured scale, which the predictor is not, so it is a strict baseline: a predictor that beats it
knows something about the members beyond their common size.

Errors are root-mean-square log errors over the members, written as fold factors (2.0: off by
2x on a typical member); the predictor is also scored with its own mean log ratio divided out
(its pattern across members, its scale removed). Intervals are percentiles of a bootstrap over
members, the constant recomputed in each resample.

Pure NumPy; tests/analysis/test_predict.py checks it on a hand-made example.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

BOOTSTRAP = 2000


@dataclasses.dataclass(frozen=True)
class Fold:
    """A fold error exp(RMS log error) with its 95% bootstrap interval."""

    value: float
    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class AgainstConstant:
    n: int  # members compared
    noise_scale: Fold  # the predictor's error
    constant: Fold  # the constant's error (K = geometric mean of the measured values)
    rescaled: Fold  # the predictor's error with its own mean log ratio divided out
    # RMS log error of the predictor minus the constant's: < 0 where the predictor is closer.
    difference: tuple  # (value, low, high)
    constant_value: float  # K

    @property
    def closer(self) -> str:
        """'noise scale', 'constant' or 'not resolved' by the difference's interval."""
        _, lo, hi = self.difference
        return "noise scale" if hi < 0 else "constant" if lo > 0 else "not resolved"


def _rms(v: np.ndarray) -> float:
    return float(np.sqrt(np.mean(v**2)))


def against_constant(pred, measured, n_boot: int = BOOTSTRAP, seed: int = 0):
    """`AgainstConstant` for paired predictions and measured values (positive, one per member);
    None with fewer than 3 pairs."""
    pairs = [(float(a), float(b)) for a, b in zip(pred, measured) if a and b and a > 0 and b > 0]
    if len(pairs) < 3:
        return None
    la, lb = np.log(np.array(pairs)).T

    def errors(idx):
        a, b = la[idx], lb[idx]
        e = a - b
        return _rms(e), _rms(b.mean() - b), _rms(e - e.mean())

    n = la.size
    point = errors(np.arange(n))
    rng = np.random.default_rng(seed)
    boots = np.array([errors(rng.integers(0, n, n)) for _ in range(n_boot)])

    def fold(k):
        lo, hi = np.percentile(boots[:, k], [2.5, 97.5])
        return Fold(math.exp(point[k]), math.exp(lo), math.exp(hi))

    lo, hi = np.percentile(boots[:, 0] - boots[:, 1], [2.5, 97.5])
    return AgainstConstant(
        n,
        fold(0),
        fold(1),
        fold(2),
        (point[0] - point[1], float(lo), float(hi)),
        float(math.exp(lb.mean())),
    )
