"""Owns the names every choice field accepts that are not a registry of their own (optimizers,
schedules, data sets, architectures, family kinds and target metrics are): scaling rules, LARS
trust-ratio forms, batch-norm modes of the evaluations, strategies, precisions and config kinds.
The config checks and the engine read them here, so a new name is added once."""

from __future__ import annotations

from wide_tf.schema import schedules

SCHEDULES = schedules.NAMES  # optim.schedule (schema/schedules.py: each one's hyper-parameters)
SCALING_RULES = ("none", "linear", "sqrt")  # optim.scaling
TRUST_RATIO_FORMS = ("you", "decayed_grad")  # optim.lars_trust_ratio
WARMUP_FIXED = ("epochs", "steps")  # optim.warmup_fixed
TARGET_BN_MODES = ("moving", "recompute")  # train.target_bn
PROBE_BATCHES = ("smallest", "all")  # sweep.probe_batches
STRATEGIES = ("auto", "tpu", "gpu", "cpu", "multi_worker")  # runtime.strategy
BACKENDS = ("tensorflow", "jax")  # runtime.backend: Keras's backend
PRECISIONS = ("auto", "float32", "mixed_bfloat16")  # runtime.mixed_precision
JIT_COMPILE = ("auto", "true", "false", "1", "0", "yes", "no")  # runtime.jit_compile, any case
KINDS = ("study", "theory")  # config.kind
THEORY_KINDS = ("linear", "relu")  # theory.kinds
