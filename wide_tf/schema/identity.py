"""Owns what makes two configs the same study: the part of a config that defines its results (all
but the operational settings) and the fields in which two such parts differ. The workdir check
before TensorFlow starts and the study's own check of config.json both ask here; the trial ids
hash the same part."""

from __future__ import annotations

import json

# Settings that change how a run is executed, not what it computes: they may differ between the
# machines (or the commands) that share a study, and do not enter trial ids. None: the whole
# section.
OPERATIONAL = {
    "runtime": None,
    # config.json's record of the machine and code that wrote it (schema/provenance.py)
    "provenance": None,
    "train": ("steps_per_loop", "checkpoint_every_steps"),
}
# runtime.backend (tensorflow or jax) is the exception in its operational section: the two backends
# train on the same examples in another order (engine/jax/data.py) with other float rounding, so a
# study's records never mix them. It enters the identity only when it is not TensorFlow, so the
# studies written before the field existed keep their identity and trial ids.
BACKEND_NEUTRAL = "tensorflow"
# Settings that change a study's results, so two configs that differ in them are two studies, but
# that stay out of trial ids so that the ids of studies written before they were reclassified stay
# valid. train.eval_batch was declared operational, but it changes the last bits of
# the evaluations (their float sums run in another order): train_loss and test_loss, and so the
# crossing of a loss target, can differ. Accuracies (exact counts) do not.
#
# runtime.cohort > 1 likewise: a run trained in a cohort (engine/jax/cohort.py) computes its update
# as a slice of a batched program, whose matrix products XLA may round otherwise in the last bits
# (1.8e-7 of the weights after one step of mlp-d12, measured), and a deep plain MLP at the local
# study's rates grows such a difference to order one within 50 steps: in its mlp-d12 cell at batch
# 32 every record moved (steps to target by 2% to 2.3x, one target no longer met), while
# mlp-d1's 13 runs stayed bit for bit. So a study's records never mix cohort settings; the field
# enters the identity only above 1 (every other study keeps its identity), not its trial ids.
UNHASHED = {"train": ("eval_batch",), "cohort": None}
COHORT_NEUTRAL = 1


def _without(d: dict, parts: dict) -> dict:
    for section, keys in parts.items():
        if keys is None:
            d.pop(section, None)
        elif isinstance(d.get(section), dict):
            d[section] = {k: v for k, v in d[section].items() if k not in keys}
    return d


# train.max_device_batch splits each replica's batch into micro-batches whose gradients are summed
# (engine/tf/accumulate.py). That is exact where no layer looks across the examples of a micro-batch
# except through virtual batches the split keeps whole: no normalisation ('none'), or ghost batch
# norm, whose virtual batch divides every micro-batch (schema/rules.py, check_batch) and whose
# moving statistics are stepped once per optimizer step (tests/engine/test_micro_batch.py: every
# variable the same for 1, 2 and 4 micro-batches). There the cap is operational: a study started
# without one resumes with one (after an out-of-memory failure, or on a slice that needs it). Under
# plain batch norm each micro-batch is normalised with its own statistics, so the cap changes the
# gradients: there it stays part of the study. An operational cap enters the identity as 0 (not
# dropped), so the trial ids of studies without a cap are the ones they always were.
CAP = ("train", "max_device_batch")
EXACT_MICRO_BATCH_NORMS = ("none", "ghost")


def cap_is_operational(norm) -> bool:
    """True when micro-batching is exact for model.norm=`norm` (the cap then not in the study)."""
    return norm in EXACT_MICRO_BATCH_NORMS


# Fields added after studies had run, at the value that reproduces what those studies computed:
# a config at that value is the same study as one written before the field existed (its trial ids
# and its workdir check are unchanged), so they are left out of the study part at that value.
NEUTRAL = {
    "data": {"pool": 1, "subset_seed": 20180601},
}


def study_part(config) -> dict:
    """The part of a config (a ConfigDict, or its JSON as a dict) that defines the study's
    results, as a new dict of JSON values."""
    if hasattr(config, "to_json_best_effort"):
        d = json.loads(config.to_json_best_effort())
    else:
        d = json.loads(json.dumps(config))
    backend = (d.get("runtime") or {}).get("backend", BACKEND_NEUTRAL)
    cohort = (d.get("runtime") or {}).get("cohort", COHORT_NEUTRAL)
    d = _without(d, OPERATIONAL)
    if backend != BACKEND_NEUTRAL:  # the runtime fields that change what a study computes
        d["backend"] = backend
    if cohort != COHORT_NEUTRAL:
        d["cohort"] = cohort
    section, key = CAP
    model = d.get("model")
    norm = model.get("norm") if isinstance(model, dict) else None
    if cap_is_operational(norm) and isinstance(d.get(section), dict) and key in d[section]:
        d[section][key] = 0
    for section, values in NEUTRAL.items():
        part = d.get(section)
        if isinstance(part, dict):
            for k, v in values.items():
                if k in part and part[k] == v:
                    del part[k]
    return d


def id_part(config) -> dict:
    """The part of a config that trial ids hash: the study part less UNHASHED."""
    return _without(study_part(config), UNHASHED)


_MISSING = object()  # a field one side lacks differs from one set to None (as `!=` of the dicts)


def _diff_keys(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in set(a) | set(b):
            yield from _diff_keys(a.get(k, _MISSING), b.get(k, _MISSING), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


def differing_fields(theirs, mine) -> list[str]:
    """The dotted fields, sorted, in which two configs' study parts differ; [] for one study."""
    return sorted(_diff_keys(study_part(theirs), study_part(mine)))


def describe(fields: list[str], shown: int = 6, norm=None) -> str:
    """The first `shown` differing fields for a one-line message, '...' if there are more; with
    the config's model.norm, why a differing train.max_device_batch counts (plain batch norm)."""
    text = f"{', '.join(fields[:shown])}{' ...' if len(fields) > shown else ''}"
    if ".".join(CAP) in fields and not cap_is_operational(norm):
        text += (
            f"; train.max_device_batch stays part of the study under model.norm={norm!r}: each "
            f"micro-batch is normalised with its own statistics, so the cap changes the gradients "
            f"(with ghost batch norm or no norm the cap may change on resume)"
        )
    return text
