"""Owns the JAX backend's compiled computations: the multi-step training loop (data parallel over
the local devices with shard_map, gradients summed by a psum inside XLA; micro-batches by
lax.scan with the batch-norm statistics merged as engine/tf/accumulate.py merges them; divergence
caught on the device), the bounded evaluation pass, and the exact per-example gradient probe
(jax.vmap of jax.grad). One Keras model and optimizer, called statelessly
(`stateless_call`, `stateless_apply`), so the layers, the loss and the optimizers are the package's
own keras.ops code. Compiled once per (member, batch): the schedule's numbers, the divergence
threshold and the seed are arguments."""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wide_tf.engine import timing
from wide_tf.engine.host_scalars import TRAIN_SCALARS
from wide_tf.engine.jax import data as jax_data
from wide_tf.engine.loss import hits, per_example_loss
from wide_tf.engine.models import norm
from wide_tf.engine.state import BatchPlan

_KEPT = ("grad_norm_sq", "update_norm_sq", "param_norm_sq")  # the last live step's, not sums


def _sq(tree) -> jax.Array:
    leaves = jax.tree.leaves(tree)
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves) if leaves else 0.0


@contextlib.contextmanager
def _nothing():
    yield None


def _go_on(sums, bound):
    """Whether a pass whose [loss sum, hits, examples] so far are `sums` can still meet a target
    (engine/tf/step.go_on's rule: every example to come a hit, or every one a zero loss)."""
    best_hits = sums[1] + (bound[2] - sums[2])
    return (best_hits >= bound[0]) | (sums[0] <= bound[1])


def _index(variables, variable) -> int:
    return [id(v) for v in variables].index(id(variable))


class JaxStepper:
    """The device side of a run on JAX. `state` is a dict of the model's trainable and
    non-trainable values, the optimizer's values and the divergence flag; every function takes
    and returns it (nothing lives in Keras variables between calls)."""

    def __init__(
        self, model, optimizer, schedule, plan: BatchPlan, spec, devices, *, augment, diagnostics
    ):
        self.model, self.optimizer, self.plan, self.spec = model, optimizer, plan, spec
        # engine/schedules.WarmupDecaySchedule: its structure here, its numbers an argument.
        self.optimizer_schedule = schedule
        self.augment = bool(augment)
        self.mesh = Mesh(np.asarray(devices), ("data",))
        self.replicated = NamedSharding(self.mesh, P())
        self.diagnostics = diagnostics
        self.scalar_names = TRAIN_SCALARS + (diagnostics.names if diagnostics else ())
        self._two_batch = plan.num_replicas * plan.num_micro_batches > 1
        self._lr = _index(optimizer.variables, optimizer._learning_rate)
        self._iterations = _index(optimizer.variables, optimizer.iterations)
        self._nt_index = {id(v): i for i, v in enumerate(model.non_trainable_variables)}
        self._adapted = None
        if diagnostics is not None:
            self._adapted = [optimizer.is_adapted(v) for v in model.trainable_variables]
        # No donation: the evaluation snapshot may hold the previous state's arrays.
        self._train_fn = jax.jit(self._train_loop)
        # CPUs: steps and evaluation batches dispatched from the host (see `train`).
        self.host_loop = all(d.platform == "cpu" for d in devices)
        self._step_fn = jax.jit(self._one_step)
        self._closing_fn = jax.jit(self._closing)

    # ---- state -----------------------------------------------------------------------------

    def initial_state(self, weights: list, optimizer_values: list) -> dict:
        """The state from the model's weights (in model.weights order) and the optimizer's values
        (in optimizer.variables order), replicated on every device."""
        by_id = {id(v): np.asarray(w) for v, w in zip(self.model.weights, weights)}
        state = {
            "trainable": [by_id[id(v)] for v in self.model.trainable_variables],
            "non_trainable": [by_id[id(v)] for v in self.model.non_trainable_variables],
            "optimizer": [np.asarray(o) for o in optimizer_values],
            "diverged": np.asarray(False),
        }
        return jax.device_put(state, self.replicated)

    def weights(self, state) -> list:
        """The state's model weights in model.weights order (NumPy)."""
        by_id = {}
        for kind in ("trainable", "non_trainable"):
            variables = getattr(self.model, f"{kind}_variables")
            by_id.update({id(v): np.asarray(x) for v, x in zip(variables, state[kind])})
        return [by_id[id(v)] for v in self.model.weights]

    # ---- training --------------------------------------------------------------------------

    def _grads(self, trainable, non_trainable, x, y):
        """One replica's (loss sum, hits, gradients of loss sum / global batch, |micro-batch
        gradient|^2 summed over micro-batches, new non-trainable values)."""
        plan = self.plan
        deferred = plan.num_micro_batches > 1
        layers: list = []  # the norm layers in call order, as the trace records them

        def loss_fn(tv, xb, yb):
            # Micro-batches: the norm layers record their statistics instead of stepping the
            # moving averages; they are returned as outputs (a value computed under
            # value_and_grad must leave it as one, never through a side channel).
            with norm.deferred_statistics() if deferred else _nothing() as recorded:
                logits, new_nt = self.model.stateless_call(tv, non_trainable, xb, training=True)
            stats = []
            if deferred:
                layers[:] = [layer for layer, _, _ in recorded]
                stats = [(mean, var) for _, mean, var in recorded]
            losses = per_example_loss(yb, logits)
            total = jnp.sum(losses)
            aux = (total, jnp.sum(hits(yb, logits)), new_nt, stats)
            return total / plan.global_batch, aux

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        scale = (plan.global_batch / plan.micro_batch) ** 2
        if not deferred:
            (_, (loss_sum, correct, new_nt, _)), grads = grad_fn(trainable, x, y)
            small = _sq(grads) * scale if self._two_batch else jnp.float32(0.0)
            return loss_sum, correct, grads, small, new_nt
        m = plan.num_micro_batches
        xs = x.reshape((m, plan.micro_batch) + x.shape[1:])
        ys = y.reshape((m, plan.micro_batch))

        def micro(carry, xy):
            (_, (loss_i, correct_i, _, stats)), g = grad_fn(trainable, *xy)
            loss_sum, correct, grads, small = carry
            grads = jax.tree.map(jnp.add, grads, g)
            small = small + (_sq(g) * scale if self._two_batch else 0.0)
            return (loss_sum + loss_i, correct + correct_i, grads, small), stats

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        init = (jnp.float32(0.0), jnp.float32(0.0), zeros, jnp.float32(0.0))
        (loss_sum, correct, grads, small), stats = jax.lax.scan(micro, init, (xs, ys))
        new_nt = list(non_trainable)
        for layer, (means, variances) in zip(layers, stats):
            # The step's statistics from the micro-batches' (equal sizes): the mean of the means,
            # and the mean of the variances plus, for batch norm, the variance of the means
            # (engine/tf/accumulate._merge's pairwise update, in closed form).
            mean, var = jnp.mean(means, axis=0), jnp.mean(variances, axis=0)
            if not isinstance(layer, norm.GhostBatchNormalization):
                var = var + jnp.mean(jnp.square(means - mean), axis=0)
            for moving, value in ((layer.moving_mean, mean), (layer.moving_variance, var)):
                i = self._nt_index[id(moving)]
                old = new_nt[i].astype(jnp.float32)
                new_nt[i] = (old * layer.momentum + value * (1.0 - layer.momentum)).astype(
                    new_nt[i].dtype
                )
        return loss_sum, correct, grads, small / m, new_nt

    def _replica_step(self, state, x, y, hyper):
        """One update on this replica's share of the batch (inside shard_map: the sums, the
        gradients and the moving statistics are reduced over the 'data' axis here)."""
        loss_sum, correct, grads, small, new_nt = self._grads(
            state["trainable"], state["non_trainable"], x, y
        )
        grads = jax.lax.psum(grads, "data")
        loss_sum, correct, small = jax.lax.psum((loss_sum, correct, small), "data")
        small = small / self.plan.num_replicas
        # Each replica's moving statistics from its own examples, then their mean: the copies stay
        # equal (ghost batch norm on TensorFlow does the same; Keras's batch norm lets them drift).
        new_nt = jax.lax.pmean(new_nt, "data")
        loss = loss_sum / self.plan.global_batch
        big = _sq(grads)
        bad = ~jnp.isfinite(loss) | (loss > hyper["diverge_loss"]) | ~jnp.isfinite(big)
        opt = list(state["optimizer"])
        schedule = self.optimizer_schedule
        opt[self._lr] = schedule.at(opt[self._iterations], hyper["schedule"]).astype(
            opt[self._lr].dtype
        )
        diag = {}
        if self.diagnostics is not None:
            diag = self._diagnostics(grads, state["trainable"])
        trainable, opt = self.optimizer.stateless_apply(opt, grads, state["trainable"])
        update = jax.tree.map(jnp.subtract, trainable, state["trainable"])
        new = {
            "trainable": trainable,
            "non_trainable": new_nt,
            "optimizer": opt,
        }
        sums = {
            "loss_sum": loss_sum,
            "correct": correct,
            "examples": jnp.float32(self.plan.global_batch),
            "small_grad_sq": small,
            "big_grad_sq": big,
            "steps": jnp.float32(1.0),
            "grad_norm_sq": big,
            "update_norm_sq": _sq(update),
            "param_norm_sq": _sq(trainable),
            **diag,
        }
        return new, sums, bad

    def _diagnostics(self, grads, trainable) -> dict:
        """The optimizer's own scalars (the LARS trust ratios' min, mean and max)."""
        ratios = [
            self.optimizer._trust(g, w)[0].astype(jnp.float32)
            for g, w, adapted in zip(grads, trainable, self._adapted)
            if adapted
        ]
        r = jnp.stack(ratios) if ratios else jnp.full([1], jnp.nan, jnp.float32)
        values = {"min": jnp.min(r), "mean": jnp.mean(r), "max": jnp.max(r)}
        return {name: values[name.rsplit("_", 1)[-1]] for name in self.diagnostics.names}

    def _initial_sums(self) -> dict:
        acc = {k: jnp.float32(0.0) for k in TRAIN_SCALARS}
        acc.update({k: jnp.float32(jnp.nan) for k in self.scalar_names if k not in TRAIN_SCALARS})
        return acc

    def _body(self, state, acc, data, index, epochs, hyper):
        """One update on the global batch of example indices `index` (engine/jax/data.TrainOrder);
        the sums of a live step added: once the run diverges, the later steps change nothing and
        count for nothing (the first diverged step is applied and counted, as on TensorFlow)."""
        images, labels = data
        step = jax.shard_map(
            self._replica_step,
            mesh=self.mesh,
            in_specs=(P(), P("data"), P("data"), P()),
            out_specs=(P(), P(), P()),
            check_vma=False,
        )
        x = images[index]
        if self.spec is not None and x.dtype == jnp.uint8:
            if self.augment:
                x = jax_data.augment(x, index, epochs, hyper["seed"], self.spec)
            x = jax_data.normalize(x, self.spec)
        new, sums, bad = step(state, x, labels[index], hyper)
        live = ~state["diverged"]
        keep = lambda a, b: jnp.where(live, a, b)  # noqa: E731
        out = jax.tree.map(keep, new, {k: state[k] for k in new})
        out["diverged"] = state["diverged"] | bad
        # Sums add a live step's value; the norms and diagnostics keep the last live step's.
        summed = lambda k: k in TRAIN_SCALARS and k not in _KEPT  # noqa: E731
        acc = {k: v + keep(sums[k], 0.0) if summed(k) else keep(sums[k], v) for k, v in acc.items()}
        return out, acc

    def _closing(self, state, acc, hyper):
        """The call's outputs: the sums, the optimizer's step and the next step's learning rate."""
        opt = state["optimizer"]
        lr = self.optimizer_schedule.at(opt[self._iterations], hyper["schedule"])
        return dict(acc, learning_rate=lr, iteration=opt[self._iterations])

    def _train_loop(self, state, data, block, num_steps, hyper):
        """`num_steps` updates (at most the block's rows) in one device program."""
        timing.note_trace()
        index, epochs = block

        def body(i, carry):
            state, acc = carry
            return self._body(state, acc, data, index[i], epochs[i], hyper)

        state, acc = jax.lax.fori_loop(0, num_steps, body, (state, self._initial_sums()))
        return state, self._closing(state, acc, hyper)

    def _one_step(self, state, acc, data, index, epochs, hyper):
        timing.note_trace()
        return self._body(state, acc, data, index, epochs, hyper)

    def train(self, state, data, block, num_steps: int, hyper) -> tuple[dict, dict]:
        """Runs `num_steps` updates; returns (new state, host scalars) with one device read. On
        a CPU the steps are dispatched one by one from here (the state stays on the device): XLA's
        CPU backend runs a convolution inside a device loop (lax.fori_loop) about 30x slower than
        outside one (WRN-10-1 at batch 256: 64 s against 2.2 s for one forward-backward pass,
        measured here), while a dispatch costs well under a millisecond."""
        if self.host_loop:
            index, epochs = block
            acc = self._initial_sums()
            for i in range(num_steps):
                state, acc = self._step_fn(state, acc, data, index[i], epochs[i], hyper)
            out = self._closing_fn(state, acc, hyper)
        else:
            state, out = self._train_fn(state, data, block, np.int32(num_steps), hyper)
        out = jax.device_get(out)
        scalars = {k: float(v) for k, v in out.items()}
        scalars["diverged"] = bool(jax.device_get(state["diverged"]))
        scalars["iteration"] = int(out["iteration"])
        return state, scalars


class JaxEvaluation:
    """The bounded evaluation pass of a stepper's model (one device program, or batch by batch
    from the host on a CPU: see JaxStepper.train)."""

    def __init__(self, stepper: JaxStepper):
        self.model, self.spec, self.host_loop = stepper.model, stepper.spec, stepper.host_loop
        self._eval_fn = jax.jit(self._eval_pass)
        self._eval_batch_fn = jax.jit(self._eval_batch)

    def _batch_sums(self, trainable, non_trainable, x, y, w):
        """[loss sum, hits, examples] of one evaluation batch (padding rows have weight 0)."""
        if self.spec is not None and x.dtype == jnp.uint8:
            x = jax_data.normalize(x, self.spec)
        x = x * w.reshape((-1,) + (1,) * (x.ndim - 1))  # padding rows: zero images
        logits, _ = self.model.stateless_call(trainable, non_trainable, x, training=False)
        losses, hit = per_example_loss(y, logits), hits(y, logits)
        return jnp.stack([jnp.sum(losses * w), jnp.sum(hit * w), jnp.sum(w)])

    def _eval_pass(self, trainable, non_trainable, images, labels, weights, bound):
        """[loss sum, hits, examples] over the set's batches, until `bound` says no target can
        be met (engine/tf/step.go_on's rule), in one device program."""
        timing.note_trace()

        def body(carry):
            i, sums = carry
            batch = self._batch_sums(trainable, non_trainable, images[i], labels[i], weights[i])
            return i + 1, sums + batch

        cond = lambda c: (c[0] < images.shape[0]) & _go_on(c[1], bound)  # noqa: E731
        _, sums = jax.lax.while_loop(cond, body, (0, jnp.zeros([3], jnp.float32)))
        return sums

    def _eval_batch(self, trainable, non_trainable, x, y, w):
        timing.note_trace()
        return self._batch_sums(trainable, non_trainable, x, y, w)

    def evaluate(self, state, eval_set, bound=None) -> dict | None:
        """{"loss", "accuracy", "examples"} of the state's model over `eval_set` (JaxEvalSet);
        None when `bound` stopped the pass early. On a CPU, batch by batch from here (see
        `train`), the early stop read on the host after each batch."""
        lo, hi = (-math.inf, math.inf) if bound is None else bound
        b = np.asarray([lo, hi, float(eval_set.num_examples)], np.float32)
        trainable, non_trainable = state["trainable"], state["non_trainable"]
        if self.host_loop:
            sums = np.zeros(3, np.float32)
            for i in range(eval_set.x.shape[0]):
                if not _go_on(sums, b):
                    break
                got = self._eval_batch_fn(
                    trainable, non_trainable, eval_set.x[i], eval_set.y[i], eval_set.w[i]
                )
                sums = sums + np.asarray(jax.device_get(got))
        else:
            sums = self._eval_fn(
                trainable, non_trainable, eval_set.x, eval_set.y, eval_set.w, jnp.asarray(b)
            )
        loss, hit, count = (float(v) for v in jax.device_get(sums))
        if count < eval_set.num_examples:
            return None
        if count == 0:
            raise ValueError("the evaluation set is empty")
        return {"loss": loss / count, "accuracy": hit / count, "examples": count}


class JaxRecompute:
    """train.target_bn='recompute' on JAX: the batch-norm statistics the evaluations use, set from
    a fixed training subset (engine/tf/bn_stats.BatchNormRecompute's rule: each layer's moving mean
    and variance become the plain average of its per-batch training-mode statistics, of its ghost
    groups' for ghost batch norm). The training run's own statistics are untouched: JAX's state is
    never written in place, so the evaluation simply reads a recomputed copy."""

    def __init__(self, stepper: JaxStepper, batches):
        self.model, self.nt_index = stepper.model, stepper._nt_index
        self.batches = batches  # [k, batch, ...] float32 inputs on the devices
        self._fn = jax.jit(self._recompute)

    def _recompute(self, trainable, non_trainable):
        timing.note_trace()
        sums: dict = {}
        for i in range(self.batches.shape[0]):  # a handful of batches (target_bn_examples)
            with norm.deferred_statistics() as recorded:
                self.model.stateless_call(trainable, non_trainable, self.batches[i], training=True)
            for layer, mean, var in recorded:
                total = sums.setdefault(id(layer), [layer, 0.0, 0.0])
                total[1], total[2] = total[1] + mean, total[2] + var
        out = list(non_trainable)
        k = self.batches.shape[0]
        for layer, mean, var in sums.values():
            for moving, value in ((layer.moving_mean, mean / k), (layer.moving_variance, var / k)):
                i = self.nt_index[id(moving)]
                out[i] = value.astype(out[i].dtype)
        return out

    def __call__(self, state) -> dict:
        """`state` with the recomputed statistics in place of its moving ones."""
        return dict(state, non_trainable=self._fn(state["trainable"], state["non_trainable"]))


class JaxProbe:
    """The exact gradient probe of a stepper's model: per-example gradients by vmap of grad."""

    def __init__(self, stepper: JaxStepper):
        self.model = stepper.model
        self._probe_fn = jax.jit(self._probe_chunk)

    def _probe_chunk(self, trainable, non_trainable, x, y, w):
        """(sum_i |g_i|^2, sum_i g_i, loss sum) over one chunk of the probe set: g_i the gradient
        of example i's loss in inference mode (moving batch-norm statistics), by vmap of grad."""
        timing.note_trace()

        def loss_one(tv, xi, yi):
            logits, _ = self.model.stateless_call(tv, non_trainable, xi[None], training=False)
            return per_example_loss(yi[None], logits)[0]

        with jax.default_matmul_precision("highest"):  # no TF32 / bf16 passes on GPUs and TPUs
            losses, g = jax.vmap(jax.value_and_grad(loss_one), in_axes=(None, 0, 0))(
                trainable, x, y
            )
        sq = sum(jnp.sum(jnp.square(gi).reshape(gi.shape[0], -1), axis=1) for gi in g)
        summed = [jnp.tensordot(w, gi, axes=1) for gi in g]
        return jnp.sum(sq * w), summed, jnp.sum(losses * w)

    def probe(self, state, chunks) -> tuple[float, float, float]:
        """(sum of per-example squared norms, |sum of gradients|^2, loss sum) over the chunks."""
        s1, loss, summed = 0.0, 0.0, None
        for x, y, w in chunks:
            a, g, lo = self._probe_fn(state["trainable"], state["non_trainable"], x, y, w)
            s1, loss = s1 + a, loss + lo
            summed = g if summed is None else jax.tree.map(jnp.add, summed, g)
        q = _sq(summed)
        s1, q, loss = jax.device_get((s1, q, loss))
        return float(s1), float(q), float(loss)
