"""The JAX backend's checks, run by tests/engine/test_jax_backend.py in one child process with
KERAS_BACKEND=jax and eight virtual CPU devices (XLA_FLAGS): a process runs one Keras backend, and
the JAX import and compilations are paid once for every check. Prints one JSON object."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

OUT = ""  # the folder the checks write into: the command line's argument


def tiny_config(**train):
    from wide_tf.schema import defaults

    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width, config.model.norm = 2, 32, "none"
    config.optim.name, config.optim.base_lr = "momentum", 0.05
    config.runtime.strategy, config.runtime.backend = "cpu", "jax"
    config.train.global_batch = 64
    config.train.max_epochs = 3.0
    config.train.eval_every_examples = 640
    for k, v in train.items():
        setattr(config.train, k, v)
    return config


def run_and_import_check(out):
    """A whole run on JAX: its record's schema, and that TensorFlow was never imported."""
    from wide_tf.engine import train
    from wide_tf.schema import result_fields

    record = train.train_and_evaluate(tiny_config(), os.path.join(OUT, "one"))
    out["problems"] = result_fields.problems(json.loads(json.dumps(record, default=float)))
    out["tensorflow_imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")[
        :5
    ]
    out["status"] = record["status"]
    out["final_train_accuracy"] = record["final"]["train_accuracy"]


def resume(out):
    """SIGTERM (the preemption flag) mid-run -> checkpoint -> Preempted; the same call resumes
    and ends where the uninterrupted run ends."""
    from wide_tf.engine import preemption, train

    config = tiny_config(checkpoint_every_steps=10)
    config.train.steps_per_loop = 10
    full = train.train_and_evaluate(config, os.path.join(OUT, "full"))
    calls = {"n": 0}

    def requested():
        calls["n"] += 1
        return calls["n"] == 3

    preemption.requested = requested
    try:
        train.train_and_evaluate(config, os.path.join(OUT, "cut"))
        out["preempted_at"] = None
    except preemption.Preempted as e:
        out["preempted_at"] = e.step
    preemption.requested = lambda: False
    resumed = train.train_and_evaluate(config, os.path.join(OUT, "cut"))
    keys = ("steps", "steps_to_target", "status", "final", "targets")
    out["resume_equal"] = {k: resumed[k] == full[k] for k in keys}


def parallel(out, norm="none"):
    """The same three updates on 1 device, on 8 (shard_map) and on 8 with 2 micro-batches each;
    with ghost batch norm (virtual batches of 4, inside every micro-batch) the moving statistics
    too."""
    import jax

    from wide_tf.engine import arrays, schedules, train
    from wide_tf.engine import optim as optim_lib
    from wide_tf.engine.jax import data as jax_data
    from wide_tf.engine.jax import step as jax_step
    from wide_tf.engine.state import BatchPlan
    from wide_tf.schema import datasets

    config = tiny_config()
    config.model.norm, config.model.ghost_batch_size = norm, 4
    info = arrays.dataset_info(config.data)
    images, labels = arrays.train_arrays(config.data)
    spec = datasets.of(config.data)
    results = {}
    for name, devices, cap in (("one", 1, 0), ("eight", 8, 0), ("eight_micro", 8, 4)):
        import keras

        keras.utils.set_random_seed(0)
        model = train.new_model(config, info)
        sched = schedules.build_schedule(config.optim, 64, 20.0, 100)
        opt_spec = optim_lib.optimizer_spec(config.optim.name)
        optimizer = opt_spec.build(config.optim, 0.0, model.trainable_variables)
        optimizer.build(model.trainable_variables)
        plan = BatchPlan.make(64, devices, cap)
        stepper = jax_step.JaxStepper(
            model,
            optimizer,
            sched,
            plan,
            spec,
            jax.devices()[:devices],
            augment=False,
            diagnostics=None,
        )
        state = stepper.initial_state(
            [np.asarray(w.value) for w in model.weights],
            [np.asarray(v.value) for v in optimizer.variables],
        )
        order = jax_data.TrainOrder(len(labels), 64, 0, 0)
        block = order.take(0, 3)
        hyper = {
            "schedule": {k: np.asarray(v, np.float32) for k, v in sched.numbers().items()},
            "diverge_loss": np.float32(1e3),
            "seed": np.int32(0),
        }
        data = jax.device_put((images, labels), stepper.replicated)
        state, scalars = stepper.train(state, data, block, 3, hyper)
        weights = [np.asarray(x) for x in state["trainable"] + state["non_trainable"]]
        results[name] = (weights, scalars)
        results[name + "_plan"] = plan.describe()
    ref = results["one"][0]
    tag = "" if norm == "none" else f"_{norm}"
    for name in ("eight", "eight_micro"):
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, results[name][0]))
        out[f"max_diff_{name}{tag}"] = diff
        out[f"loss_{name}{tag}"] = results[name][1]["loss_sum"]
        out[f"plan_{name}{tag}"] = results[name + "_plan"]
    out[f"loss_one{tag}"] = results["one"][1]["loss_sum"]
    out[f"weights{tag}"] = len(ref)
    out["devices"] = len(jax.devices())


def probe(out):
    """The exact probe's sums on fixed weights, for the test to compare with TensorFlow's."""
    import keras

    from wide_tf.engine import arrays, train
    from wide_tf.engine.jax import run as jax_run

    config = tiny_config()
    config.train.probe_chunk = 100
    info = arrays.dataset_info(config.data)
    keras.utils.set_random_seed(3)
    model = train.new_model(config, info)
    weights = [np.asarray(w.value) for w in model.weights]
    np.savez(os.path.join(OUT, "probe_weights.npz"), *weights)
    runtime = jax_run.setup_runtime(config.runtime)
    from wide_tf.engine.state import BatchPlan, RunPlan

    bp = BatchPlan.make(64, runtime.num_replicas)
    plan = RunPlan.make(config, "probe", info.num_train, 64)
    backend = jax_run.make(config, OUT, runtime, info, bp, plan, train.new_model, True, print)
    backend.build.init_weights[config.train.seed] = weights
    backend.trainer.holder.state = backend.build.stepper.initial_state(
        weights, backend.build.optimizer_init
    )
    chunks, n = backend.build.probe_chunks(config)
    s1, q, loss = backend.build.probe.probe(backend.trainer.holder.state, chunks)
    out["probe"] = {"s1": s1, "q": q, "loss": loss, "n": n}


def recompute(out):
    """train.target_bn='recompute': the first norm layer's statistics against NumPy's, from the
    first dense layer's outputs over the subset (the mean and the average per-batch variance)."""
    import keras

    from wide_tf.engine import arrays, train
    from wide_tf.engine.jax import run as jax_run
    from wide_tf.engine.models.norm import batch_norm_layers
    from wide_tf.engine.state import BatchPlan, RunPlan
    from wide_tf.schema import datasets

    config = tiny_config(target_bn="recompute", target_bn_examples=128, target_bn_batch=64)
    config.model.norm = "batch"
    info = arrays.dataset_info(config.data)
    runtime = jax_run.setup_runtime(config.runtime)
    bp = BatchPlan.make(64, runtime.num_replicas)
    plan = RunPlan.make(config, "bn", info.num_train, 64)
    run = jax_run.make(config, OUT, runtime, info, bp, plan, train.new_model, True, print)
    state = run.trainer.holder.state
    recomputed = run.build.recompute(state)
    model = run.build.model
    layer = batch_norm_layers(model)[0]
    index = {id(v): i for i, v in enumerate(model.non_trainable_variables)}
    mean = np.asarray(recomputed["non_trainable"][index[id(layer.moving_mean)]])
    var = np.asarray(recomputed["non_trainable"][index[id(layer.moving_variance)]])
    kernel = model.get_layer("dense_1").kernel
    w = np.asarray(state["trainable"][[id(v) for v in model.trainable_variables].index(id(kernel))])
    x, _ = arrays.train_arrays(config.data)
    a = arrays.normalize(x[:128], datasets.of(config.data)).reshape(128, -1) @ w
    batches = a.reshape(2, 64, -1)
    out["recompute_mean_diff"] = float(np.max(np.abs(mean - batches.mean(axis=(0, 1)))))
    out["recompute_var_diff"] = float(np.max(np.abs(var - batches.var(axis=1).mean(axis=0))))
    before = np.asarray(state["non_trainable"][index[id(layer.moving_mean)]])
    out["recompute_left_training_alone"] = bool(np.all(before == 0.0))
    keras.backend.clear_session()


if __name__ == "__main__":
    OUT = sys.argv[1]
    found: dict = {}
    for check in (run_and_import_check, resume, parallel, probe):
        check(found)
    parallel(found, norm="ghost")
    recompute(found)
    print("JSON " + json.dumps(found, default=str))
