"""Owns what makes two configs the same study: the part of a config that defines its results (all
but the operational settings) and the fields in which two such parts differ. The workdir check
before TensorFlow starts and the study's own check of config.json both ask here; the trial ids
hash the same part."""

from __future__ import annotations

import json

# Settings that change how a run is executed, not what it computes: they may differ between the
# machines (or the sessions) that share a study, and do not enter trial ids. None: the whole
# section.
OPERATIONAL = {
    "runtime": None,
    "train": ("steps_per_loop", "checkpoint_every_steps", "eval_batch"),
}

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
    for section, keys in OPERATIONAL.items():
        if keys is None:
            d.pop(section, None)
        elif isinstance(d.get(section), dict):
            d[section] = {k: v for k, v in d[section].items() if k not in keys}
    for section, values in NEUTRAL.items():
        part = d.get(section)
        if isinstance(part, dict):
            for k, v in values.items():
                if k in part and part[k] == v:
                    del part[k]
    return d


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


def describe(fields: list[str], shown: int = 6) -> str:
    """The first `shown` differing fields for a one-line message, '...' if there are more."""
    return f"{', '.join(fields[:shown])}{' ...' if len(fields) > shown else ''}"
