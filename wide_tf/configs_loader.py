"""Owns loading a config file by path with its variant (`configs/mlp.py:local`) outside absl flags,
for tests, the benchmark and notebooks. main.py uses ml_collections' config_flags instead."""

from __future__ import annotations

import importlib.util
import os

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(spec: str):
    """`path[:variant]` -> the ConfigDict that `get_config(variant)` returns (unlocked)."""
    path, _, arg = spec.partition(":")
    if not os.path.exists(path) and os.path.exists(os.path.join(_REPO, path)):
        path = os.path.join(_REPO, path)  # configs/ beside the package in a source checkout
    if not os.path.exists(path):
        raise FileNotFoundError(f"config file {path!r} not found")
    module_spec = importlib.util.spec_from_file_location("_wide_tf_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)
