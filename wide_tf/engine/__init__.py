"""The engine: one training run on either Keras backend (TensorFlow: tf_run.py and its strategy,
data and steps; JAX: jax_run.py, jax_step.py, jax_data.py) around the shared Controller, with the
models, optimizers and measurements both use.

It imports schema and store only, never checks, study, analysis or report.
"""
