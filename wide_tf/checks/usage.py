"""Owns what the command line shows a new user before anything runs: `--help` (what the command
does, the config files with each variant in one line, the variant arguments, the flags) and
`--print_config` (the resolved config as YAML)."""

from __future__ import annotations

import json
import sys
import textwrap

from wide_tf.checks import loader

HELP = ("-h", "--help", "-help", "-?")  # --helpshort and --helpfull stay absl's own listing


def exit_on_help(argv, doc: str, flag_objects) -> None:
    """Prints `usage_text` and exits 0 when the command line asks for help."""
    if any(a in HELP for a in argv[1:]):
        listed = [(f.name, f.help, isinstance(f.default, bool)) for f in flag_objects]
        sys.stdout.write(usage_text(doc, listed))
        sys.exit(0)


def usage_text(doc: str, flag_list) -> str:
    """--help: `doc` (the command's own text), the configs in the current folder or this checkout
    with each variant in one line, the variant arguments, then `flag_list`: (name, help, whether
    it is a boolean) per flag."""
    lines = [doc.rstrip(), "", "Configs (FILE) and their variants (:VARIANT):"]
    for path in loader.config_files():
        try:
            module = loader.load_module(path)
        except Exception:  # noqa: BLE001  (a broken config file is listed, not fatal to --help)
            lines.append(f"  {path}  (does not load: --config={path} says why)")
            continue
        lines.append(f"  {path}")
        entries = loader.variant_lines(module)
        width = min(max((len(n) for n, _ in entries), default=0), 18)
        for name, text in entries:
            if len(name) > width:  # several names sharing an entry: the line under them
                lines += [f"    {name}", f"    {' ' * width}  {text}".rstrip()]
            else:
                lines.append(f"    {name:<{width}}  {text}".rstrip())
    lines += ["", "Variant arguments (after the variant, joined by ',' or ':'):"]
    lines += [f"    {k:<8}  {doc}" for k, doc in loader.VARIANT_ARGS.items()]
    lines += ["    a.b=v     any config field by its dotted path, e.g. train.max_epochs=20", ""]
    lines += [
        "Other commands:",
        "  python -m wide_tf.report --workdir=DIR           the report again (another --eps)",
        "  python -m wide_tf.analysis.simulate --help       a design's simulated power",
        "  python -m wide_tf.analysis.predict_study --help  a predict study against the sweep",
        "",
        "Flags (--helpfull: every flag, absl's own included):",
    ]
    for name, help_text, is_bool in flag_list:
        lines.append(f"  {'--[no]' if is_bool else '--'}{name}")
        lines += [f"      {t}" for t in textwrap.wrap(help_text, 92)]
    return "\n".join(lines) + "\n"


def config_text(config, indent: int = 0) -> str:
    """The resolved config as YAML (every field; lists in brackets, text quoted), sorted by name:
    what a run of this command would run, to read or to diff."""
    out = []
    for key in sorted(config.keys()):
        value = config[key]
        if hasattr(value, "keys"):
            out.append(f"{' ' * indent}{key}:\n{config_text(value, indent + 2)}")
        else:
            out.append(f"{' ' * indent}{key}: {_yaml_value(value)}\n")
    return "".join(out)


def _yaml_value(v) -> str:
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    try:
        return json.dumps(v)
    except TypeError:
        return json.dumps(str(v))
