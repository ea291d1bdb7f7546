"""Test-session set-up: quiet TensorFlow, two logical CPU devices for multi-replica tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the tests are CPU tests, also on a GPU box

import tensorflow as tf  # noqa: E402

# Logical devices must be configured before TensorFlow initialises its runtime, so this runs at
# import time of the test session: every test sees CPU:0 and CPU:1 (the default strategy still
# uses one device; MirroredStrategy tests ask for both).
_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:  # already initialised by a plugin; multi-replica tests will skip
    pass
