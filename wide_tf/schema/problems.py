"""Owns the two bases of every error the package raises on purpose, at the lowest layer so that
every layer's errors subclass one of them: `UsageError` (exit status 2) when the command or the
config asks for something invalid, `RuntimeProblem` (exit status 1) when the machine, the data or
the workdir cannot serve a valid request. str(error) is the one line to show: the problem and the
fix. `one_line` makes any message one line (ml_collections and TensorFlow write several)."""

from __future__ import annotations

import re


class Problem(Exception):
    """A run that cannot go ahead; str(self) is the one line to show, exit_code its status."""

    exit_code = 1


class UsageError(Problem, ValueError):
    """The command line or the config asks for something invalid (exit status 2)."""

    exit_code = 2


class RuntimeProblem(Problem, RuntimeError):
    """The machine, the data or the workdir cannot serve a valid request (exit status 1)."""

    exit_code = 1


def one_line(text) -> str:
    """The message of an exception as one line (ml_collections and TensorFlow write several)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Traceback", "File ", "Pass --help"))]
    return re.sub(r"\s+", " ", " ".join(lines[:3])).strip()[:600]
