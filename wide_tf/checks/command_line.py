"""Owns main's flags as they are parsed: the config file and the override paths checked before
absl applies them, and absl's and ml_collections' errors turned into one UsageError line (the
config's field and the type its value must have named)."""

from __future__ import annotations

import re

from wide_tf.checks import loader, validate
from wide_tf.schema.problems import one_line

_HELP = ("-h", "--help", "-help", "--helpshort", "--helpfull", "--helpxml", "-?")


def verbose_in(argv) -> bool:
    return any(
        a in ("--verbose", "-verbose", "--verbose=true", "--verbose=True", "--verbose=1")
        for a in argv
    )


def _config_spec(argv) -> str | None:
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        for prefix in ("--config=", "-config="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
        if arg in ("--config", "-config") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def parse_flags(argv, parse):
    """absl's flag parsing (`parse`: main's flags.FLAGS), with every error a UsageError of one line
    (under --verbose absl's own error is raised as it is): the config file and variant, and the
    override paths, are checked first, with the closest valid name suggested."""
    config = None
    try:
        spec = _config_spec(argv)
        suite = any(a.startswith(("--suite=", "-suite=")) or a == "--suite" for a in argv)
        if spec is None and not suite and not any(a in _HELP for a in argv):
            raise validate.UsageError(
                "--config is required, e.g. --config=configs/mlp.py:local (configs/mlp.py, "
                "configs/wrn.py, configs/theory.py; the variant follows the colon), or "
                "--suite=configs/answer.py"
            )
        if spec is not None:
            config = loader.load_config(spec)
            validate.check_overrides(config, validate.override_paths(argv))
        return parse(argv)
    except validate.Problem:
        raise
    except Exception as e:  # flags.Error, and ml_collections' errors while applying an override
        if verbose_in(argv):
            raise
        raise validate.UsageError(flag_error_line(e, config)) from e


def flag_error_line(e, config) -> str:
    """The line for an error raised while the flags are parsed (flags.Error, and ml_collections'
    errors while applying an override); `config` is the loaded config, or None."""
    message = one_line(e)
    if "is not supported for overriding" in message:
        field = re.search(r"field config\.(\S+) is", message)
        name = field.group(1) if field else "that field"
        message = (
            f"--config.{name}: this field cannot be set on the command line; change it in the "
            f"config file (or add a variant); lists are tuples, e.g. --config.sweep.seeds='(0,1)'"
        )
    return _type_hint(message.replace("FATAL Flags parsing error: ", ""), config)


def _type_hint(message: str, config) -> str:
    """Adds the type a --config.<field> value must have to ml_collections' parse error."""
    m = re.match(r"flag --config\.([\w.]+)=", message)
    if not m or config is None:
        return message
    value = config
    for part in m.group(1).split("."):
        try:
            value = value[part]
        except (KeyError, TypeError):
            return message
    kinds = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}
    kind = kinds.get(type(value))
    if kind is None:
        return message
    return f"{message}; --config.{m.group(1)} takes {kind}, e.g. --config.{m.group(1)}={value}"
