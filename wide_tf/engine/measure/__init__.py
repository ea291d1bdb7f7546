"""Gradient measurements: per-example gradient norms (per_example.py, TensorFlow), diversity, batch
bound and the noise scale (diversity.py, noise_scale.py: NumPy). Nothing is imported here, so that
a backend without TensorFlow (the JAX one) reads the NumPy statistics without loading it."""
