"""Owns the optimizers a config may name (optim.name): which optim.* fields each one reads, whether
it uses optim.momentum, and how the record and the report show those fields. The config checks,
the trainer's momentum ramp, the record's protocol block (engine/result.py) and the report's
protocol table read these entries; engine/optim.py holds only the build function per name."""

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

# How the report's protocol table shows each hyper-parameter ({v}: its value; a text that opens
# with "(" qualifies the one before it). A new hyper-parameter adds its line here.
HYPER_TEXT = {
    "momentum": "momentum {v}",
    "momentum_warmup_steps": "(rising linearly from 0 over the first {v} steps)",
    "weight_decay": "weight decay {v}",
    "lars_eta": "eta {v}",
    "lars_trust_ratio": "trust ratio '{v}'",
    "lars_epsilon": "epsilon {v}",
    "lars_clip": "clip {v}",
}
# Hyper-parameters read by more than one optimizer: the record's protocol block has each at its
# top level whatever the optimizer; one read by a single optimizer (its own) goes in a block under
# that optimizer's name (None when another one runs), its name without the optimizer's prefix.
SHARED_HYPER = tuple(
    dict.fromkeys(
        f
        for o in OPTIMIZERS.values()
        for f in o.hyper
        if sum(f in p.hyper for p in OPTIMIZERS.values()) > 1
    )
)


def own_hyper(name: str) -> tuple[str, ...]:
    """The hyper-parameters only optimizer `name` reads (LARS's eta, trust ratio, ...)."""
    return tuple(f for f in OPTIMIZERS[name].hyper if f not in SHARED_HYPER)


def protocol_block(optim_cfg) -> dict:
    """The optimizer's part of a record's protocol: every shared hyper-parameter, and for each
    optimizer with hyper-parameters of its own, a block of them (None unless it runs)."""
    out = {f: optim_cfg[f] for f in SHARED_HYPER}
    for name in OPTIMIZERS:
        own = own_hyper(name)
        if own:
            out[name] = (
                {f.removeprefix(name + "_"): optim_cfg[f] for f in own}
                if optim_cfg.name == name
                else None
            )
    return out


def describe(protocol: dict) -> str | None:
    """The optimizer of a record's protocol as the report shows it: its name, then each of its
    hyper-parameters that is set (a number 0 is not shown), from its registry entry."""
    name = protocol.get("optimizer")
    if not name:
        return None
    parts = [name]
    for f in OPTIMIZERS[name].hyper if name in OPTIMIZERS else ():
        own = protocol.get(name) or {}
        v = protocol.get(f) if f in SHARED_HYPER else own.get(f.removeprefix(name + "_"))
        if v is None or (type(v) in (int, float) and v == 0):
            continue
        text = HYPER_TEXT.get(f, f + " {v}").format(v=v)
        if text.startswith("(") and len(parts) > 1:
            parts[-1] += " " + text
        else:
            parts.append(text)
    return ", ".join(parts)


MOMENTUM_NAMES = tuple(n for n, o in OPTIMIZERS.items() if o.uses_momentum)


def uses_momentum(name: str) -> bool:
    """Whether optimizer `name` uses optim.momentum; False for a name that is not an optimizer."""
    return name in OPTIMIZERS and OPTIMIZERS[name].uses_momentum
