"""The step's accumulators (loss sum, hits, norms, `diverged`) are updated with no broadcast: each
replica keeps its own copy (ON_READ), the values added being already all-reduced. A mirrored
variable with ONLY_FIRST_REPLICA aggregation broadcast replica 0's value on every assign in the
step: an all-to-all on TPU (TPUExtended._broadcast_to), a copy to every device elsewhere. Counted
here on two logical CPUs through the strategy's cross-device ops, the same call TPUStrategy turns
into an all-to-all; the numbers must not change."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import collective_util
from tensorflow.python.distribute import cross_device_ops as cdo

from wide_tf.engine.models import build_model
from wide_tf.engine.tf.step import BatchPlan, Stepper

DEVICES = ["/cpu:0", "/cpu:1"]
rng = np.random.default_rng(0)
X = rng.normal(size=(64, 6, 6, 1)).astype(np.float32)
Y = rng.integers(0, 4, size=64).astype(np.int32)


def _two_cpus():
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs two logical CPU devices (tests/conftest.py)")


def _stepper(strategy, replicas, micro_batches=1):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = build_model("mlp", 2, 16, 4, (6, 6, 1), norm="ghost", ghost_batch_size=4)
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        opt.build(model.trainable_variables)
        plan = BatchPlan.make(32, replicas, 32 // replicas // micro_batches)
        return Stepper(model, opt, strategy, plan)


def _dataset(strategy):
    def fn(ctx):
        per = ctx.get_per_replica_batch_size(32)
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(per, drop_remainder=True).repeat()

    return strategy.distribute_datasets_from_function(fn)


class _Counting(cdo.CollectiveAllReduce):
    """Real collective all-reduces (CollectiveReduceV2 in the graph); broadcasts counted."""

    def __init__(self):
        super().__init__(DEVICES, 2, options=collective_util.Options())
        self.broadcasts = 0

    def broadcast_implementation(self, tensor, destinations):
        self.broadcasts += 1
        return super().broadcast_implementation(tensor, destinations)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_the_step_broadcasts_nothing_of_its_own(micro_batches):
    _two_cpus()
    ops = _Counting()
    strategy = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=ops)
    stepper = _stepper(strategy, 2, micro_batches)
    # Traced only (both variants: the lean step in the loop and the diagnostic last step).
    concrete = stepper._build_train_fn().get_concrete_function(
        iter(_dataset(strategy)), tf.constant(3)
    )
    graph = concrete.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    collectives = collections.Counter(n.op for n in nodes if "Collective" in n.op)
    # Before: 19 broadcasts (8 in the lean step, 11 in the diagnostic one). Left: Keras's own
    # `optimizer.iterations += 1`, one a step.
    assert ops.broadcasts == 2
    # All-reduces only, 2 devices x (gradients, the step's sums, ghost statistics...): unchanged.
    assert set(collectives) == {"CollectiveReduceV2"}
    assert collectives["CollectiveReduceV2"] == (16 if micro_batches == 1 else 12)


def test_the_accumulated_numbers_are_the_same_on_one_and_two_replicas():
    _two_cpus()
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    two = tf.distribute.MirroredStrategy(DEVICES)  # reductions through one device (conftest)
    results = []
    for strategy, replicas in ((one, 1), (two, 2)):
        stepper = _stepper(strategy, replicas)
        out = stepper.train(iter(_dataset(strategy)), 3)
        # every replica's copy holds the same (already all-reduced) sums
        for var in list(stepper.acc.values()) + [stepper.diverged]:
            copies = [v.numpy() for v in strategy.experimental_local_results(var)]
            assert all(c == copies[0] for c in copies), var.name
        results.append(out)
    a, b = results
    assert a["steps"] == b["steps"] == 3 and a["examples"] == b["examples"] == 96
    assert a["correct"] == b["correct"] and not a["diverged"] and not b["diverged"]
    # (big_grad_sq is every step's on two replicas, the two-batch estimator's; the last one's here)
    for k in ("loss_sum", "grad_norm_sq", "update_norm_sq", "param_norm_sq"):
        assert b[k] == pytest.approx(a[k], rel=1e-5), k
    assert a["iteration"] == b["iteration"] == 3
