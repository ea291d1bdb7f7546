"""Two-batch estimator of the gradient noise scale during data-parallel training (McCandlish et
al. 2018); pure Python on the host (the squared norms come from the training step).

With |G_b|^2 the squared norm of a mean gradient over b examples, E|G_b|^2 = |G|^2 + tr(Sigma)/b
when the b examples are drawn independently (with replacement) from the distribution over which G
and Sigma are defined; for a finite set of n examples that is the 1/n covariance used in
diversity.py (docs/science.md, "Quantities"). From a small batch (the per-replica or per
micro-batch batch, B_small) and a big one (the global batch, B_big) of the same step, two unbiased
single-step estimates follow:

  G2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)      estimates |G|^2
  S  = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)                estimates tr(Sigma)

G2 and S are averaged separately over steps (exponential moving averages with Adam-style bias
correction) and only divided at read time: the ratio of single-step estimates is biased (and often
negative). |G_small|^2 should be the mean over replicas of each replica's local squared norm, which
lowers its variance without changing its expectation.

`averaged_estimate` is the same estimator over a stretch of steps without the moving average (a
plain mean of G2 and of S, then the ratio) with its standard error: what the exact probe is checked
against (tests/engine/test_measure.py), and how a run's two-batch norms can be read where the exact
per-example pass is too costly (docs/prediction.md).
"""

from __future__ import annotations

import math

import numpy as np


def two_batch_estimates(g_small_sq, g_big_sq, b_small: float, b_big: float):
    """Single-step unbiased estimates (G2 of |G|^2, S of tr(Sigma)) from the two squared norms.

    Works on floats or element-wise on NumPy arrays of per-step norms.
    """
    b_small, b_big = float(b_small), float(b_big)
    if not 0 < b_small < b_big:
        raise ValueError(
            f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big} "
            f"(with one replica and no micro-batches there is no small batch)"
        )
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    s = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, s


def averaged_estimate(g_small_sq, g_big_sq, b_small: float, b_big: float) -> tuple[float, float]:
    """(B_simple, its standard error) from per-step squared norms: G2 and S are each averaged over
    the steps before the ratio (McCandlish et al. 2018, appendix A.1), and the standard error is
    the delta method's for a ratio of means, with the steps taken as independent draws."""
    g2, s = two_batch_estimates(
        np.asarray(g_small_sq, float), np.asarray(g_big_sq, float), b_small, b_big
    )
    g2, s = np.atleast_1d(g2), np.atleast_1d(s)
    if g2.size < 2:
        raise ValueError(f"need at least 2 steps for a standard error, got {g2.size}")
    mg = float(g2.mean())
    if not mg > 0:
        raise ValueError("the averaged |G|^2 estimate is not positive: the noise swamps the signal")
    value = float(s.mean()) / mg
    # Var(mean S / mean G2) ~ Var(S - value * G2) / (n mean(G2)^2) (first-order delta method).
    se = float(np.std(s - value * g2, ddof=1) / (math.sqrt(g2.size) * mg))
    return value, se


class TwoBatchNoiseScale:
    """Host-side exponential-moving-average two-batch noise-scale estimator.

    ``update(g_small_sq, g_big_sq, b_small, b_big)`` once per step (Python floats or scalars);
    ``value`` is S_ema / G2_ema (None before the first update, and None while the averaged |G|^2
    estimate is not positive, i.e. the noise still swamps the signal). ``state`` / ``to_dict`` /
    ``from_dict`` round-trip the estimator through a JSON checkpoint.
    """

    def __init__(self, decay: float = 0.95):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.g2_ema = 0.0
        self.s_ema = 0.0
        self.count = 0

    def update(self, g_small_sq, g_big_sq, b_small, b_big) -> None:
        g2, s = two_batch_estimates(float(g_small_sq), float(g_big_sq), b_small, b_big)
        g2, s = float(g2), float(s)
        if not (math.isfinite(g2) and math.isfinite(s)):
            return  # a non-finite step (divergence) must not poison the average
        self.g2_ema = self.decay * self.g2_ema + (1.0 - self.decay) * g2
        self.s_ema = self.decay * self.s_ema + (1.0 - self.decay) * s
        self.count += 1

    def _corrected(self, ema: float) -> float:
        # Adam-style bias correction: the EMA starts at 0, so divide by the weight it has gathered.
        return ema / (1.0 - self.decay**self.count)

    @property
    def g2(self) -> float | None:
        """Bias-corrected average estimate of |G|^2 (None before the first update)."""
        return self._corrected(self.g2_ema) if self.count else None

    @property
    def trace_cov(self) -> float | None:
        """Bias-corrected average estimate of tr(Sigma) (None before the first update)."""
        return self._corrected(self.s_ema) if self.count else None

    @property
    def value(self) -> float | None:
        """The noise-scale estimate tr(Sigma)/|G|^2, or None (no update yet, or |G|^2 estimate
        <= 0)."""
        if not self.count:
            return None
        g2 = self.g2
        return self.trace_cov / g2 if g2 > 0 else None

    @property
    def state(self) -> dict:
        return self.to_dict()

    def to_dict(self) -> dict:
        return {
            "decay": self.decay,
            "g2_ema": self.g2_ema,
            "s_ema": self.s_ema,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TwoBatchNoiseScale:
        est = cls(decay=d["decay"])
        est.g2_ema, est.s_ema, est.count = float(d["g2_ema"]), float(d["s_ema"]), int(d["count"])
        return est

    def __repr__(self) -> str:
        return f"TwoBatchNoiseScale(decay={self.decay}, count={self.count}, value={self.value})"
