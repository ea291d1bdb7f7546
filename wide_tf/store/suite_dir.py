"""Owns a suite's workdir: WORKDIR/suite.json (the suite, its studies, each study's wall time) and
each study's folder, WORKDIR/<study>/ (a whole study workdir of its own). The runner is
wide_tf/study/suite_runner.py, the table wide_tf/report/answer.py."""

from __future__ import annotations

import dataclasses

from wide_tf.store import workdir as wd

SUITE_FILE = "suite.json"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One study of a suite: its folder name, its config (`path:variant`), the two labels of
    the suite's table (the optimizer protocol, the family), and, for a replicate (the same
    design on other seeds), the name of the study it repeats: the report reads the two together
    (`wide_tf.analysis.pooled`)."""

    name: str
    config: str
    protocol: str
    family: str
    replicate_of: str = ""


def study_dir(workdir: str, entry: Entry) -> str:
    return wd.join(workdir, entry.name)


def read_record(workdir: str) -> dict:
    """WORKDIR/suite.json: the suite, its entries, each study's wall seconds ({} if none)."""
    path = wd.join(workdir, SUITE_FILE)
    return wd.read_json(path) if wd.exists(path) else {}


def entries_of(record: dict) -> list[Entry]:
    return [Entry(**e) for e in record.get("entries", [])]


def write_record(workdir: str, spec: str, entries: list[Entry], wall: dict) -> None:
    rec = {"suite": spec, "entries": [dataclasses.asdict(e) for e in entries], "wall_s": wall}
    wd.write_json(wd.join(workdir, SUITE_FILE), rec)
