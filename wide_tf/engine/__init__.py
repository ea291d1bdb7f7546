"""The engine: one training run on either Keras backend around the shared Controller. The shared
driver lives here (loop, actions, evaluation economy, targets, result, the run interface, models,
optimizers, host arrays); each backend is a folder (tf/: TensorFlow, jax/: JAX) that
engine/backend.py's registry finds by name.

It imports schema and store only, never checks, study, analysis or report.
"""
