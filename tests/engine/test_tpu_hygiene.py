"""What TPUs (and Ampere+ GPUs) would see, checked on CPU through the graph or the flags:
static-shape evaluation, no assert in ghost batch norm when the batch is static, the gradient
probe's float32 matmuls with TensorFloat-32 off."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from wide_tf.engine import arrays
from wide_tf.engine.models import build_model
from wide_tf.engine.models.norm import GhostBatchNormalization
from wide_tf.engine.tf import data, probe
from wide_tf.engine.tf.step import BatchPlan, Stepper


def _op_types(concrete) -> list:
    """Every op of a concrete function, its loop bodies' and branches' included."""
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node)
    for fn in graph_def.library.function:
        nodes.extend(fn.node_def)
    return nodes


@pytest.mark.parametrize("replicas", [1, 2])
def test_evaluation_takes_the_known_number_of_batches_with_static_shapes(replicas):
    if replicas == 1:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    elif len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")
    else:  # (an iterator made inside the evaluation function hung here)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(37, 6, 6, 1)).astype(np.float32), rng.integers(0, 4, 37)
    xp, yp, w = arrays.pad_for_evaluation(x, y, 8)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((xp, yp, w)).batch(8, drop_remainder=True)
    )
    eval_set = data.EvalDataset(dataset, len(w) // 8, len(y))
    assert eval_set.num_batches == 5
    with strategy.scope():
        model = build_model("mlp", 1, 8, 4, (6, 6, 1), norm="none")
        opt = keras.optimizers.SGD(0.1)
        opt.build(model.trainable_variables)
        stepper = Stepper(model, opt, strategy, BatchPlan.make(8, replicas))
    out = stepper.evaluate(eval_set)
    assert out["examples"] == 37
    logits = model(x, training=False).numpy()
    losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).numpy()
    assert out["loss"] == pytest.approx(losses.mean(), rel=1e-5)
    concrete = stepper.eval_fn(eval_set).get_concrete_function(
        iter(dataset), tf.constant(5), tf.constant([-np.inf, np.inf, 37.0])
    )
    nodes = _op_types(concrete)
    assert not [n.op for n in nodes if "Optional" in n.op]  # no get_next_as_optional
    get_next = [n for n in nodes if "GetNext" in n.op]
    assert get_next
    for n in get_next:  # every batch dimension known while compiling
        for shape in n.attr["output_shapes"].list.shape:
            assert shape.dim and shape.dim[0].size == 8 // replicas


@pytest.mark.parametrize("batch, asserts", [(8, False), (None, True)])
def test_ghost_batch_norm_asserts_only_when_the_batch_is_dynamic(batch, asserts):
    layer = GhostBatchNormalization(ghost_batch_size=4)
    layer.build((None, 3))
    fn = tf.function(lambda t: layer(t, training=True), autograph=False)
    concrete = fn.get_concrete_function(tf.TensorSpec([batch, 3], tf.float32))
    assert any(n.op == "Assert" for n in _op_types(concrete)) == asserts
    out = fn(tf.constant(np.arange(24, dtype=np.float32).reshape(8, 3))).numpy()
    group = np.array([0.0, 3.0, 6.0, 9.0])  # the first virtual batch's column 0
    expected = (group - group.mean()) / np.sqrt(group.var() + layer.epsilon)
    np.testing.assert_allclose(out[:4, 0], expected, rtol=1e-5)


@pytest.mark.parametrize("initially", [True, False])
def test_probe_runs_with_tensor_float_32_off_and_restores_it(initially):
    seen = []
    gp = probe.GradientProbe.__new__(probe.GradientProbe)
    gp.n = 4

    def sums():
        seen.append(tf.config.experimental.tensor_float_32_execution_enabled())
        return tf.constant([4.0, 1.0, 0.0])

    gp._sums = sums
    tf.config.experimental.enable_tensor_float_32_execution(initially)
    try:
        stats = gp()
        assert seen == [False]
        assert tf.config.experimental.tensor_float_32_execution_enabled() == initially
        assert set(stats) == {"diversity", "batch_bound", "noise_scale"}
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)
