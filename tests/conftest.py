"""Test-session set-up: quiet TensorFlow, two logical CPU devices for multi-replica tests, both
set the moment TensorFlow is first imported, so that tests that never import it (the launcher's,
the schema's) do not pay for its import."""

import importlib.abc
import importlib.util
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the tests are CPU tests, also on a GPU box


def _configure_tensorflow(tf) -> None:
    # Logical devices must be configured before TensorFlow initialises its runtime, so this runs
    # as its import ends: every test sees CPU:0 and CPU:1 (the default strategy still uses one
    # device; MirroredStrategy tests ask for both).
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    except RuntimeError:  # already initialised by a plugin; multi-replica tests will skip
        pass

    class _TestMirroredStrategy(tf.distribute.MirroredStrategy):
        """MirroredStrategy that reduces through one device unless told otherwise.

        Many tests in one process each create a MirroredStrategy over the two logical CPUs. With
        the default collective all-reduce, their collective instance keys collide ("Shape mismatch
        in the collective instance 100 ... expected shape [6] but another member ... [932]"), a
        test-only artefact: a real run creates one strategy per process. Plain reductions avoid
        it."""

        def __init__(self, devices=None, cross_device_ops=None):
            super().__init__(devices, cross_device_ops or tf.distribute.ReductionToOneDevice())

    tf.distribute.MirroredStrategy = _TestMirroredStrategy


class _ConfigureTensorFlowOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the first import of tensorflow (a test module's, or Keras's) it
    lets the usual finders find it and configures the module as soon as it has run, before any
    test can use it; then it leaves sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _configure_tensorflow(module)

        spec.loader.exec_module = exec_module
        return spec


if "tensorflow" in sys.modules:  # a plugin imported it before this file
    _configure_tensorflow(sys.modules["tensorflow"])
else:
    sys.meta_path.insert(0, _ConfigureTensorFlowOnImport())


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory):
    """A finished `configs/mlp.py:smoke` study run by one process (`--workers=1`), report included,
    and that command's stderr: the one reference that resumed, sharded and multi-worker runs of the
    same study are compared with (run once per test process instead of once per test). Tests read
    it and never write into it."""
    from helpers import run_main

    workdir = tmp_path_factory.mktemp("smoke_study") / "study"
    proc = run_main("--config=configs/mlp.py:smoke", f"--workdir={workdir}", "--workers=1")
    return workdir, proc.stderr
