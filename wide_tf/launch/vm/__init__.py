"""What the launcher runs on a TPU VM: the set-up after the install (vm/setup.py), --check's TPU
stage (vm/tpu_check.py, TensorFlow; vm/jax_check.py, JAX) and its study stage (vm/check.py)."""
