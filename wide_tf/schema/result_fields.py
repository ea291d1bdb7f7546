"""The result record's schema (result.json, one per run): every field's name, its kind and whether
a trainer's record always has it, written as data so that the trainer (engine/result.py), the
simulator and a record check build or check records against one declaration. TF-free."""

from __future__ import annotations

import dataclasses

from wide_tf.schema import targets

# A field's JSON kinds: "number" is an int or a float (not a bool), "int" an int (not a bool).
KINDS = ("str", "int", "number", "bool", "dict", "list")


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str  # one of KINDS
    required: bool = True  # every trainer's record has it
    nullable: bool = False  # None is a valid value
    choices: tuple = ()  # the valid values, when they are few
    fields: tuple = ()  # a "dict" of known keys: their Fields
    items: tuple = ()  # a "list" of dicts: the Fields of each item
    doc: str = ""


STATUSES = ("reached", "not_reached", "diverged")

TARGET = (  # one entry of "targets"
    Field("metric", "str"),
    Field("value", "number"),
    Field("status", "str", choices=STATUSES),
    Field("steps_to_target", "int", nullable=True),
    Field("steps_to_target_interp", "number", nullable=True),
    Field("epochs_to_target", "number", nullable=True),
)

FINAL = tuple(
    Field(k, "number", nullable=True, doc="None for a diverged run") for k in targets.EVAL_METRICS
)

GRADIENT = (
    Field("history", "list", doc="one dict per probe measurement (step, examples, diversity, ...)"),
    Field("noise_scale_ema", "number", nullable=True),
)

# A run's seconds by kind (engine/timing.py): its set-up, the first call of each compiled function,
# training, evaluation, probe and checkpoints, and the rest of its loop; "other" closes the sum.
TIME_KINDS = ("setup", "compile", "train", "eval", "probe", "checkpoint", "other")
TIME = tuple(Field(k, "number") for k in TIME_KINDS)

# How the run's batch was laid out on the hardware (engine/tf/step.BatchPlan): the micro-batch cap
# really used (train.max_device_batch, or the GPU default the memory model chose when it is 0).
BATCH_PLAN = (
    Field("max_device_batch", "int", doc="the cap in force; 0: none (the replica's batch whole)"),
    Field("replicas", "int"),
    Field("per_replica", "int"),
    Field("micro_batches", "int", doc="micro-batches per optimizer step on each replica"),
    Field("micro_batch", "int"),
)

# In the order the trainer writes them (result.json itself is written with sorted keys).
FIELDS = (
    Field("trial_id", "str"),
    Field("member", "str", doc="arch-d<depth>-w<width> unless the study named it"),
    Field("role", "str", required=False, doc="a study's trial role (tune, confirm)"),
    Field("arch", "str"),
    Field("depth", "int"),
    Field("width", "number"),
    Field("params", "int"),
    Field("batch_size", "int"),
    Field("lr_multiplier", "number"),
    Field("learning_rate", "number", doc="the peak learning rate"),
    Field("optimizer", "str"),
    Field("seed", "int"),
    Field("num_train", "int"),
    Field("status", "str", choices=STATUSES),
    Field("target", "dict", fields=(Field("metric", "str"), Field("value", "number"))),
    Field("steps_to_target", "int", nullable=True),
    Field("steps_to_target_interp", "number", nullable=True),
    Field("epochs_to_target", "number", nullable=True),
    Field("examples_to_target", "int", nullable=True),
    Field("targets", "list", items=TARGET, doc="the primary target first"),
    Field("evaluations_to_target", "int", nullable=True),
    Field("momentum_ramp_steps", "number", nullable=True),
    Field("diverged_at_step", "int", nullable=True),
    Field("steps", "int"),
    Field("epochs", "number"),
    Field("final", "dict", fields=FINAL),
    Field("best_test_accuracy", "number", nullable=True),
    Field("wall_time_s", "number"),
    Field(
        "time_s", "dict", required=False, fields=TIME, doc="seconds by kind (not in old records)"
    ),
    Field("examples_per_s", "number", nullable=True),
    Field("gradient", "dict", fields=GRADIENT),
    Field("runtime", "str"),
    Field("dtype_policy", "str"),
    # (records written before it lack it, and the report counts them as older files: not required)
    Field("protocol", "dict", required=False, doc="engine.result.describe_protocol"),
    # (records written before it lack it: not required)
    Field("batch_plan", "dict", required=False, fields=BATCH_PLAN, doc="engine.state.BatchPlan"),
    # Where the record came from: code, command, versions, machine (records before it lack it).
    Field("provenance", "dict", required=False, doc="schema.provenance.collect"),
)

NAMES = tuple(f.name for f in FIELDS)


def _kind_ok(kind: str, value) -> bool:
    if isinstance(value, bool):
        return kind == "bool"
    return {
        "str": isinstance(value, str),
        "int": isinstance(value, int),
        "number": isinstance(value, int | float),
        "bool": False,
        "dict": isinstance(value, dict),
        "list": isinstance(value, list),
    }[kind]


def problems(record: dict, fields: tuple = FIELDS, where: str = "") -> list[str]:
    """What is wrong with `record` against `fields` (empty: it conforms). Keys the schema does not
    name are allowed (a study may add its own)."""
    out = []
    for f in fields:
        name = where + f.name
        if f.name not in record:
            if f.required:
                out.append(f"{name}: missing")
            continue
        value = record[f.name]
        if value is None:
            if not f.nullable:
                out.append(f"{name}: None")
            continue
        if not _kind_ok(f.kind, value):
            out.append(f"{name}: {type(value).__name__}, not {f.kind}")
            continue
        if f.choices and value not in f.choices:
            out.append(f"{name}: {value!r} is not one of {f.choices}")
        if f.fields:
            out += problems(value, f.fields, name + ".")
        for i, item in enumerate(value if f.items else ()):
            if not isinstance(item, dict):
                out.append(f"{name}[{i}]: {type(item).__name__}, not dict")
            else:
                out += problems(item, f.items, f"{name}[{i}].")
    return out
