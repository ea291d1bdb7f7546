"""Owns the optimizers a config may name (optim.name): which optim.* fields each one reads and
whether it uses optim.momentum. The config checks, the trainer's momentum ramp and the report's
protocol read these entries; engine/optim.py holds only the TensorFlow build function per name."""

from __future__ import annotations

import dataclasses

_LARS = ("lars_eta", "lars_trust_ratio", "lars_epsilon", "lars_clip")
_MOMENTUM = ("momentum", "momentum_warmup_steps")


@dataclasses.dataclass(frozen=True)
class Optimizer:
    name: str
    hyper: tuple[str, ...]  # the optim.* fields it reads besides the learning rate
    doc: str

    @property
    def uses_momentum(self) -> bool:
        """Whether optim.momentum (and its warm-up) applies to this optimizer."""
        return "momentum" in self.hyper

    @property
    def weight_decay(self) -> bool:
        """Whether it takes optim.weight_decay (adam does not: use adamw)."""
        return "weight_decay" in self.hyper


# The order is the order of the choices in every message.
OPTIMIZERS = {
    o.name: o
    for o in (
        Optimizer("sgd", ("weight_decay",), "plain SGD, decoupled weight decay"),
        Optimizer("momentum", (*_MOMENTUM, "weight_decay"), "heavy-ball momentum SGD"),
        Optimizer("nesterov", (*_MOMENTUM, "weight_decay"), "Nesterov momentum SGD"),
        Optimizer("lars", (*_MOMENTUM, "weight_decay", *_LARS), "LARS, coupled decay"),
        Optimizer("adam", (), "Adam, no weight decay"),
        Optimizer("adamw", ("weight_decay",), "Adam with decoupled weight decay"),
        Optimizer("lamb", ("weight_decay",), "LAMB, decoupled weight decay"),
    )
}
NAMES = tuple(OPTIMIZERS)
MOMENTUM_NAMES = tuple(n for n, o in OPTIMIZERS.items() if o.uses_momentum)


def uses_momentum(name: str) -> bool:
    """Whether optimizer `name` uses optim.momentum; False for a name that is not an optimizer."""
    return name in OPTIMIZERS and OPTIMIZERS[name].uses_momentum
