"""The JAX backend of a run (runtime.backend='jax'): run.py (Trainer, Evaluator, Checkpointer and
the build kept across runs), step.py (the jitted steps over a device mesh) and data.py (device
batches from engine/arrays.py's host arrays). engine/backend.py finds it by name; nothing shared
in engine/ imports it. Nothing is imported here, and nothing here imports TensorFlow."""
