"""The README and docs/ speak of the project alone: no absolute paths of the machine a number
was measured on, and no remarks about who built what or in which working session. Commands in
code blocks may use a scratch directory such as /tmp; prose may not point into a build machine."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted(
    [REPO / "README.md"] + list((REPO / "docs").rglob("*.md")) + [REPO / "docs" / "power_table.txt"]
)

# Anywhere outside code blocks: a build machine's home folders.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home)/")
# In prose outside inline code: a scratch folder named as where something lives.
SCRATCH_PATH = re.compile(r"(?<![\w.])/tmp/")
AUTHORSHIP = re.compile(
    r"\b(?:this\ session|the session(?:'s|s)?\b|(?:first|second|third|fourth) session|"
    r"sessions? that (?:built|ran)|I (?:ran|built|measured|wrote)|we (?:built|ran|wrote)|"
    r"(?:a|the|one|another) helper(?:'s|s)?\b|the lead(?:'s)?\b|agents?'? (?:jobs|work))",
    re.IGNORECASE,
)


def prose_lines(text: str):
    """(line number, line) outside fenced and indented code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    ") or line.startswith("\t"):
            continue
        yield i, line


def problems(path: pathlib.Path) -> list[str]:
    out = []
    for i, line in prose_lines(path.read_text()):
        bare = re.sub(r"`[^`]*`", "", line)
        hit = MACHINE_PATH.search(line) or SCRATCH_PATH.search(bare) or AUTHORSHIP.search(line)
        if hit:
            out.append(f"{path.relative_to(REPO)}:{i}: {hit.group(0)!r} in {line.strip()[:90]!r}")
    return out


def test_the_checker_finds_what_it_should():
    bad = REPO / "docs" / "_probe.md"
    # The planted phrases are split so that this file does not itself read as such prose.
    work, ses, agents = "/wo" + "rk/", "sess" + "ions", "age" + "nts'"
    cases = {
        f"see {work}runs/x for the numbers": True,
        "a copy of `/root/x`": True,
        "the records in /tmp/ab/old": True,
        "run it with `--workdir=/tmp/x`": False,
        f"    cp -a {work}final runs/x": False,
        "This session ran it": True,
        f"the {ses} that built this": True,
        f"beside four other {agents} jobs": True,
        "a session of 2 cores": False,
    }
    try:
        for line, expect in cases.items():
            bad.write_text(f"# t\n\n{line}\n")
            assert bool(problems(bad)) == expect, line
    finally:
        bad.unlink(missing_ok=True)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_name_no_build_machine_and_no_authorship(path):
    assert not problems(path), "\n".join(problems(path))
