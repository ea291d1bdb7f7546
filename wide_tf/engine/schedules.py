"""Learning rates: the batch-size scaling rules, the peak rate of a run, and the warm-up/decay
schedule (WarmupDecaySchedule) that every optimizer is given.

The schedule is written in keras.ops and its numbers live in keras.Variables, so it runs under the
TensorFlow and the JAX Keras backends; this module never imports TensorFlow."""

from __future__ import annotations

import math

import keras
from keras import ops

from wide_tf.schema.fields import SCALING_RULES
from wide_tf.schema.lr_schedules import NAMES as SCHEDULE_NAMES


def scaled_learning_rate(
    base_lr: float, batch: int, reference_batch: int = 256, rule: str = "linear"
) -> float:
    """base_lr is the learning rate at reference_batch; 'none' -> base_lr,
    'linear' -> base_lr * batch/ref, 'sqrt' -> base_lr * sqrt(batch/ref)."""
    if rule not in SCALING_RULES:
        raise ValueError(
            f"Unknown learning-rate scaling rule {rule!r}; valid: {', '.join(SCALING_RULES)}"
        )
    if batch <= 0 or reference_batch <= 0:
        raise ValueError(
            f"batch and reference_batch must be positive, got {batch}, {reference_batch}"
        )
    ratio = batch / reference_batch
    return float(base_lr) * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def peak_learning_rate(optim_cfg, global_batch: int) -> float:
    """The run's peak learning rate: scaled_learning_rate(base_lr, global_batch, reference_batch,
    scaling) times lr_multiplier (the study's learning-rate grid)."""
    o = optim_cfg
    return scaled_learning_rate(o.base_lr, global_batch, o.reference_batch, o.scaling) * float(
        o.lr_multiplier
    )


@keras.saving.register_keras_serializable(package="wide_tf")
class WarmupDecaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to peak_lr, then a decay; a function of the optimizer step s (0 for the first
    update).

    Warm-up (s < warmup_steps): lr = peak * (f0 + (1 - f0) * s / warmup_steps),
    f0 = warmup_init_fraction (0 by default, so the first update has lr 0 exactly as in the usual
    linear warm-up). After warm-up, with t = clip((s - W) / max(total_steps - W, 1), 0, 1) and
    end = end_lr_fraction * peak:
      'constant'   : peak
      'cosine'     : end + (peak - end) * (1 + cos(pi t)) / 2
      'polynomial' : end + (peak - end) * (1 - t) ** power
      'multistep'  : peak * decay_factor ** (number of boundaries <= s)  (boundaries in steps)
    The cosine and polynomial decays reach `end` at total_steps and stay there.
    """

    # The numbers of a schedule; with variables=True they live in variables that __call__ reads,
    # so a traced training step serves every run of a learning-rate grid (assign_from). Under
    # TensorFlow a keras.Variable is a tf.Variable inside (created in the strategy's scope, with
    # ONLY_FIRST_REPLICA aggregation as before); under JAX a jitted step reads them as constants
    # unless it passes `variables` in as state (a keras.StatelessScope).
    _NUMBERS = (
        "peak_lr",
        "total_steps",
        "warmup_steps",
        "decay_factor",
        "power",
        "end_lr_fraction",
        "warmup_init_fraction",
    )

    def __init__(
        self,
        peak_lr,
        total_steps,
        warmup_steps=0,
        decay="constant",
        boundaries=(),
        decay_factor=0.1,
        power=2.0,
        end_lr_fraction=0.0,
        warmup_init_fraction=0.0,
        name="warmup_decay",
        variables=False,
    ):
        if decay not in SCHEDULE_NAMES:
            raise ValueError(f"Unknown schedule {decay!r}; valid: {', '.join(SCHEDULE_NAMES)}")
        self.peak_lr = float(peak_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.boundaries = [int(b) for b in boundaries]
        self.decay_factor = float(decay_factor)
        self.power = float(power)
        self.end_lr_fraction = float(end_lr_fraction)
        self.warmup_init_fraction = float(warmup_init_fraction)
        self.name = name
        self._vars = None
        if variables:
            held = dict(trainable=False, dtype="float32", aggregation="only_first_replica")
            self._vars = {
                k: keras.Variable(float(getattr(self, k)), name=f"{name}_{k}", **held)
                for k in self._NUMBERS
            }
            self._vars["boundaries"] = keras.Variable(
                ops.convert_to_tensor([float(b) for b in self.boundaries], "float32"),
                name=f"{name}_boundaries",
                **held,
            )

    def structure(self) -> tuple:
        """What a traced graph depends on besides the numbers held in variables."""
        return (self.decay, len(self.boundaries))

    def assign_from(self, other: WarmupDecaySchedule) -> None:
        """Takes `other`'s numbers (same structure) into this schedule's variables."""
        if self._vars is None or other.structure() != self.structure():
            raise ValueError("assign_from needs a schedule with variables and the same structure")
        for k in self._NUMBERS:
            setattr(self, k, getattr(other, k))
            self._vars[k].assign(float(getattr(other, k)))
        self.boundaries = list(other.boundaries)
        self._vars["boundaries"].assign([float(b) for b in other.boundaries])

    def numbers(self) -> dict:
        """The schedule's numbers (float32 scalars; `boundaries` a vector), as `at` reads them."""
        out = {k: float(getattr(self, k)) for k in self._NUMBERS}
        out["boundaries"] = [float(b) for b in self.boundaries]
        return out

    def _value(self, k):
        if self._vars is None:
            return ops.convert_to_tensor(
                getattr(self, k) if k != "boundaries" else self.boundaries, "float32"
            )
        return ops.cast(self._vars[k], "float32")

    def __call__(self, step):
        with keras.name_scope(self.name):
            return self.at(step, {k: self._value(k) for k in self._NUMBERS + ("boundaries",)})

    def at(self, step, numbers: dict):
        """The learning rate at optimizer step `step` with the schedule's numbers taken from
        `numbers` (backend tensors or floats, keyed as `numbers()`): the JAX backend passes them
        into its compiled step as arguments, so that one compilation serves every run of a
        learning-rate grid, as the TensorFlow path's variables do."""
        s = ops.cast(step, "float32")
        peak = ops.cast(numbers["peak_lr"], "float32")
        end = peak * numbers["end_lr_fraction"]
        w = ops.cast(numbers["warmup_steps"], "float32")
        t = ops.clip((s - w) / ops.maximum(numbers["total_steps"] - w, 1.0), 0.0, 1.0)
        if self.decay == "constant":
            decayed = peak
        elif self.decay == "cosine":
            decayed = end + (peak - end) * 0.5 * (1.0 + ops.cos(math.pi * t))
        elif self.decay == "polynomial":
            decayed = end + (peak - end) * ops.power(1.0 - t, numbers["power"])
        else:  # multistep
            if self.boundaries:
                bounds = ops.cast(numbers["boundaries"], "float32")
                n = ops.sum(ops.cast(s >= bounds, "float32"))
            else:
                n = ops.convert_to_tensor(0.0, "float32")
            decayed = peak * ops.power(ops.cast(numbers["decay_factor"], "float32"), n)
        # Warm-up while s < w (never when w = 0).
        f0 = numbers["warmup_init_fraction"]
        warm = peak * (f0 + (1.0 - f0) * s / ops.maximum(w, 1.0))
        return ops.where(s < w, warm, decayed)

    def get_config(self):
        return dict(
            peak_lr=self.peak_lr,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            decay=self.decay,
            boundaries=list(self.boundaries),
            decay_factor=self.decay_factor,
            power=self.power,
            end_lr_fraction=self.end_lr_fraction,
            warmup_init_fraction=self.warmup_init_fraction,
            name=self.name,
        )


def warmup_steps_for(optim_cfg, steps_per_epoch: int) -> int:
    """Warm-up length in steps: 'epochs' -> round(warmup_epochs * steps_per_epoch) (fewer steps as
    the batch grows), 'steps' -> warmup_steps (the same number of steps at every batch size)."""
    fixed = optim_cfg.warmup_fixed
    if fixed == "epochs":
        return int(round(float(optim_cfg.warmup_epochs) * steps_per_epoch))
    if fixed == "steps":
        return int(optim_cfg.warmup_steps)
    raise ValueError(f"Unknown optim.warmup_fixed {fixed!r}; valid: epochs, steps")


def build_schedule(
    optim_cfg, global_batch: int, steps_per_epoch: int, total_steps: int, variables: bool = False
) -> WarmupDecaySchedule:
    """The run's schedule: warm-up to peak_learning_rate(optim_cfg, global_batch), then
    optim_cfg.schedule. multistep boundaries are optim_cfg.decay_epochs converted with
    round(epoch * steps_per_epoch)."""
    decay = optim_cfg.schedule
    if decay not in SCHEDULE_NAMES:
        raise ValueError(f"Unknown optim.schedule {decay!r}; valid: {', '.join(SCHEDULE_NAMES)}")
    boundaries = [int(round(float(e) * steps_per_epoch)) for e in optim_cfg.decay_epochs]
    return WarmupDecaySchedule(
        peak_lr=peak_learning_rate(optim_cfg, global_batch),
        total_steps=total_steps,
        warmup_steps=warmup_steps_for(optim_cfg, steps_per_epoch),
        decay=decay,
        boundaries=sorted(boundaries),
        decay_factor=optim_cfg.decay_factor,
        power=optim_cfg.poly_power,
        end_lr_fraction=optim_cfg.end_lr_fraction,
        variables=variables,
    )
