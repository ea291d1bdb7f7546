"""The model and its parts in keras.ops: one subprocess under
KERAS_BACKEND=jax computes, from the same weights, inputs and gradients, what this (TensorFlow)
process computes, and the two agree to float tolerance: an MLP and a WRN with batch norm and ghost
batch norm in a training-mode call (under JAX inside `jax.jit`, through `stateless_call`), the
statistics `deferred_statistics` records and the moving statistics `update_moving_statistics`
makes of them (under JAX also split over two vmapped replicas with `jax.lax.pmean` as
`reduce_mean`), the loss and hits, three LARS and momentum-warm-up SGD updates (one case per
architecture; under JAX `stateless_apply` in a `jax.lax.fori_loop` inside `jax.jit`), the LARS
diagnostics and the learning-rate schedule (under JAX vmapped over the steps). There, importing the
engine's model, optimizer, schedule and loss modules loads no TensorFlow, nor does using them.

Run as a script (`python tests/engine/test_keras_ops_backends.py IN OUT`, KERAS_BACKEND=jax) it is
that subprocess; it imports nothing of TensorFlow itself."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# The JAX side runs in a child process: without JAX installed (the TF 2.19.1 CI job) it skips.
pytest.importorskip("jax")

CASES = {
    "mlp-batch": ("mlp", 2, 16, "batch"),
    "mlp-ghost": ("mlp", 2, 16, "ghost"),
    "wrn-batch": ("wrn", 10, 1, "batch"),
    "wrn-ghost": ("wrn", 10, 1, "ghost"),
}
SHAPE, BATCH, CLASSES, GHOST = (8, 8, 3), 16, 4, 4
# (optimizer, its fields): LARS with the momentum warm-up and the 'decayed_grad' form, and SGD
# with momentum, its warm-up and (decoupled) weight decay; a cosine schedule with one warm-up step.
OPTIMIZERS = {
    "lars": dict(momentum_warmup_steps=2, weight_decay=1e-3, lars_trust_ratio="decayed_grad"),
    "momentum": dict(momentum_warmup_steps=2, weight_decay=1e-3),
}
STEPS = 3
# The updates depend on the variables' shapes, not on the norm: one case per architecture.
UPDATED = ("mlp-batch", "wrn-ghost")


def _inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 2.0, size=(BATCH, *SHAPE)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=BATCH).astype(np.int32)
    return x, y


def _grads(variables):
    rng = np.random.default_rng(1)
    return [(0.1 * rng.normal(size=v.shape)).astype(np.float32) for v in variables]


def _build(case, weights):
    from wide_tf.engine.models import build_model

    arch, depth, width, norm_name = CASES[case]
    model = build_model(arch, depth, width, CLASSES, SHAPE, norm=norm_name, ghost_batch_size=GHOST)
    if weights is not None:
        model.set_weights(weights)
    return model


def _optimizer(name, model):
    from wide_tf.engine import optim
    from wide_tf.schema import defaults

    cfg = defaults.optim_config(name, base_lr=0.5)
    cfg.update(dict(schedule="cosine", warmup_fixed="steps", warmup_steps=1, **OPTIMIZERS[name]))
    opt = optim.build_optimizer(cfg, BATCH, 4, 10, model.trainable_variables)
    opt.build(model.trainable_variables)
    return opt


def _schedules(out, values):
    """The schedule's values at steps 0..11 (`values(schedule)`), before and after assign_from."""
    from wide_tf.engine import schedules

    for decay in ("cosine", "multistep", "polynomial"):
        kwargs = dict(total_steps=10, warmup_steps=2, decay=decay, boundaries=[4, 7])
        s = schedules.WarmupDecaySchedule(0.4, variables=True, **kwargs)
        out[f"schedule/{decay}"] = values(s)
        s.assign_from(schedules.WarmupDecaySchedule(0.8, end_lr_fraction=0.1, **kwargs))
        out[f"schedule/{decay}/assigned"] = values(s)


def _losses(logits, y):
    from wide_tf.engine import loss

    return {"loss": loss.per_example_loss(y, logits), "hits": loss.hits(y, logits)}


# ---- the TensorFlow side (this process): the ordinary stateful calls ----------------------------


def _tf_side(weights):
    from keras import ops

    from wide_tf.engine import optim
    from wide_tf.engine.models import norm

    x, y = _inputs()
    out = {}
    _schedules(out, lambda s: np.array([ops.convert_to_numpy(s(i)) for i in range(12)]))
    for case in CASES:
        model = _build(case, weights[case])
        moving = model.non_trainable_variables
        before = [v.numpy() for v in moving]
        logits = model(x, training=True)
        out[f"{case}/logits"] = ops.convert_to_numpy(logits)
        out[f"{case}/moving"] = [v.numpy() for v in moving]
        for k, v in _losses(logits, y).items():
            out[f"{case}/{k}"] = ops.convert_to_numpy(v)
        model.set_weights(weights[case])
        with norm.deferred_statistics() as recorded:
            model(x, training=True)
        for v, b in zip(moving, before):  # recorded, not stepped
            np.testing.assert_array_equal(v.numpy(), b)
        out[f"{case}/recorded"] = [ops.convert_to_numpy(t) for _, m, v in recorded for t in (m, v)]
        norm.update_moving_statistics(recorded)
        out[f"{case}/deferred_moving"] = [v.numpy() for v in moving]
        assert all(np.abs(v.numpy() - b).max() > 1e-3 for v, b in zip(moving, before))
        for name in OPTIMIZERS if case in UPDATED else ():
            model.set_weights(weights[case])
            opt = _optimizer(name, model)
            grads = _grads(model.trainable_variables)
            if name == "lars":
                diag = optim.LARS_DIAGNOSTICS.fn(opt, grads, model.trainable_variables)
                out[f"{case}/{name}/diagnostics"] = [float(diag[k]) for k in sorted(diag)]
            for _ in range(STEPS):
                opt.apply_gradients(zip(grads, model.trainable_variables))
            out[f"{case}/{name}/weights"] = [v.numpy() for v in model.trainable_variables]
    return out


# ---- the JAX side (the subprocess): stateless calls inside jax.jit, as a JAX step makes them -----


def _jax_calls(model, x, y, ghost):
    """One jitted function: the training call, the deferred statistics and the moving statistics
    made of them (for ghost batch norm also on two vmapped replicas, `jax.lax.pmean` their
    `reduce_mean`), the loss and hits."""
    import jax
    import keras

    from wide_tf.engine.models import norm

    moving = model.non_trainable_variables

    def deferred(tv, ntv, x, reduce_mean=None):
        with norm.deferred_statistics() as recorded:
            _, untouched = model.stateless_call(tv, ntv, x, training=True)
        with keras.StatelessScope(state_mapping=list(zip(moving, ntv))) as scope:
            norm.update_moving_statistics(recorded, reduce_mean=reduce_mean)
        stats = [t for _, m, v in recorded for t in (m, v)]
        return untouched, stats, [scope.get_current_value(v) for v in moving]

    def calls(tv, ntv, x, y):
        logits, after = model.stateless_call(tv, ntv, x, training=True)
        res = dict(_losses(logits, y), logits=logits, moving=after)
        res["untouched"], res["recorded"], res["deferred_moving"] = deferred(tv, ntv, x)
        if ghost:
            pmean = lambda values: jax.lax.pmean(values, "r")  # noqa: E731
            split = x.reshape(2, x.shape[0] // 2, *x.shape[1:])
            replica = lambda xr: deferred(tv, ntv, xr, reduce_mean=pmean)[2]  # noqa: E731
            res["two_replicas_moving"] = jax.vmap(replica, axis_name="r")(split)
        return res

    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in moving]
    res = jax.jit(calls)(tv, ntv, x, y)
    for a, b in zip(res.pop("untouched"), ntv):  # recorded, not stepped
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return res


def _jax_updates(opt, model, grads):
    """The LARS diagnostics and STEPS updates through `stateless_apply`, in one jitted function."""
    import jax

    from wide_tf.engine import optim

    def run(ov, tv):
        diag = {}
        if isinstance(opt, optim.LARS):
            diag = optim.LARS_DIAGNOSTICS.fn(opt, grads, model.trainable_variables)
        step = lambda _, state: opt.stateless_apply(state[1], grads, state[0])  # noqa: E731
        return jax.lax.fori_loop(0, STEPS, step, (tv, ov))[0], diag

    return jax.jit(run)(
        [v.value for v in opt.variables], [v.value for v in model.trainable_variables]
    )


def _jax_side(weights):
    import jax

    x, y = _inputs()
    out = {}
    _schedules(out, lambda s: np.asarray(jax.jit(jax.vmap(s))(np.arange(12))))
    for case in CASES:
        model = _build(case, weights[case])
        for k, v in _jax_calls(model, x, y, ghost=case.endswith("ghost")).items():
            out[f"{case}/{k}"] = [np.asarray(a) for a in v] if isinstance(v, list) else v
        for name in OPTIMIZERS if case in UPDATED else ():
            opt = _optimizer(name, model)
            new, diag = _jax_updates(opt, model, _grads(model.trainable_variables))
            if diag:
                out[f"{case}/{name}/diagnostics"] = [float(diag[k]) for k in sorted(diag)]
            out[f"{case}/{name}/weights"] = [np.asarray(v) for v in new]
    return out


def _flatten(out):
    flat = {}
    for k, v in out.items():
        if isinstance(v, list):
            flat.update({f"{k}#{i}": np.asarray(a) for i, a in enumerate(v)})
        else:
            flat[k] = np.asarray(v)
    return flat


def _worker(inp, outp):
    """The subprocess: the modules imported first (and TensorFlow's absence checked), then the
    JAX side's numbers written to `outp`."""
    import keras

    from wide_tf.engine import loss, models, optim, schedules  # noqa: F401

    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
    with np.load(inp) as f:
        weights = {c: [f[f"{c}#{i}"] for i in range(int(f[f"{c}#n"]))] for c in CASES}
    out = _flatten(_jax_side(weights))
    out["backend"] = np.array(keras.backend.backend())
    out["tf_modules_on_import"] = np.array(" ".join(loaded[:5]))
    used = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
    out["tf_modules_after_use"] = np.array(" ".join(used[:5]))
    np.savez(outp, **out)


# ---- the test ------------------------------------------------------------------------------------


def test_tensorflow_and_jax_backends_compute_the_same_model_optimizer_and_schedule(tmp_path):
    import keras

    assert keras.backend.backend() == "tensorflow"
    weights = {}
    for case in CASES:
        keras.utils.set_random_seed(7)
        weights[case] = _build(case, None).get_weights()
        # Moving statistics away from (0, 1), so the update's arithmetic shows.
        for i, w in enumerate(weights[case]):
            if w.ndim == 1:
                weights[case][i] = np.linspace(0.5, 1.5, w.size, dtype=np.float32)
    inp, outp = tmp_path / "weights.npz", tmp_path / "jax.npz"
    np.savez(
        inp,
        **{f"{c}#{i}": w for c, ws in weights.items() for i, w in enumerate(ws)},
        **{f"{c}#n": np.array(len(ws)) for c, ws in weights.items()},
    )
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, __file__, str(inp), str(outp)],
        env=env,
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        mine = _flatten(_tf_side(weights))  # while the subprocess runs
        log, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, log[-4000:]
    with np.load(outp) as f:
        theirs = {k: f[k] for k in f.files}
    assert str(theirs.pop("backend")) == "jax"
    assert str(theirs.pop("tf_modules_on_import")) == "", "TensorFlow loaded under JAX"
    assert str(theirs.pop("tf_modules_after_use")) == "", "TensorFlow loaded under JAX"
    for case in UPDATED:  # the updates moved every weight, and differently for each optimizer
        for i, w in enumerate(weights[case][:1]):
            lars, sgd = mine[f"{case}/lars/weights#{i}"], mine[f"{case}/momentum/weights#{i}"]
            assert np.abs(lars - w).min() > 0 and np.abs(sgd - w).min() > 0
            assert not np.allclose(lars, sgd)
    for case in CASES:  # two replicas' copies, each the one-replica whole batch's statistics
        if case.endswith("ghost"):
            pairs = [k for k in theirs if k.startswith(f"{case}/two_replicas_moving#")]
            assert pairs
            for k in pairs:
                ref = mine[k.replace("two_replicas_moving", "deferred_moving")]
                for copy in theirs.pop(k):
                    np.testing.assert_allclose(copy, ref, rtol=1e-5, atol=1e-6, err_msg=k)
    assert sorted(set(theirs) ^ set(mine)) == []
    for k in sorted(mine):
        if k.endswith("/hits"):
            np.testing.assert_array_equal(theirs[k], mine[k], err_msg=k)
        else:
            np.testing.assert_allclose(theirs[k], mine[k], rtol=1e-5, atol=1e-6, err_msg=k)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
