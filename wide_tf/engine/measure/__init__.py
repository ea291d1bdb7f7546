"""Gradient measurements that need no framework: diversity, batch bound and the noise scale
(diversity.py, noise_scale.py: NumPy). The per-example gradient norms they start from are each
backend's (engine/tf/per_example.py on TensorFlow, the JAX step's probe on JAX). Nothing is
imported here, so that a backend without TensorFlow reads the NumPy statistics without loading
it."""
