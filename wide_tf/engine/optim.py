"""Optimizers: LARS on Keras 3, weight decay that spares biases and norms, and the optimizers by
name (OPTIMIZERS, build_optimizer). The learning rates they are given: engine/schedules.py.

The update rules (LARS, the momentum warm-up) and the LARS diagnostics are written in keras.ops:
the same optimizers run under the TensorFlow and the JAX Keras backends (under JAX through Keras's
`stateless_apply`), and this module never imports TensorFlow."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence

import keras
from absl import logging
from keras import ops

from wide_tf.engine.schedules import build_schedule
from wide_tf.schema import optimizers
from wide_tf.schema.fields import TRUST_RATIO_FORMS

# Variables of rank <= this (biases, batch-norm gamma/beta) are excluded from LARS adaptation and
# from weight decay. By rank rather than by name: layer names change with the architecture, ranks
# do not.
DEFAULT_EXCLUDE_RANK = 1


def _rank(variable) -> int:
    return len(variable.shape)


def _is_low_rank(variable, exclude_rank: int = DEFAULT_EXCLUDE_RANK) -> bool:
    return exclude_rank >= 0 and _rank(variable) <= exclude_rank


class _CallerExclusions:
    """Mixin: remembers what a caller passed to Keras's public `exclude_from_weight_decay` (the ids
    of `var_list`, the `var_names` pattern) so that build can add the low-rank variables to it
    through the same public call, and LARS can apply it itself. Only ids and one string are kept:
    variables in an attribute would be tracked into the optimizer's checkpoints."""

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self._caller_excluded_ids = frozenset(id(v) for v in var_list or ())
        self._caller_excluded_names = "|".join(sorted(set(var_names or ()))) or None
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def _excluded_by_caller(self, variable) -> bool:
        if id(variable) in getattr(self, "_caller_excluded_ids", ()):
            return True
        names = getattr(self, "_caller_excluded_names", None)
        return bool(names) and re.search(names, variable.name) is not None


def describe_exclusions(variables: Iterable, exclude_rank: int = DEFAULT_EXCLUDE_RANK) -> dict:
    """Splits variables by the rank rule: {'excluded': [names], 'adapted': [names]} (rank <=
    exclude_rank excluded)."""
    excluded, adapted = [], []
    for v in variables:
        (excluded if _is_low_rank(v, exclude_rank) else adapted).append(
            v.path if hasattr(v, "path") else v.name
        )
    return {"excluded": excluded, "adapted": adapted}


def _log_exclusions(owner: str, variables: Sequence, exclude_rank: int, what: str) -> None:
    d = describe_exclusions(variables, exclude_rank)
    logging.info(
        "%s: %d variable(s) of rank <= %d excluded from %s: %s",
        owner,
        len(d["excluded"]),
        exclude_rank,
        what,
        ", ".join(d["excluded"]) or "(none)",
    )


# --------------------------------------------------------------------------------------------------
# Momentum warm-up
# --------------------------------------------------------------------------------------------------


def ramped_momentum(momentum, iterations, warmup_steps: int, dtype):
    """The momentum of the step after `iterations` completed ones, with optim.momentum_warmup_steps
    = `warmup_steps`: momentum * min(1, iterations / warmup_steps), i.e. 0 at the first step (plain
    SGD), rising linearly, the full value from step warmup_steps + 1 on. Computed in the graph from
    the optimizer's own step counter: no host update, no retrace, and exact on resume."""
    m = ops.cast(momentum, dtype)
    if not warmup_steps:
        return m
    return m * ops.minimum(ops.cast(iterations, dtype) / float(warmup_steps), 1.0)


# --------------------------------------------------------------------------------------------------
# LARS
# --------------------------------------------------------------------------------------------------


def _norm(x):
    """The Euclidean norm of every entry of `x` (any rank; keras.ops.norm takes at most two axes,
    a convolution kernel has four): tf.norm's ops under its name scope, so that the TensorFlow
    graph stays the one tf.norm built (Grappler's rewrites see op names: models/norm.py)."""
    with keras.name_scope("norm"):
        return ops.squeeze(ops.sqrt(ops.sum(x * x, keepdims=True)))


def compute_trust_ratio(w_norm, g_norm, gd_norm, eta, weight_decay, epsilon=0.0, form="you"):
    """LARS trust ratio of one variable from its norms.

    w_norm = |w|, g_norm = |g|, gd_norm = |g + wd*w| (only used by form 'decayed_grad').
      'you'          (You et al. 2017):  eta * |w| / (|g| + wd*|w| + epsilon)
      'decayed_grad' (common variant):   eta * |w| / (|g + wd*w| + epsilon)
    The ratio is 1.0 where |w| == 0 (fresh zero-initialised weights) or the gradient norm in the
    denominator is 0 (|g| for 'you', |g + wd*w| for 'decayed_grad'), so such a variable gets the
    plain learning rate.
    """
    if form == "you":
        denom, g_for_test = g_norm + weight_decay * w_norm + epsilon, g_norm
    elif form == "decayed_grad":
        denom, g_for_test = gd_norm + epsilon, gd_norm
    else:
        raise ValueError(
            f"Unknown LARS trust ratio form {form!r}; valid: {', '.join(TRUST_RATIO_FORMS)}"
        )
    ok = ops.logical_and(w_norm > 0.0, g_for_test > 0.0)
    safe_denom = ops.where(ok, denom, ops.ones_like(denom))
    return ops.where(ok, eta * w_norm / safe_denom, ops.ones_like(w_norm))


@keras.saving.register_keras_serializable(package="wide_tf")
class LARS(_CallerExclusions, keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017) with heavy-ball or Nesterov momentum,
    for Keras 3.

    For an adapted variable w (rank > exclude_rank, and not excluded by
    `exclude_from_weight_decay`), with gradient g, learning rate lr (the schedule's value at this
    step), momentum m and velocity v:

        g'    = g + wd * w              (L2 weight decay, coupled: it goes through the trust ratio)
        trust = compute_trust_ratio(|w|, |g|, |g'|)
                                        (form 'you' or 'decayed_grad'; 1.0 where a norm is 0)
        local = lr * trust                          (clip=False)
        local = lr * min(trust / lr, 1) = min(trust, lr)   (clip=True, LARC-style)
        v     = m * v + local * g'
        w     = w - v                               (nesterov=False)
        w     = w - (m * v + local * g')            (nesterov=True, with the updated v)

    Excluded variables (biases, batch-norm parameters: rank <= 1 by default) get plain momentum SGD
    with no weight decay: v = m * v + lr * g; w -= v (Nesterov: w -= m * v + lr * g).

    LARC clipping (clip=True) follows NVIDIA apex's LARC: the scaled gradient is
    g' * min(trust/lr, 1) and the step uses lr, so the local learning rate is min(trust, lr): a
    layer never steps faster than the global lr.

    Keras' own decoupled weight decay (`Optimizer._apply_weight_decay`) is disabled here, because
    LARS weight decay is part of the adapted gradient above; `weight_decay` means the coupled
    coefficient wd."""

    def __init__(
        self,
        learning_rate=0.1,
        momentum=0.9,
        eta=0.001,
        weight_decay=0.0,
        trust_ratio="you",
        epsilon=0.0,
        clip=False,
        nesterov=False,
        exclude_rank=DEFAULT_EXCLUDE_RANK,
        momentum_warmup_steps=0,
        name="lars",
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate, weight_decay=weight_decay, name=name, **kwargs
        )
        if trust_ratio not in TRUST_RATIO_FORMS:
            raise ValueError(
                f"Unknown LARS trust ratio form {trust_ratio!r}; "
                f"valid: {', '.join(TRUST_RATIO_FORMS)}"
            )
        if not 0.0 <= float(momentum) < 1.0:
            raise ValueError(f"LARS momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.eta = float(eta)
        self.trust_ratio = trust_ratio
        self.epsilon = float(epsilon)
        self.clip = bool(clip)
        self.nesterov = bool(nesterov)
        self.exclude_rank = int(exclude_rank)
        self.momentum_warmup_steps = int(momentum_warmup_steps)

    # Weight decay is folded into g' in update_step: Keras' decoupled decay must not run on top.
    def _apply_weight_decay(self, variables):
        return

    @property
    def _wd(self) -> float:
        return float(self.weight_decay or 0.0)

    def is_adapted(self, variable) -> bool:
        """True if the variable gets the trust ratio and weight decay; False for the excluded
        (plain momentum)."""
        return not _is_low_rank(variable, self.exclude_rank) and not self._excluded_by_caller(
            variable
        )

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # Velocity slots for every variable (also with momentum 0): checkpoints have one layout.
        self.velocities = self.add_optimizer_variables(variables, "velocity")
        excluded = [v.path for v in variables if not self.is_adapted(v)]
        logging.info(
            "LARS %s: %d of %d variables excluded from trust-ratio adaptation and weight decay "
            "(rank <= %d or explicitly excluded): %s",
            self.name,
            len(excluded),
            len(variables),
            self.exclude_rank,
            ", ".join(excluded) or "(none)",
        )

    def _trust(self, gradient, variable):
        w = ops.convert_to_tensor(variable)
        g = ops.cast(ops.convert_to_tensor(gradient), w.dtype)
        wd = ops.cast(self._wd, w.dtype)
        g_decayed = g + wd * w
        w_norm = _norm(w)
        g_norm = _norm(g)
        gd_norm = _norm(g_decayed) if self.trust_ratio == "decayed_grad" else g_norm
        trust = compute_trust_ratio(
            w_norm,
            g_norm,
            gd_norm,
            ops.cast(self.eta, w.dtype),
            wd,
            ops.cast(self.epsilon, w.dtype),
            self.trust_ratio,
        )
        return trust, g_decayed

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        g = ops.cast(ops.convert_to_tensor(gradient), variable.dtype)
        m = ramped_momentum(
            self.momentum, self.iterations, self.momentum_warmup_steps, variable.dtype
        )
        v = self.velocities[self._get_variable_index(variable)]
        if self.is_adapted(variable):
            trust, g = self._trust(g, variable)
            local = ops.minimum(trust, lr) if self.clip else lr * trust
        else:
            local = lr
        step = local * g
        new_v = m * v + step
        self.assign(v, new_v)
        self.assign_sub(variable, m * new_v + step if self.nesterov else new_v)

    def get_config(self):
        config = super().get_config()
        config.update(
            momentum=self.momentum,
            eta=self.eta,
            trust_ratio=self.trust_ratio,
            epsilon=self.epsilon,
            clip=self.clip,
            nesterov=self.nesterov,
            exclude_rank=self.exclude_rank,
            momentum_warmup_steps=self.momentum_warmup_steps,
        )
        return config


def lars_trust_ratios(optimizer: LARS, grads: Sequence, variables: Sequence):
    """Vector of the (unclipped) trust ratios of the adapted variables, as update_step computes
    them.

    For logging (min/mean/max) from inside the compiled step. Pass the gradients update_step
    will see (the all-reduced ones, under a strategy). Variables that are excluded or have a None
    gradient are skipped; the order follows `variables`. Returns a float32 vector, empty if
    nothing is adapted. With clip=True the local learning rate is min(trust, lr), i.e. the
    effective ratio is min(trust/lr, 1); this returns trust itself.
    """
    if not isinstance(optimizer, LARS):
        raise TypeError(f"lars_trust_ratios needs a LARS optimizer, got {type(optimizer).__name__}")
    ratios = [
        ops.cast(optimizer._trust(g, v)[0], "float32")
        for g, v in zip(grads, variables)
        if g is not None and optimizer.is_adapted(v)
    ]
    return ops.stack(ratios) if ratios else ops.zeros((0,), "float32")


# --------------------------------------------------------------------------------------------------
# Keras optimizers with weight decay excluded from low-rank variables
# --------------------------------------------------------------------------------------------------


class _ExcludeLowRankFromDecay(_CallerExclusions):
    """Mixin: at build, adds every variable of rank <= exclude_rank to Keras' weight-decay
    exclusions through its public `exclude_from_weight_decay` (what a caller excluded before is
    kept).

    Doing it at build (not only in the factory) means the biases and BN parameters are excluded
    however the optimizer is built. Keras 3's weight decay is decoupled: before each update,
    w -= lr * wd * w with lr the current scheduled learning rate (for plain SGD that equals L2 on
    the loss; with momentum or Adam it does not, because the decay bypasses the momentum/moment
    estimates)."""

    def __init__(self, *args, exclude_rank=DEFAULT_EXCLUDE_RANK, **kwargs):
        super().__init__(*args, **kwargs)
        self.exclude_rank = int(exclude_rank)

    def build(self, variables):
        if self.built:
            return
        ids = getattr(self, "_caller_excluded_ids", frozenset())
        excluded = [v for v in variables if _is_low_rank(v, self.exclude_rank) or id(v) in ids]
        names = getattr(self, "_caller_excluded_names", None)
        super().exclude_from_weight_decay(
            var_list=excluded, var_names=names.split("|") if names else None
        )
        if self.weight_decay:
            _log_exclusions(
                f"{type(self).__name__} {self.name}", variables, self.exclude_rank, "weight decay"
            )
        super().build(variables)

    def get_config(self):
        config = super().get_config()
        config["exclude_rank"] = self.exclude_rank
        return config


@keras.saving.register_keras_serializable(package="wide_tf")
class DecayExcludingSGD(_ExcludeLowRankFromDecay, keras.optimizers.SGD):
    """keras.optimizers.SGD whose (decoupled) weight decay skips variables of rank <=
    exclude_rank; with momentum_warmup_steps > 0, its momentum follows `ramped_momentum` (Keras's
    own update, with that momentum in place of the fixed one)."""

    def __init__(self, *args, momentum_warmup_steps=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum_warmup_steps = int(momentum_warmup_steps)

    def update_step(self, gradient, variable, learning_rate):
        if not self.momentum_warmup_steps or self.momentum == 0:
            return super().update_step(gradient, variable, learning_rate)
        lr = ops.cast(learning_rate, variable.dtype)
        g = ops.cast(gradient, variable.dtype)
        velocity = self.momentums[self._get_variable_index(variable)]
        m = ramped_momentum(
            self.momentum, self.iterations, self.momentum_warmup_steps, variable.dtype
        )
        self.assign(velocity, velocity * m - g * lr)
        if self.nesterov:
            self.assign_add(variable, velocity * m - g * lr)
        else:
            self.assign_add(variable, velocity)

    def get_config(self):
        return {**super().get_config(), "momentum_warmup_steps": self.momentum_warmup_steps}


@keras.saving.register_keras_serializable(package="wide_tf")
class DecayExcludingAdamW(_ExcludeLowRankFromDecay, keras.optimizers.AdamW):
    """keras.optimizers.AdamW whose (decoupled) weight decay skips variables of rank <=
    exclude_rank."""


@keras.saving.register_keras_serializable(package="wide_tf")
class DecayExcludingLamb(_ExcludeLowRankFromDecay, keras.optimizers.Lamb):
    """keras.optimizers.Lamb whose (decoupled) weight decay skips variables of rank <=
    exclude_rank."""


# --------------------------------------------------------------------------------------------------
# The optimizers by name
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Diagnostics:
    """Scalars an optimizer can report about its own update, which the training step logs
    (min/mean/max of the LARS trust ratios, say).

    `fn(optimizer, grads, variables)` returns a dict of scalar tensors with the keys `names`; it
    runs inside the compiled step, on the all-reduced gradients, before the update is applied."""

    names: tuple[str, ...]
    fn: Callable[[keras.optimizers.Optimizer, Sequence, Sequence], dict]


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """One entry of OPTIMIZERS.

    `build(optim_cfg, learning_rate, variables)` returns the optimizer, not built;
    `learning_rate` is the run's schedule and `variables`, if not None, the model's trainable
    variables (for weight-decay exclusions that must hold before build). `diagnostics`, if any, is
    logged by the training step on the last step of every host call."""

    build: Callable[..., keras.optimizers.Optimizer]
    diagnostics: Diagnostics | None = None


def _lars_diagnostics(optimizer, grads, variables) -> dict:
    ratios = lars_trust_ratios(optimizer, grads, variables)
    if not ratios.shape[0]:  # nothing adapted: what an empty reduction gives (jnp.min refuses it)
        return {
            "trust_ratio_min": ops.convert_to_tensor(float("inf")),
            "trust_ratio_mean": ops.convert_to_tensor(float("nan")),
            "trust_ratio_max": ops.convert_to_tensor(float("-inf")),
        }
    return {
        "trust_ratio_min": ops.min(ratios),
        "trust_ratio_mean": ops.mean(ratios),
        "trust_ratio_max": ops.max(ratios),
    }


LARS_DIAGNOSTICS = Diagnostics(
    names=("trust_ratio_min", "trust_ratio_mean", "trust_ratio_max"), fn=_lars_diagnostics
)


def _decay_excluded(optimizer, variables):
    """Registers the low-rank variables (biases, normalisation parameters) in Keras' weight-decay
    exclusions now, so they hold before build too (the optimizers below add them at build)."""
    if variables is not None:
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if _is_low_rank(v)])
    return optimizer


def _sgd(momentum: bool, nesterov: bool):
    def build(o, learning_rate, variables):
        opt = DecayExcludingSGD(
            learning_rate=learning_rate,
            momentum=float(o.momentum) if momentum else 0.0,
            nesterov=nesterov,
            weight_decay=float(o.weight_decay) or None,
            momentum_warmup_steps=int(o.momentum_warmup_steps) if momentum else 0,
        )
        return _decay_excluded(opt, variables)

    return build


def _lars(o, learning_rate, variables):
    # LARS applies the rank rule itself and logs the excluded names once, in build().
    return LARS(
        learning_rate=learning_rate,
        momentum=float(o.momentum),
        eta=o.lars_eta,
        weight_decay=float(o.weight_decay),
        trust_ratio=o.lars_trust_ratio,
        epsilon=o.lars_epsilon,
        clip=o.lars_clip,
        momentum_warmup_steps=int(o.momentum_warmup_steps),
    )


def _adam(o, learning_rate, variables):
    if o.weight_decay:
        raise ValueError(
            "optim.name='adam' with weight_decay > 0: use 'adamw' (decoupled decay) instead"
        )
    return keras.optimizers.Adam(learning_rate=learning_rate)


def _adamw(o, learning_rate, variables):
    opt = DecayExcludingAdamW(learning_rate=learning_rate, weight_decay=float(o.weight_decay))
    return _decay_excluded(opt, variables)


def _lamb(o, learning_rate, variables):
    opt = DecayExcludingLamb(
        learning_rate=learning_rate, weight_decay=float(o.weight_decay) or None
    )
    return _decay_excluded(opt, variables)


# How to build each optimizer of the schema (schema/optimizers.py: its name, fields and momentum),
# keyed in the schema's order; tests/engine/test_optim.py checks that every schema optimizer has a
# builder.
_BUILDERS = {
    "sgd": OptimizerSpec(build=_sgd(momentum=False, nesterov=False)),
    "momentum": OptimizerSpec(build=_sgd(momentum=True, nesterov=False)),
    "nesterov": OptimizerSpec(build=_sgd(momentum=True, nesterov=True)),
    "lars": OptimizerSpec(build=_lars, diagnostics=LARS_DIAGNOSTICS),
    "adam": OptimizerSpec(build=_adam),
    "adamw": OptimizerSpec(build=_adamw),
    "lamb": OptimizerSpec(build=_lamb),
}
OPTIMIZERS = {name: _BUILDERS[name] for name in optimizers.NAMES if name in _BUILDERS}


def optimizer_spec(name: str) -> OptimizerSpec:
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def build_optimizer(
    optim_cfg,
    global_batch: int,
    steps_per_epoch: int,
    total_steps: int,
    variables: Sequence | None = None,
) -> keras.optimizers.Optimizer:
    """The Keras optimizer OPTIMIZERS[optim_cfg.name] with build_schedule(...) as its learning
    rate. Not built: build it inside strategy.scope() with optimizer.build(variables) before the
    first step.

    sgd/momentum/nesterov/adamw/lamb: Keras' decoupled weight decay (w -= lr * wd * w each step)
    when optim_cfg.weight_decay > 0, excluded from variables of rank <= 1. lars: coupled decay
    inside the trust ratio (see LARS). adam: no weight decay (use adamw; a nonzero weight_decay
    raises). The rank rule is applied, and the excluded names logged once, when the optimizer is
    built; `variables`, if given, registers the Keras exclusions now as well
    (exclude_from_weight_decay), so they hold even before build.
    """
    spec = optimizer_spec(optim_cfg.name)
    # The schedule's numbers in variables: a run can take another learning rate without a retrace.
    lr = build_schedule(optim_cfg, global_batch, steps_per_epoch, total_steps, variables=True)
    return spec.build(optim_cfg, lr, variables)
