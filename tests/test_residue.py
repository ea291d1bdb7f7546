"""Guards beside the layer test: residue does not grow back. Every top-level definition and every
public member of a class in the package is used by the package (or its configs, or tools/), or is
on the short list below with its reason; every path that the code, the configs, the README or docs/
names exists; no issue numbers in code, configs or docs; no `*_spec` import aliases or `spec.`
module names left from the old spec/ package; no reader of a retired file layout. Read from the
source with `ast` and regular expressions, in a fraction of a second. Each check is shown to fail
on a planted example."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wide_tf"

# Top-level definitions that nothing in the package uses, each kept for a stated reason.
UNUSED_BY_DESIGN = {
    # Independent checks of the fast per-example gradient path: the tests' oracles.
    "wide_tf/engine/measure/diversity.py:stats_from_per_example_gradients",
    "wide_tf/engine/tf/per_example.py:per_example_grad_sq_norms",
    "wide_tf/engine/tf/per_example.py:per_example_grad_sq_norms_reference",
    "wide_tf/theory/bound.py:per_example_gradients",
    # The DerSimonian-Laird estimator, the closed-form check of meta's REML tau^2.
    "wide_tf/analysis/stats/meta.py:tau2_dl",
    # The averaged two-batch estimate with its standard error, documented in docs/prediction.md.
    "wide_tf/engine/measure/noise_scale.py:averaged_estimate",
}
# Paths named on purpose although they do not exist (an example of a typo and its message).
NAMED_BUT_ABSENT = {"docs/troubleshooting.md: configs/mpl.py"}


def _sources():
    """The package, and what uses it from a checkout: the configs and the benchmarks (tools/)."""
    return [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "configs").rglob("*.py"))] + sorted(
        (ROOT / "tools").rglob("*.py")
    )


def unused_definitions(files=None, root: pathlib.Path = ROOT) -> list[str]:
    """'path:name' of every top-level function, class or assigned name of the package that no
    module of the package, the configs or tools/ loads (a name or an attribute)."""
    trees = {p: ast.parse(p.read_text()) for p in (files or _sources())}
    used = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
                used.add(n.id)
            elif isinstance(n, ast.Attribute):
                used.add(n.attr)
    out = []
    for path, tree in trees.items():
        if path.relative_to(root).parts[0] in ("configs", "tools"):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            rel = path.relative_to(root).as_posix()
            out += [f"{rel}:{n}" for n in names if not n.startswith("__") and n not in used]
    return sorted(out)


def test_every_top_level_definition_is_used_or_listed_with_its_reason():
    found = set(unused_definitions())
    assert found - UNUSED_BY_DESIGN == set(), "unused: remove them, or list them with a reason"
    assert UNUSED_BY_DESIGN - found == set(), "listed but used (or gone): drop from the list"


def test_an_unused_function_is_caught(tmp_path):
    pkg = tmp_path / "wide_tf"
    pkg.mkdir()
    (pkg / "a.py").write_text("def used():\n    pass\n\n\ndef orphan():\n    used()\n")
    assert unused_definitions(sorted(pkg.rglob("*.py")), tmp_path) == ["wide_tf/a.py:orphan"]


_PATH = re.compile(r"(?<![\w/.-])((?:wide_tf|docs|configs|tests|tools)/[\w./-]*\w)")


def named_paths_absent(root: pathlib.Path = ROOT) -> list[str]:
    """'file: path' for every repository path (wide_tf/, docs/, configs/, tests/, tools/) named in
    the package, the configs, the README or docs/ that does not exist."""
    files = [*_sources(), root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    out = []
    for f in files:
        for m in _PATH.finditer(f.read_text()):
            path = m.group(1).rstrip(".")
            if "<" not in path and "*" not in path and not (root / path).exists():
                out.append(f"{f.relative_to(root).as_posix()}: {path}")
    return sorted(set(out))


def test_every_path_named_in_code_or_docs_exists():
    assert set(named_paths_absent()) - NAMED_BUT_ABSENT == set()


# ---- public class members that only the tests use ------------------------------------------------

# Methods that a framework calls by name (Keras layers and optimizers, absl, argparse, logging,
# the pickle and dataclass protocols), never the package itself.
FRAMEWORK_HOOKS = {
    "build",
    "call",
    "compute_output_shape",
    "get_config",
    "from_config",
    "update_step",
    "filter",
    "error",
    "format",
    "emit",
    "result",
    "update_state",
    "reset_state",
    "get_build_config",
    "build_from_config",
    "compute_output_spec",
    "__call__",
}
# Public members that nothing in the package uses, each kept for a stated reason.
MEMBERS_UNUSED_BY_DESIGN: set[str] = set()


def _used_names(files) -> set[str]:
    used = set()
    for path in files:
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
                used.add(n.id)
            elif isinstance(n, ast.Attribute):
                used.add(n.attr)
            elif (
                isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier()
            ):
                used.add(n.value)  # getattr(x, "name"), a registry keyed by a method's name
    return used


def unused_members(files=None, root: pathlib.Path = ROOT) -> list[str]:
    """'path:Class.member' of every public method or property of a package class that no module
    of the package, the configs or tools/ names (the tests do not count: a member that only a
    test calls is residue)."""
    files = files or _sources()
    used = _used_names(files)
    out = []
    for path in files:
        rel = path.relative_to(root)
        if rel.parts[0] in ("configs", "tools"):
            continue
        for cls in ast.parse(path.read_text()).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                name = node.name
                if name.startswith("_") or name in FRAMEWORK_HOOKS or name in used:
                    continue
                out.append(f"{rel.as_posix()}:{cls.name}.{name}")
    return sorted(out)


def test_every_public_member_is_used_by_the_package_or_listed_with_its_reason():
    found = set(unused_members())
    assert found - MEMBERS_UNUSED_BY_DESIGN == set(), "used only by tests (or not at all)"
    assert MEMBERS_UNUSED_BY_DESIGN - found == set(), "listed but used (or gone): drop it"


def test_a_member_only_a_test_calls_is_caught(tmp_path):
    pkg = tmp_path / "wide_tf"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "class Box:\n    def size(self):\n        return 1\n\n"
        "    def only_for_tests(self):\n        return 2\n\n\n"
        "def use(box):\n    return box.size()\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test():\n    Box().only_for_tests()\n")
    assert unused_members(sorted(pkg.rglob("*.py")), tmp_path) == [
        "wide_tf/a.py:Box.only_for_tests"
    ]


# ---- issue numbers ------------------------------------------------------------------------------

# Text the repository ships: the package, tools/, configs, tests, docs and the metadata. The
# launcher's shell script and its check transcripts (docs/hardware_checks.*) are the launcher's
# own files, held by its tests.
_TEXT = (".py", ".md", ".txt", ".cfg", ".toml")
_ISSUE = re.compile(r"\b[Ii]ssues?\s+#?\d+")


def _shipped_text(root: pathlib.Path = ROOT):
    for top in ("wide_tf", "tools", "configs", "tests", "docs", "examples"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix in _TEXT and path.is_file() and "hardware_checks" not in path.name:
                yield path
    for name in ("README.md", "setup.cfg", "pyproject.toml"):
        if (root / name).exists():
            yield root / name


def issue_numbers(root: pathlib.Path = ROOT) -> list[str]:
    """'file:line: text' for every "issue N" (or "issues N") in the shipped text: the repository
    speaks of the project, not of the tracker that shaped it."""
    out = []
    for path in _shipped_text(root):
        text = path.read_text(errors="replace")
        for m in _ISSUE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{path.relative_to(root).as_posix()}:{line}: {m.group(0)}")
    return out


def test_no_issue_numbers_in_code_configs_or_docs():
    assert issue_numbers() == []


def test_an_issue_number_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("Fine.\nSee is" + "sue 47, item 4.\n")
    (tmp_path / "setup.cfg").write_text("# (Iss" + "ue 35)\n")
    assert issue_numbers(tmp_path) == ["docs/a.md:2: is" + "sue 47", "setup.cfg:1: Iss" + "ue 35"]


# ---- names left from the spec/ package ----------------------------------------------------------

# The schema's modules as they were called before spec/ became schema/.
_SPEC_MODULE = re.compile(
    r"\bspec\.(?:rules|fields|datasets|optimizers|schedules|lr_schedules|targets|plan|result"
    r"|result_fields|identity|hardware|memory|families|architectures|defaults|cli|choices|events"
    r"|provenance)\b"
)


def spec_residue(files=None, root: pathlib.Path = ROOT) -> list[str]:
    """'path:line: what' for every import alias ending in `_spec` and every string (a doc, a
    message, a docstring) that names a module as `spec.<module>`, in the package, tools/, configs
    and tests."""
    docs = sorted((root / "docs").rglob("*.md")) if files is None else []
    out = []
    for path in files or [*_sources(), *sorted((root / "tests").rglob("*.py"))]:
        rel = path.relative_to(root).as_posix()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import | ast.ImportFrom):
                out += [
                    f"{rel}:{n.lineno}: {a.name} as {a.asname}"
                    for a in n.names
                    if a.asname and a.asname.endswith("_spec")
                ]
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                out += [f"{rel}:{n.lineno}: {m.group(0)}" for m in _SPEC_MODULE.finditer(n.value)]
    for path in docs:
        out += [
            f"{path.relative_to(root).as_posix()}: {m.group(0)}"
            for m in _SPEC_MODULE.finditer(path.read_text())
        ]
    return sorted(out)


def test_no_spec_aliases_or_spec_module_names():
    assert spec_residue() == []


def test_a_spec_alias_and_a_spec_name_in_a_doc_are_caught(tmp_path):
    pkg = tmp_path / "wide_tf"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "from wide_tf.schema import datasets as datasets_spec\n\n"
        'DOC = "checked by ' + "spec" + '.rules"\n'
    )
    assert spec_residue(sorted(pkg.rglob("*.py")), tmp_path) == [
        "wide_tf/a.py:1: datasets as datasets_spec",
        "wide_tf/a.py:3: " + "spec" + ".rules",
    ]


# ---- readers of retired layouts -----------------------------------------------------------------

# Files the package once wrote and writes no more; nothing may still read them. (One results file
# per trial, results/<id>.json, replaced the one-line-per-trial results.jsonl.)
RETIRED_FILES = ("results.jsonl",)
_LEGACY = re.compile(r"\blegacy\b", re.IGNORECASE)


def legacy_readers(files=None, root: pathlib.Path = ROOT) -> list[str]:
    """'path:line: what' for every retired file name the package or tools/ names, and every
    "legacy" in their code or docs (a reader kept for an older layout calls itself that)."""
    out = []
    for path in files or _sources():
        rel = path.relative_to(root)
        if rel.parts[0] == "configs":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            out += [f"{rel.as_posix()}:{i}: {name}" for name in RETIRED_FILES if name in line]
            out += [f"{rel.as_posix()}:{i}: {m.group(0)}" for m in _LEGACY.finditer(line)]
    return sorted(out)


def test_no_reader_of_a_retired_layout():
    assert legacy_readers() == []


def test_a_legacy_reader_is_caught(tmp_path):
    pkg = tmp_path / "wide_tf"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "import os\n\n\ndef old(workdir):\n"
        '    return os.path.join(workdir, "results.jsonl")  # the legacy file\n'
    )
    assert legacy_readers(sorted(pkg.rglob("*.py")), tmp_path) == [
        "wide_tf/a.py:5: legacy",
        "wide_tf/a.py:5: results.jsonl",
    ]


# ---- module names -------------------------------------------------------------------------------

# Basenames two modules share on purpose, with the reason.
REPEATED_BY_DESIGN = {
    # The metrics a run may target and their directions (schema), and a run's crossings of them
    # (engine).
    "targets": {"wide_tf/schema/targets.py", "wide_tf/engine/targets.py"},
}


def repeated_basenames(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """{basename: its modules} for every module basename the package uses twice or more, once at
    least outside engine/ (whose backend folders mirror each other's names on purpose; a
    package's __init__ and __main__ aside): `suite` in three layers reads as one module."""
    seen: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            seen.setdefault(path.stem, set()).add(path.relative_to(root.parent).as_posix())
    engine = f"{root.name}/engine/"
    return {
        name: paths
        for name, paths in seen.items()
        if len(paths) > 1 and any(not p.startswith(engine) for p in paths)
    }


def test_no_module_basename_repeats_without_its_reason():
    assert repeated_basenames() == REPEATED_BY_DESIGN


def test_a_repeated_basename_is_caught(tmp_path):
    # Two layers' suite.py are caught; the backend folders' mirrored step.py are not.
    for folder, name in [("study", "suite"), ("store", "suite")] + [
        ("engine/tf", "step"),
        ("engine/jax", "step"),
    ]:
        (tmp_path / "wide_tf" / folder).mkdir(parents=True)
        (tmp_path / "wide_tf" / folder / f"{name}.py").write_text("")
    assert repeated_basenames(tmp_path / "wide_tf") == {
        "suite": {"wide_tf/study/suite.py", "wide_tf/store/suite.py"}
    }
