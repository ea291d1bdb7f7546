"""Owns the secondary commands' command line (the report, the simulator, the families table, ...):
absl flags as `wide_tf.main` takes them (--name=value, --[no]name for a switch, --flagfile=FILE),
run by absl's app.run, each command's flags in a FlagValues of its own; bad input is one line
`error: <problem>; <fix>` on stderr and exit status 2, before anything runs or is written: an
unknown flag (the closest one named), a value out of its domain, a flag given twice, a stray
argument. Also the value types of those flags (finite numbers in range, integers)."""

from __future__ import annotations

import difflib
import functools
import math
import sys
import textwrap
import types

from absl import app, flags, logging

from wide_tf.schema.problems import one_line

HELP = ("-h", "--help", "-help", "-?", "--helpshort", "--helpfull")


def flag_values() -> flags.FlagValues:
    """A command's own flags. Not absl's global FLAGS: the configs import predict_study and the
    workers import families for their functions, and wide_tf.main's --config and --workdir live
    there (one name defined twice there is absl's DuplicateFlagError)."""
    return flags.FlagValues()


def values(fv: flags.FlagValues) -> types.SimpleNamespace:
    """The parsed flags by name (a.studies), as the commands' bodies read them."""
    return types.SimpleNamespace(**fv.flag_values_dict())


def run(main, fv: flags.FlagValues, argv=None, *, prog: str, text: str, **rules) -> int:
    """The command: absl's app.run of `main` with `fv` parsed from `argv` (default: sys.argv[1:])
    by `parse` (`rules`: its `positional` and `required`); main gets the program's name and, where
    `positional`, the arguments that are not flags. Returns the exit status (a test runs the
    command in its own process; `python -m` hands it to sys.exit)."""
    args = [prog, *(sys.argv[1:] if argv is None else argv)]
    parser = functools.partial(parse, fv, prog=prog, text=text, **rules)
    try:
        app.run(main, args, flags_parser=parser)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr, flush=True)
        return 1
    return 0  # not reached: app.run always exits


def parse(fv, argv, *, prog: str, text: str, positional=False, required=None) -> list[str]:
    """argv's flags into `fv` (from their defaults on every call) and the rest of argv; `--help`
    prints the usage and exits 0; bad input is one `error:` line and exit status 2, a flag of
    `required` ({name: an example}) missing included."""
    args = list(argv[1:])
    if any(a in HELP for a in _flag_part(args)):
        sys.stdout.write(usage_text(fv, text))
        sys.stdout.flush()
        raise SystemExit(0)
    given = _given(fv, args)
    for name, vals in given.items():  # absl keeps the last silently: refused, as main does
        if len(vals) > 1:
            fail(f"--{name} is given {len(vals)} times ({', '.join(vals)}); give it once")
    fv.unparse_flags()
    try:
        rest = fv(list(argv))
    except flags.UnrecognizedFlagError as e:
        fail(_unknown(fv, e.flagname))
    except (flags.Error, ValueError) as e:  # a bad value; absl raises ValueError for some
        fail(f"{_bad_value(fv, e, given)}; see {prog} --help")
    if not flags.FLAGS.is_parsed():  # app.run reads absl's own flags there: their defaults,
        flags.FLAGS.mark_as_parsed()  # and warnings only, as these commands logged before it
        logging.set_verbosity(logging.WARNING)
    if len(rest) > 1 and not positional:
        fail(
            f"unexpected argument {rest[1]!r}; this command takes flags only, in the form "
            f"--name=value ({', '.join(_names(fv))})"
        )
    for name, example in (required or {}).items():
        if fv[name].value is None:
            fail(f"--{name} is required; {example}")
    return rest


def fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def usage_text(fv: flags.FlagValues, text: str) -> str:
    """--help: the command's text for users, then each flag with its default and what it does."""
    lines = [text.rstrip(), "", "Flags (--name=value; --flagfile=FILE reads flags from a file):"]
    for name in fv:
        f = fv[name]
        shown = "true" if f.default is True else "false" if f.default is False else f.default
        # A long default (simulate's every generator) is said in the flag's own help instead.
        default = "" if shown in (None, "") or len(str(shown)) > 48 else f" (default: {shown})"
        lines.append(f"  {'--[no]' if f.boolean else '--'}{name}{default}")
        lines += [f"      {t}" for t in textwrap.wrap(f.help or "", 92)]
    return "\n".join(lines) + "\n"


def _names(fv) -> list[str]:
    return [f"--{n}" for n in fv]


def _flag_part(args) -> list[str]:
    return args[: args.index("--")] if "--" in args else args


def _given(fv, args) -> dict[str, list[str]]:
    """The values given to each of fv's flags on the command line (--noname: 'false')."""
    out: dict[str, list[str]] = {}
    part = _flag_part(args)
    for i, arg in enumerate(part):
        if not arg.startswith("-") or arg == "-":
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if name not in fv and name[:2] == "no" and name[2:] in fv and fv[name[2:]].boolean:
            name, value = name[2:], "false"
        elif name in fv and not eq:
            value = "true" if fv[name].boolean else (part[i + 1] if i + 1 < len(part) else "")
        if name in fv:
            out.setdefault(name, []).append(value)
    return out


def _unknown(fv, name: str) -> str:
    wrong = f"--{name.lstrip('-')}"
    close = difflib.get_close_matches(wrong, _names(fv), n=1)
    hint = f"did you mean {close[0]}?" if close else f"the flags are {', '.join(_names(fv))}"
    return f"unknown flag {wrong}; {hint}"


def _bad_value(fv, e: Exception, given: dict[str, list[str]]) -> str:
    """absl's "flag --name=value: problem" as "--name: problem" (the problem names the value)."""
    message = one_line(e)
    for name, (value, *_) in given.items():
        if message.startswith(f"flag --{name}={value}: "):
            if fv[name].boolean:
                return f"--{name}: {value!r} is not true or false; give --{name} or --no{name}"
            return f"--{name}: {message[len(f'flag --{name}={value}: ') :]}"
    if message.startswith("Missing value for flag "):
        name = message.rsplit(" ", 1)[-1]
        return f"{name}: missing its value; give it as {name}=VALUE"
    return message.removeprefix("ERROR:: ")


class Typed(flags.ArgumentParser):
    """An absl flag type from a conversion that raises ValueError with the problem (absl's float
    flag takes nan and inf; its messages give no fix)."""

    def __init__(self, convert, syntax: str):
        self.convert, self.syntactic_help = convert, syntax

    def parse(self, argument):
        return self.convert(argument)


def number(low: float | None = None, *, low_open: bool = False, high: float | None = None):
    """A flag type: a finite number within [low, high] (low excluded with low_open)."""
    rng = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
    rng += [f"<= {high:g}"] if high is not None else []

    def convert(text) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
        bad = not math.isfinite(value) or (low is not None and value < low)
        bad = bad or (low_open and value == low) or (high is not None and value > high)
        if bad:
            raise ValueError(
                f"{text!r} is out of range: use a finite number {' and '.join(rng)}".rstrip()
            )
        return value

    return Typed(convert, f"a finite number {' and '.join(rng)}".rstrip())


def integer(low: int | None = None, high: int | None = None):
    """A flag type: an integer >= low (and <= high)."""
    rng = [f">= {low}"] if low is not None else []
    rng += [f"<= {high}"] if high is not None else []
    kind = f"an integer {' and '.join(rng)}".rstrip()

    def convert(text) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected {kind}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{text!r} is out of range: use {kind}")
        return value

    return Typed(convert, kind)
