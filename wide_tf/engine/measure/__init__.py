"""Gradient measurements: per-example gradient norms, diversity, batch bound and the noise scale."""

from wide_tf.engine.measure.diversity import gradient_stats, stats_from_norms
from wide_tf.engine.measure.noise_scale import (
    TwoBatchNoiseScale,
    averaged_estimate,
    two_batch_estimates,
)
from wide_tf.engine.measure.per_example import (
    UnsupportedModelError,
    per_example_grad_sq_norms,
    per_example_grad_sq_norms_naive,
    per_example_grad_sq_norms_reference,
    per_example_gradients_reference,
)

__all__ = [
    "TwoBatchNoiseScale",
    "UnsupportedModelError",
    "averaged_estimate",
    "gradient_stats",
    "per_example_grad_sq_norms",
    "per_example_grad_sq_norms_naive",
    "per_example_grad_sq_norms_reference",
    "per_example_gradients_reference",
    "stats_from_norms",
    "two_batch_estimates",
]
