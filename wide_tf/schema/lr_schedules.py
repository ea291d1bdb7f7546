"""Owns the learning-rate schedules a config may name (optim.schedule): the optim.* fields each
reads after the warm-up and how the report's protocol table shows them. The config checks, the
record's protocol block (engine/result.py) and the report (report/protocol.py) read these entries;
engine/schedules.py holds only the maths per name."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    hyper: tuple[str, ...]  # the optim.* fields it reads after the warm-up, in the record's order
    text: str  # the report's words for them: str.format of the fields' values ("" for none)
    doc: str


# The order is the order of the choices in every message.
SCHEDULES = {
    s.name: s
    for s in (
        Schedule("constant", (), "", "the peak rate after the warm-up"),
        Schedule("cosine", ("end_lr_fraction",), "end at {end_lr_fraction} x peak", "cosine decay"),
        Schedule(
            "multistep",
            ("decay_factor", "decay_epochs"),
            "decay x{decay_factor} at epochs {decay_epochs}",
            "x decay_factor at each of decay_epochs",
        ),
        Schedule(
            "polynomial",
            ("poly_power", "end_lr_fraction"),
            "power {poly_power}, end at {end_lr_fraction} x peak",
            "polynomial decay to end_lr_fraction",
        ),
    )
}
NAMES = tuple(SCHEDULES)


def describe(name: str, settings: dict) -> str:
    """The schedule as the report shows it: "cosine (end at 0.0 x peak)"."""
    entry = SCHEDULES.get(name)
    if entry is None or not entry.text or not settings:
        return name
    try:
        return f"{name} ({entry.text.format(**settings)})"
    except KeyError:  # a record from before a field was added
        return name
