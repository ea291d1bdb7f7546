"""wide_tf.engine.tf.strategy on CPU: which strategy each runtime.strategy gives, the per-platform
XLA and dtype-policy defaults, and one-line StrategyErrors for what cannot run here."""

import os

import keras
import pytest
import tensorflow as tf

from wide_tf.engine.tf import strategy as strategy_lib
from wide_tf.engine.tf.strategy import StrategyError, setup_runtime
from wide_tf.schema import defaults


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    # setup_runtime sets the global dtype policy; TF_CONFIG / TPU_NAME in the caller's environment
    # would change what 'auto' and 'multi_worker' do.
    policy = keras.mixed_precision.global_policy().name
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    yield
    keras.mixed_precision.set_global_policy(policy)


def _cfg(**overrides):
    cfg = defaults.runtime_config()
    for k, v in overrides.items():
        cfg[k] = v
    return cfg


def _no_accelerator():
    if tf.config.list_logical_devices("GPU") or any(
        os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0")
    ):
        pytest.skip("this test expects a machine without GPU or TPU")


def _two_cpus():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    return ["/cpu:0", "/cpu:1"]


def test_auto_is_one_cpu_here():
    _no_accelerator()
    rt = setup_runtime(_cfg())
    assert isinstance(rt.strategy, tf.distribute.OneDeviceStrategy)
    assert (rt.platform, rt.num_replicas, rt.jit_compile, rt.mixed_precision) == (
        "cpu",
        1,
        False,
        "float32",
    )
    assert keras.mixed_precision.global_policy().name == "float32"
    assert rt.describe() == (
        "OneDeviceStrategy on cpu, 1 replica(s), jit_compile=False, policy=float32"
    )


def test_cpu_with_two_devices_is_mirrored():
    rt = setup_runtime(_cfg(strategy="cpu", devices=_two_cpus()))
    assert isinstance(rt.strategy, tf.distribute.MirroredStrategy)
    assert rt.num_replicas == rt.strategy.num_replicas_in_sync == 2
    assert sorted(d.lower()[-5:] for d in rt.strategy.extended.worker_devices) == ["cpu:0", "cpu:1"]
    assert not rt.jit_compile


def test_default_jit_per_platform():
    assert strategy_lib._default_jit("cpu", "auto") is False
    assert strategy_lib._default_jit("tpu", "auto") is True
    assert strategy_lib._default_jit("gpu", "auto") is True
    assert strategy_lib._default_jit("gpu", None) is True
    # An explicit choice wins, also as the strings a command-line override gives.
    assert strategy_lib._default_jit("tpu", False) is False
    assert strategy_lib._default_jit("cpu", True) is True
    assert strategy_lib._default_jit("cpu", "True") is True
    assert strategy_lib._default_jit("gpu", "false") is False


def test_default_policy_per_platform():
    assert strategy_lib._default_policy("tpu", "auto") == "mixed_bfloat16"
    assert strategy_lib._default_policy("cpu", "auto") == "float32"
    assert strategy_lib._default_policy("gpu", "auto") == "float32"
    assert strategy_lib._default_policy("cpu", "mixed_bfloat16") == "mixed_bfloat16"
    with pytest.raises(StrategyError, match="mixed_float16"):
        strategy_lib._default_policy("gpu", "mixed_float16")  # would need loss scaling


def test_requested_policy_is_set_globally():
    rt = setup_runtime(_cfg(strategy="cpu", mixed_precision="mixed_bfloat16"))
    assert rt.mixed_precision == "mixed_bfloat16"
    policy = keras.mixed_precision.global_policy()
    assert (policy.compute_dtype, policy.variable_dtype) == ("bfloat16", "float32")


def _one_line_error(cfg, *needles):
    with pytest.raises(StrategyError) as e:
        setup_runtime(cfg)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_gpu_without_gpu_is_a_clear_error():
    _no_accelerator()
    _one_line_error(_cfg(strategy="gpu"), "no GPU", "--config.runtime.strategy=cpu")


def test_multi_worker_needs_tf_config():
    _one_line_error(_cfg(strategy="multi_worker"), "TF_CONFIG")


def test_multi_worker_with_bad_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{cluster: worker}")
    _one_line_error(_cfg(strategy="multi_worker"), "TF_CONFIG is not valid JSON")


def test_unknown_strategy_name():
    _one_line_error(_cfg(strategy="mirrored"), "'mirrored'", "auto, tpu, gpu, cpu, multi_worker")


def test_jit_with_mirrored_cpu_is_refused():
    # A string, as --config.runtime.jit_compile=True arrives (the field is typed str by its
    # default).
    _one_line_error(
        _cfg(strategy="cpu", devices=_two_cpus(), jit_compile="True"),
        "jit_compile",
        "--config.runtime.jit_compile=auto",
    )


def test_jit_on_one_cpu_is_allowed():
    rt = setup_runtime(_cfg(strategy="cpu", jit_compile="true"))
    assert rt.jit_compile and rt.num_replicas == 1


def _two_cpus_as_gpus(monkeypatch):
    """The package's multi-GPU set-up without GPUs (TensorFlow's CPU kernels, a stand-in for its GPU
    code path): the strategy module is shown the two logical
    CPUs as its GPUs, so runtime.strategy=gpu builds the MirroredStrategy it builds on a 2-GPU box,
    with the 'gpu' platform's defaults."""
    _two_cpus()
    real = tf.config.list_logical_devices

    def listed(device_type=None):
        return real("CPU") if device_type == "GPU" else real(device_type)

    monkeypatch.setattr(strategy_lib.tf.config, "list_logical_devices", listed)


def test_two_gpus_train_with_xla_off_by_default(monkeypatch, tmp_path):
    """Regression: with XLA on, the GPU default before, the first run under
    MirroredStrategy over two devices failed (on two GPUs: "merge_call called while defining a new
    graph" from the optimizer's iterations.assign_add inside a jit_compile function inside
    strategy.run; here, on two logical CPUs: InvalidArgumentError "Trying to access resource
    dense_1/kernel/replica_1 located in device CPU:1 from device CPU:0"). One GPU keeps XLA."""
    from wide_tf.engine import train

    _two_cpus_as_gpus(monkeypatch)
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width = 1, 16
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy = "gpu"
    config.train.global_batch, config.train.max_epochs = 64, 0.1
    runtime = setup_runtime(config.runtime)
    assert (runtime.platform, runtime.num_replicas) == ("gpu", 2)
    assert isinstance(runtime.strategy, tf.distribute.MirroredStrategy)
    assert not runtime.jit_compile
    result = train.train_and_evaluate(config, str(tmp_path), runtime=runtime)
    assert result["steps"] >= 1 and result["status"] in ("reached", "not_reached")


def test_explicit_xla_on_two_gpus_is_refused_in_one_line(monkeypatch):
    _two_cpus_as_gpus(monkeypatch)
    _one_line_error(
        _cfg(strategy="gpu", jit_compile="True"),
        "jit_compile=True",
        "merge_call",
        "--config.runtime.jit_compile=auto",
    )


def test_one_gpu_keeps_xla(monkeypatch):
    _two_cpus()
    real = tf.config.list_logical_devices
    monkeypatch.setattr(
        strategy_lib.tf.config,
        "list_logical_devices",
        lambda device_type=None: real("CPU")[:1] if device_type == "GPU" else real(device_type),
    )
    rt = setup_runtime(_cfg(strategy="gpu"))
    assert isinstance(rt.strategy, tf.distribute.OneDeviceStrategy)
    assert (rt.platform, rt.num_replicas, rt.jit_compile) == ("gpu", 1, True)
