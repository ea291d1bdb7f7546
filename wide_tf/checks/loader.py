"""Owns loading a config file by path with its variant (`configs/mlp.py:local`): for main.py (which
checks the file and the variant here before ml_collections' config flag reads it), tests, the
benchmark and notebooks. Errors are one line that names the file, the variant and the fix."""

from __future__ import annotations

import difflib
import glob
import importlib.util
import os
import re

from wide_tf.schema.fields import suggest
from wide_tf.schema.problems import UsageError

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ConfigFileError(UsageError, FileNotFoundError):
    """The config file does not exist (a FileNotFoundError, as this loader raised before)."""


def _known_files(path: str) -> list[str]:
    """Config files beside `path` (as the user would type them), else those in the repo's
    configs/."""
    folder = os.path.dirname(path)
    for shown, real in (
        (folder, folder or "."),
        (folder, os.path.join(_REPO, folder)),
        ("configs", os.path.join(_REPO, "configs")),
    ):
        names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(real, "*.py")))
        names = [n for n in names if not n.startswith("_")]
        if names:
            return [os.path.join(shown, n) for n in names]
    return []


def resolve_path(spec: str) -> tuple[str, str | None]:
    """`path[:variant]` -> (the file, the variant or None); ConfigFileError if there is no file."""
    path, _, arg = spec.partition(":")
    if not path:
        raise UsageError(f"--config={spec!r} names no file; e.g. --config=configs/mlp.py:local")
    if not os.path.exists(path) and os.path.exists(os.path.join(_REPO, path)):
        path = os.path.join(_REPO, path)  # configs/ beside the package in a source checkout
    if not os.path.isfile(path):
        known = _known_files(path)
        folder = os.path.isdir(path)
        what = "is a folder, not a config file" if folder else "not found"
        close = (
            []
            if folder
            else difflib.get_close_matches(
                os.path.basename(path), [os.path.basename(k) for k in known], n=1, cutoff=0.6
            )
        )
        hint = (
            f" (did you mean {os.path.join(os.path.dirname(known[0]), close[0])!r}?)"
            if close
            else ""
        )
        raise ConfigFileError(
            f"config file {spec.partition(':')[0]!r} {what}{hint}; "
            + (
                f"the configs are {', '.join(known)}"
                if known
                else "give the path of a config .py file"
            )
        )
    return path, (arg or None)


_NOT_NAMES = {"or", "and", "use", "nothing", "default", "none", "of", "the", "a"}


def variants(module) -> list[str]:
    """The variants a config file documents: its VARIANTS, or the names listed under
    'Variants (after the colon):' in its docstring."""
    if hasattr(module, "VARIANTS"):
        return list(module.VARIANTS)
    doc = module.__doc__ or ""
    if "Variants" not in doc:
        return []
    out = []
    for line in doc.split("Variants", 1)[1].splitlines()[1:]:
        m = re.match(r"^  ([a-z_0-9]+)\s", line)
        if m:
            out.append(m.group(1))
    return out


def load_module(path: str, function: str = "get_config", what: str = "config"):
    """The Python file at `path` imported, checked to define `function` (a config file's
    get_config, a suite file's get_suite); every failure is one UsageError line."""
    module_spec = importlib.util.spec_from_file_location(f"_wide_tf_{what}", path)
    if module_spec is None or not path.endswith(".py"):
        raise UsageError(
            f"{what} file {path} is not a Python file; give a {what} .py file, e.g. configs/mlp.py"
        )
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise UsageError(
            f"{what} file {path} does not parse: {e.msg} at line {e.lineno}; fix the file"
        ) from None
    except Exception as e:  # noqa: BLE001  (any error inside the user's config file)
        raise UsageError(
            f"{what} file {path} fails on import ({type(e).__name__}: {e}); fix the file"
        ) from None
    if not hasattr(module, function):
        raise UsageError(
            f"{what} file {path} has no {function}(arg) function; every {what} file needs one"
        )
    return module


def load_config(spec: str):
    """`path[:variant]` -> the ConfigDict that `get_config(variant)` returns (unlocked)."""
    path, arg = resolve_path(spec)
    module = load_module(path)
    try:
        return module.get_config(arg)
    except Exception as e:  # noqa: BLE001  (an unknown variant, or any error of the config's own code)
        names = variants(module)
        if "variant" in str(e) and ":" in str(e):  # the names a config's own error lists
            tail = str(e).rsplit(":", 1)[1]
            names += [
                w
                for w in re.findall(r"[a-z_][a-z_0-9]*", tail)
                if w not in _NOT_NAMES and w not in names
            ]
        if arg is not None and names and arg not in names:
            raise UsageError(
                f"config file {spec.partition(':')[0]} has no variant {arg!r}"
                f"{suggest(arg, names)}; choose one of {', '.join(names)}, or none for the default "
                f"(--config={spec.partition(':')[0]}:VARIANT)"
            ) from None
        raise UsageError(
            f"--config={spec}: get_config({arg!r}) failed ({type(e).__name__}: {e}); fix the "
            f"variant or the file"
        ) from None
