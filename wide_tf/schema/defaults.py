"""Owns building a config from the field schema (schema/fields.py, where every field's default,
domain and doc live): one function per sub-config (model, data, optim, train, runtime, sweep),
whose arguments are the defaults a config file usually changes. Pure Python: config files and the
config checks import it without importing TensorFlow.

Every config is built from `base_config`, so every field exists in every config: code reads
`config.section.field` and never restates a default."""

from __future__ import annotations

import copy

import ml_collections

from wide_tf.schema import fields


def _value(f: fields.Field, given: dict):
    if f.name in given:
        return given[f.name]
    if f.default is None and f.field_type is not None:
        return ml_collections.FieldReference(None, field_type=f.field_type)
    return copy.deepcopy(f.default)  # a fresh list for every config


def section(section_name: str, /, **given) -> ml_collections.ConfigDict:
    """The sub-config `section_name` with every field at its default, except those `given` (by the
    field's name within the section; sweep.family's fields are a nested section)."""
    out: dict = {}
    for f in fields.SECTIONS[section_name]:
        parts = f.path.split(".")[1:]
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _value(f, given if len(parts) == 1 else {})
    unknown = set(given) - {f.path.split(".")[1] for f in fields.SECTIONS[section_name]}
    if unknown:
        raise TypeError(f"{section_name} has no field {sorted(unknown)[0]!r}")
    return ml_collections.ConfigDict(out)


def model_config(
    arch: str = "mlp", depth: int = 2, width: float = 256.0
) -> ml_collections.ConfigDict:
    return section("model", arch=arch, depth=depth, width=width)


def data_config(name: str = "mnist_embedded") -> ml_collections.ConfigDict:
    return section("data", name=name)


def optim_config(name: str = "sgd", base_lr: float = 0.1) -> ml_collections.ConfigDict:
    return section("optim", name=name, base_lr=base_lr)


def train_config(global_batch: int = 128) -> ml_collections.ConfigDict:
    return section("train", global_batch=global_batch)


def runtime_config() -> ml_collections.ConfigDict:
    return section("runtime")


def sweep_config() -> ml_collections.ConfigDict:
    return section("sweep")


def base_config(arch: str = "mlp", data: str = "mnist_embedded") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.kind = "study"
    config.model = model_config(arch)
    config.data = data_config(data)
    config.optim = optim_config()
    config.train = train_config()
    config.runtime = runtime_config()
    config.sweep = sweep_config()
    return config
