"""Owns which checkpoint a run resumes from, on either backend: the newest one that reads whole.

A checkpoint cut short (a kill during a copy, a full disk, a partial download) must not throw the
run away when an older one (the backends keep two) is whole: each is tried newest first, a damaged
one is skipped and named in the log with the reason, and only when none reads is the newest one's
error raised (errors.py turns it into one line that says what to do). A TensorFlow checkpoint that
its CheckpointManager's state file does not name is the leftover of a save that never finished (a
kill mid-write): it is set aside like a damaged one, but it is never the run's error, since no
whole save was lost with it. Every file of a candidate is
checked to be a regular file first (store/workdir.check_regular): a FIFO or a device planted in
checkpoints/ is skipped, not read for ever."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from wide_tf.store import workdir as wd

_STEP = re.compile(r"^ckpt-(\d+)\.")


def steps_on_disk(directory: str) -> list[int]:
    """The steps of every ckpt-<step>.* file in `directory`, newest first."""
    found = {_STEP.match(name) for name in wd.listdir(directory)}
    return sorted({int(m.group(1)) for m in found if m}, reverse=True)


def files_of(directory: str, step: int) -> list[str]:
    """The paths of checkpoint `step`'s files."""
    prefix = f"ckpt-{step}."
    return [wd.join(directory, n) for n in wd.listdir(directory) if n.startswith(prefix)]


def newest_readable(
    candidates: Iterable[tuple[str, list[str]]],
    load: Callable[[str], object],
    errors: tuple[type[BaseException], ...],
    log,
    set_aside: bool = True,
    unfinished: Iterable[str] = (),
):
    """(name, result of `load(name)`) of the first candidate, newest first, whose files are regular
    and whose `load` raises none of `errors`; (None, None) when there is no candidate. Each
    skipped candidate is logged with why and (`set_aside`: the process that writes the
    checkpoints) its files renamed to <file>.damaged-<time>, kept but no longer read, so that the
    run's next save of that step writes fresh files (a FIFO left in place would block the save).
    When every candidate fails, the newest one's error is raised and nothing is moved, unless
    every failed one is `unfinished` (a save that never completed): then they are set aside and
    (None, None) says the run starts from the beginning. `candidates`: (name, its files)."""
    unfinished = set(unfinished)
    first = None
    skipped: list[tuple[str, list[str]]] = []
    for name, files in candidates:
        try:
            for path in files:
                wd.check_regular(path)
            result = load(name)
        except (wd.NotARegularFile, *errors) as e:
            if name not in unfinished:
                first = first or e
            why = " ".join(str(e).split())[:300] or type(e).__name__
            skipped.append((name, files))
            log(
                "checkpoint %s skipped, it does not read whole (%s: %s)",
                name,
                type(e).__name__,
                why,
            )
            continue
        if skipped:
            aside = _set_aside(skipped) if set_aside else []
            log(
                "resuming from the older checkpoint %s; skipped: %s%s",
                name,
                ", ".join(n for n, _ in skipped),
                f" (moved aside, kept: {', '.join(aside)})" if aside else "",
            )
        return name, result
    if first is not None:
        first.checkpoint_path = next(n for n, _ in skipped if n not in unfinished)
        raise first  # errors.py names it in the one line
    if skipped:
        aside = _set_aside(skipped) if set_aside else []
        log(
            "no checkpoint finished (%s left by a save cut short%s): the run starts from the "
            "beginning",
            ", ".join(n for n, _ in skipped),
            f"; moved aside, kept: {', '.join(aside)}" if aside else "",
        )
    return None, None


def _set_aside(skipped: list[tuple[str, list[str]]]) -> list[str]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for _, files in skipped:
        for path in files:
            aside = f"{path}.damaged-{stamp}"
            try:
                wd.rename(path, aside)
            except OSError:
                continue  # gone meanwhile, or not ours to move: the save may still replace it
            moved.append(aside)
    return moved
