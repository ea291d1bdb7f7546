"""Owns loading a config file by path with its variant (`configs/mlp.py:local`) and the variant's
k=v arguments (`configs/mlp.py:local:seeds=3,epochs=20`, as big_vision's get_config(arg) takes
them): for main.py (which checks the file and the variant here before ml_collections' config flag
reads it), tests, the benchmark and notebooks; and each config's variants with one line each
(`--help`). Errors are one line that names the file, the variant and the fix."""

from __future__ import annotations

import difflib
import functools
import glob
import importlib.util
import os
import re

from wide_tf.schema.fields import suggest
from wide_tf.schema.problems import UsageError

# The checkout that holds the package (configs/ sits beside wide_tf/ in a source checkout):
# a relative --config is looked up in the current folder first, then here.
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    except (SystemExit, KeyboardInterrupt) as e:
        raise UsageError(
            f"{what} file {path} raises {type(e).__name__} on import; a {what} file defines "
            f"its settings, it must not exit: fix the file"
        ) from None
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


def found_spec(spec: str) -> str:
    """`spec` with its file as found (resolve_path: the current folder, then the checkout), for
    the config flag, which reads the file again; `spec` itself when there is no such file."""
    try:
        path, arg = resolve_path(spec)
    except UsageError:
        return spec
    return path if arg is None else f"{path}:{arg}"


def with_found_config(argv: list[str]) -> list[str]:
    """`argv` with --config's file as found (found_spec), so that a command run from any folder
    reads configs/... of the checkout when the current folder has none."""
    out, take = [], False
    for arg in argv:
        if take:
            out.append(found_spec(arg))
            take = False
        elif arg.startswith(("--config=", "-config=")):
            name, _, spec = arg.partition("=")
            out.append(f"{name}={found_spec(spec)}")
        else:
            take = arg in ("--config", "-config")
            out.append(arg)
        if arg == "--":
            out += argv[len(out) :]
            break
    return out


def load_config(spec: str):
    """`path[:variant]` -> the ConfigDict that `get_config(variant)` returns (unlocked)."""
    path, arg = resolve_path(spec)
    module = load_module(path)
    where = f"--config={spec}: get_config({arg!r})"
    try:
        config = module.get_config(arg)
    except (SystemExit, KeyboardInterrupt) as e:  # the config's own code: not a way to stop main
        raise UsageError(
            f"{where} raised {type(e).__name__}"
            + (f"({e.code!r})" if isinstance(e, SystemExit) else "")
            + "; a config file returns its settings, it must not exit: fix the file"
        ) from None
    except Exception as e:  # noqa: BLE001  (an unknown variant, or any error of the config's own code)
        if str(e).startswith(("variant argument", "unknown variant argument")):
            raise UsageError(f"--config={spec}: {e}") from None
        try:
            arg = split_variant(arg)[0]
        except ValueError:
            pass
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
    if not (hasattr(config, "keys") and hasattr(config, "get")):
        raise UsageError(
            f"{where} returned {type(config).__name__}, not a config (an ml_collections "
            f"ConfigDict); end get_config with `return config`"
        )
    return config


# ----------------------------------------------------------------------------------------------
# Variant arguments: configs/mlp.py:local:seeds=3,epochs=20
# ----------------------------------------------------------------------------------------------

# The named arguments every study variant takes: name -> (what it sets, one line for --help).
# Any other key is a config field's dotted path (train.max_epochs=20), as --config.a.b=v sets it.
VARIANT_ARGS = {
    "seeds": "N tuning seeds (0 to N-1); the confirmation seeds follow them, as many as before",
    "confirm": "N confirmation seeds of the chosen rate, after the tuning seeds (0: none)",
    "epochs": "the budget in epochs (train.max_epochs)",
    "batches": "the batch sizes, '/'-separated: batches=32/128/512 (sweep.batch_sizes)",
    "depths": "the family's depths, '/'-separated (sweep.family.depths)",
    "widths": "the family's widths, '/'-separated (sweep.family.widths)",
}
_LIST_ARGS = {"batches": ("sweep", "batch_sizes"), "depths": ("sweep", "family", "depths")}
_LIST_ARGS["widths"] = ("sweep", "family", "widths")


def split_variant(arg: str | None) -> tuple[str | None, dict[str, str]]:
    """'local:seeds=3,epochs=20' -> ('local', {'seeds': '3', 'epochs': '20'}); 'seeds=3' (the
    default variant) -> (None, {...}). Pairs are joined by ',' or ':'."""
    if not arg:
        return None, {}
    parts = [p for p in re.split(r"[,:]", arg) if p.strip()]
    variant = None
    if parts and "=" not in parts[0]:
        variant, parts = parts[0].strip(), parts[1:]
    pairs: dict[str, str] = {}
    for p in parts:
        key, eq, value = p.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(
                f"variant argument {p!r} is not key=value; e.g. {variant or 'local'}:seeds=3"
            )
        if key in pairs:
            raise ValueError(f"variant argument {key!r} is given twice; give it once")
        pairs[key] = value.strip()
    return variant, pairs


def _value(text: str):
    """A variant argument's value: a number, true/false, a '/'-separated list, else the text."""
    if "/" in text:
        return tuple(_value(t) for t in text.split("/") if t)
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _count(key: str, text: str) -> int:
    v = _value(text)
    if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "seeds" else 0):
        raise ValueError(
            f"variant argument {key}={text!r}: expected a whole number "
            f"{'1 or more' if key == 'seeds' else '0 or more'}"
        )
    return v


def _node(config, path: tuple[str, ...], key: str):
    node = config
    for name in path[:-1]:
        node = node.get(name) if hasattr(node, "get") else None
        if node is None:
            raise ValueError(f"variant argument {key!r}: this config has no {'.'.join(path[:-1])}")
    return node


def apply_variant_args(config, pairs: dict[str, str]):
    """Sets the variant arguments on `config` (the ConfigDict a get_config built); ValueError
    naming the argument and the ones there are for an unknown key."""
    for key, text in pairs.items():
        if key in ("seeds", "confirm"):
            sweep = config.get("sweep")
            if sweep is None:
                raise ValueError(f"variant argument {key!r}: this variant runs no sweep")
            tune = list(sweep.seeds)
            confirm = list(sweep.confirm_seeds)
            if key == "seeds":
                tune = list(range(_count(key, text)))
            else:
                confirm = [0] * _count(key, text)
            start = max(tune) + 1 if tune else 0
            sweep.seeds = tuple(tune)
            sweep.confirm_seeds = tuple(range(start, start + len(confirm)))
        elif key == "epochs":
            config.train.max_epochs = float(_value(text))
        elif key in _LIST_ARGS:
            path = _LIST_ARGS[key]
            v = _value(text)
            setattr(_node(config, path, key), path[-1], v if isinstance(v, tuple) else (v,))
        elif "." in key:
            path = tuple(key.split("."))
            node = _node(config, path, key)
            if path[-1] not in node:
                raise ValueError(f"variant argument {key!r}: this config has no field {key}")
            old, v = node[path[-1]], _value(text)
            if isinstance(old, tuple) and not isinstance(v, tuple):
                v = (v,)
            elif isinstance(old, float) and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            setattr(node, path[-1], v)
        else:
            raise ValueError(
                f"unknown variant argument {key!r}{suggest(key, list(VARIANT_ARGS))}; the "
                f"arguments are {', '.join(VARIANT_ARGS)} or a field's dotted path "
                "(train.max_epochs=20)"
            )
    return config


def takes_args(get_config):
    """A config file's get_config that also takes k=v arguments after its variant:
    get_config('local:seeds=3') is get_config('local') with seeds=3 applied."""

    @functools.wraps(get_config)
    def wrapped(arg=None):
        variant, pairs = split_variant(arg)
        return apply_variant_args(get_config(variant), pairs)

    return wrapped


# ----------------------------------------------------------------------------------------------
# The variants, one line each (--help)
# ----------------------------------------------------------------------------------------------


def config_files() -> list[str]:
    """The config files a user can name: configs/*.py in the current folder, else those of the
    source checkout this package runs from (its full path, to pass as given), suite files (no
    get_config) left out."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for shown, real in (("configs", "configs"), (os.path.join(checkout, "configs"),) * 2):
        found = []
        for f in sorted(glob.glob(os.path.join(real, "*.py"))):
            name = os.path.basename(f)
            try:
                with open(f) as fh:
                    text = fh.read()
            except OSError:
                continue
            if not name.startswith("_") and "def get_config" in text:
                found.append(os.path.join(shown, name))
        if found:
            return found
    return []


def variant_lines(module) -> list[tuple[str, str]]:
    """(variant, one line) per variant the config file documents under 'Variants (after the
    colon):': the first sentence of its entry, cut at a clause when long."""
    doc = module.__doc__ or ""
    if "Variants" not in doc:
        return [(v, "") for v in variants(module)]
    out: list[list[str]] = []
    for line in doc.split("Variants", 1)[1].splitlines()[1:]:
        m = re.match(r"^  ([(a-z_0-9][a-z_0-9,() ]*?)\s{2,}(.*)$", line) or re.match(
            r"^  ([a-z_0-9]+(?:, [a-z_0-9]+)*)\s+(.*)$", line
        )
        if m:
            out.append([m.group(1).strip(), m.group(2).strip()])
        elif out and line.startswith("    "):
            out[-1][1] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break
    return [(name, first_clause(text)) for name, text in out]


def first_clause(text: str, limit: int = 72) -> str:
    """The entry's first sentence; when longer than `limit`, cut at the last ', ' or '; ' or ':'
    inside it (never mid-word) and ended with '...'."""
    m = re.search(r"[.](\s|$)", text)
    head = text[: m.start()] if m else text
    if len(head) <= limit:
        return head
    cut = max(head.rfind(sep, 0, limit) for sep in (", ", "; ", ": ", " ("))
    if cut < limit // 3:
        cut = head.rfind(" ", 0, limit)
    return head[:cut].rstrip(",;: ") + " ..."
