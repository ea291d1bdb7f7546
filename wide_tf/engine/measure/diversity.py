"""Exact gradient diversity, batch bound and noise scale on a probe set (their cost:
tools/bench/speed.py).

Definitions (docs/science.md, "Quantities"), with f_i the per-example cross-entropy, g_i = grad f_i
and n the probe-set size:

  sum_sq_norms      = sum_i |g_i|^2
  sq_norm_of_sum    = |sum_i g_i|^2
  diversity         = sum_sq_norms / sq_norm_of_sum                     (Yin et al. 2018)
  batch_bound       = n * diversity
  mean_grad_sq_norm = |G|^2,  G = (1/n) sum_i g_i
  trace_cov         = tr(Sigma) = (1/n) sum_i |g_i - G|^2 = sum_sq_norms / n - |G|^2
  noise_scale       = trace_cov / mean_grad_sq_norm                     (McCandlish et al. 2018)

Sigma is normalised by 1/n (the covariance of the uniform distribution over the n probe examples),
not 1/(n-1): then noise_scale + 1 = (sum_sq_norms / n) / |G|^2 = n sum_sq_norms / |sum_i g_i|^2 =
batch_bound holds exactly. It is also the normalisation for which the two-batch estimator
(noise_scale.py) is unbiased when batches are drawn with replacement from the probe set.

Batch normalization is measured in inference mode (moving statistics): see engine/tf/per_example.py.
"""

from __future__ import annotations

import numpy as np


def stats_from_norms(sq_norms, sum_grad_sq_norm: float, n: int | None = None) -> dict:
    """All quantities from the per-example squared norms and |sum_i g_i|^2 (float64 arithmetic)."""
    sq_norms = np.asarray(sq_norms, np.float64)
    n = len(sq_norms) if n is None else int(n)
    s1 = float(np.sum(sq_norms))
    q = float(sum_grad_sq_norm)
    mean_sq = q / n**2
    trace_cov = s1 / n - mean_sq
    # A zero sum gradient (a minimum of the probe loss) makes the ratios infinite; say so with inf.
    diversity = s1 / q if q > 0 else float("inf")
    return {
        "n": n,
        "sum_sq_norms": s1,
        "sq_norm_of_sum": q,
        "diversity": diversity,
        "batch_bound": n * diversity,
        "noise_scale": trace_cov / mean_sq if mean_sq > 0 else float("inf"),
        "mean_grad_sq_norm": mean_sq,
        "trace_cov": trace_cov,
    }


def stats_from_per_example_gradients(grads) -> dict:
    """Brute force from explicit per-example gradients (list of (n, ...) arrays): independent check.

    The covariance is formed explicitly, (1/n) sum_i |g_i - G|^2, not through the identity.
    """
    flat = np.concatenate([np.asarray(g, np.float64).reshape(len(g), -1) for g in grads], axis=1)
    n = flat.shape[0]
    total = flat.sum(axis=0)
    mean = total / n
    s1 = float(np.sum(flat**2))
    q = float(total @ total)
    trace_cov = float(np.sum((flat - mean) ** 2)) / n
    return {
        "n": n,
        "sum_sq_norms": s1,
        "sq_norm_of_sum": q,
        "diversity": s1 / q,
        "batch_bound": n * s1 / q,
        "noise_scale": trace_cov / float(mean @ mean),
        "mean_grad_sq_norm": float(mean @ mean),
        "trace_cov": trace_cov,
    }
