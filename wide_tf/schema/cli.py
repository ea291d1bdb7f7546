"""Owns the command lines' argument style: one line `error: <problem>; <fix>` on stderr and exit
status 2 for bad input, and finite-number argument types (families, simulate, the report)."""

from __future__ import annotations

import argparse
import difflib
import math
import sys


class UsageParser(argparse.ArgumentParser):
    """argparse with the package's error style: one line `error: <problem>; <fix>` on stderr and
    exit status 2, instead of the usage block and `prog: error: ...`; positional arguments and
    unknown flags are refused by name (the CLIs of families, simulate and the report use it)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --tol is not --tolerance: say so instead
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # argparse's own messages ("argument --eps: invalid float value: 'x'") name the problem.
        self.fail(f"{message}; see {self.prog} --help")

    def fail(self, message: str):
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            flags = sorted({o for a in self._actions for o in a.option_strings if o[:2] == "--"})
            word = extra[0]
            if not word.startswith("-"):
                self.fail(
                    f"unexpected argument {word!r}; this command takes flags only, in the form "
                    f"--name=value ({', '.join(flags)})"
                )
            name = word.split("=", 1)[0]
            close = difflib.get_close_matches(name, flags, n=1)
            hint = f"did you mean {close[0]}?" if close else f"the flags are {', '.join(flags)}"
            self.fail(f"unknown flag {name}; {hint}")
        return parsed


def number(low: float | None = None, *, low_open: bool = False, high: float | None = None):
    """An argparse type: a finite number within [low, high] (low excluded with low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = not math.isfinite(value) or (low is not None and value < low)
        bad = bad or (low_open and value == low) or (high is not None and value > high)
        if bad:
            rng = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
            rng += [f"<= {high:g}"] if high is not None else []
            raise argparse.ArgumentTypeError(
                f"{text!r} is out of range: use a finite number {' and '.join(rng)}".rstrip()
            )
        return value

    return parse


def integer(low: int, high: int | None = None):
    """An argparse type: an integer >= low (and <= high)."""
    rng = f">= {low}" + ("" if high is None else f" and <= {high}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {rng}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: use an integer {rng}")
        return value

    return parse
