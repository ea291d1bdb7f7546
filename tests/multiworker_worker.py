"""One process of the multi-worker test (tests/engine/test_multiworker.py): a few Stepper updates of
a small MLP under the strategy that wide_tf.engine.tf.strategy.setup_runtime builds, weights
written to .npz.

    python tests/multiworker_worker.py multi_worker OUT.npz   # TF_CONFIG in the environment
    python tests/multiworker_worker.py cpu OUT.npz            # the one-device reference
(the test also calls main('cpu', ...) in its own process for the reference).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 16
STEPS = 3
SEED = 3


def main(strategy_name: str, out_path: str) -> dict:
    import ml_collections

    from wide_tf.engine.tf.strategy import setup_runtime
    from wide_tf.schema import defaults

    # First TensorFlow work of the program: MultiWorkerMirroredStrategy must be created before any
    # other op runs, or its collective runtime cannot be configured.
    cfg = defaults.runtime_config()
    cfg.strategy = strategy_name
    runtime = setup_runtime(ml_collections.ConfigDict(cfg))
    strategy = runtime.strategy

    import keras
    import numpy as np
    import tensorflow as tf

    from wide_tf.engine.models import build_model
    from wide_tf.engine.tf.step import BatchPlan, Stepper

    rng = np.random.default_rng(0)
    n = GLOBAL_BATCH * STEPS
    x = rng.normal(size=(n, 6, 6, 1)).astype(np.float32)
    y = rng.integers(0, 4, size=n).astype(np.int32)

    def dataset_fn(ctx):
        # Global batch t = rows [16t, 16t + 16); pipeline i takes its i-th contiguous chunk of it,
        # i.e. rows [16t + 8i, 16t + 8i + 8) with two pipelines, all 16 rows with one.
        per = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
        assert per * ctx.num_input_pipelines == GLOBAL_BATCH, (per, ctx.num_input_pipelines)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(per, drop_remainder=True)
        return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).repeat()

    keras.utils.set_random_seed(
        SEED
    )  # identical initial weights on every worker (and the reference)
    with strategy.scope():
        model = build_model("mlp", 2, 16, 4, (6, 6, 1), norm="none")
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
        plan = BatchPlan.make(GLOBAL_BATCH, strategy.num_replicas_in_sync)
        stepper = Stepper(model, optimizer, strategy, plan, jit_compile=runtime.jit_compile)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    scalars = stepper.train(iterator, STEPS)

    weights = {f"w{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}
    np.savez(out_path, **weights)
    return {
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "examples": scalars["examples"],
        "loss_sum": scalars["loss_sum"],
        "steps": scalars["steps"],
        "iterations": int(optimizer.iterations.numpy()),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
