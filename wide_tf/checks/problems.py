"""Owns the errors of the checks before TensorFlow starts: a `Problem` whose message names the
problem and the fix in one line, `UsageError` (exit status 2) when the command or config is wrong,
`RuntimeProblem` (exit status 1) when the machine or the workdir is."""

from __future__ import annotations

from wide_tf.schema.fields import suggest

__all__ = ["Problem", "UsageError", "RuntimeProblem", "suggest"]


class Problem(Exception):
    """A run that cannot go ahead; str(self) is the one line to show."""

    exit_code = 1


class UsageError(Problem, ValueError):
    """The command line or the config asks for something invalid (exit status 2)."""

    exit_code = 2


class RuntimeProblem(Problem):
    """The machine, the data or the workdir cannot serve a valid request (exit status 1)."""

    exit_code = 1
