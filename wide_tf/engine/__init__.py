"""The TensorFlow engine: strategy, data, optimizers, models, measurements and one training run.

It imports spec and store only, never config, study, analysis or report.
"""
