"""The TensorFlow backend of a run (runtime.backend='tensorflow'): run.py (Trainer, Evaluator,
Checkpointer), step.py (the compiled steps), data.py and stream.py (tf.data pipelines from
engine/arrays.py's host arrays), strategy.py (the distribution strategy), reuse.py (the build kept
across runs), and the TensorFlow-only measurements. engine/backend.py finds it by name; nothing
shared in engine/ imports it. Nothing is imported here."""
