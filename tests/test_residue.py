"""Guards beside the layer test (issue 33): residue does not grow back. Every top-level definition
of the package is used by the package (or its configs), or is on the short list below with its
reason; every path that the code, the configs, the README or docs/ names exists. Read from the
source with `ast` and regular expressions, in a fraction of a second."""

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
    "wide_tf/engine/measure/per_example.py:per_example_grad_sq_norms",
    "wide_tf/engine/measure/per_example.py:per_example_grad_sq_norms_reference",
    "wide_tf/theory/bound.py:per_example_gradients",
    # The DerSimonian-Laird estimator, the closed-form check of meta's REML tau^2.
    "wide_tf/analysis/stats/meta.py:tau2_dl",
    # The averaged two-batch estimate with its standard error, documented in docs/prediction.md.
    "wide_tf/engine/measure/noise_scale.py:averaged_estimate",
    # The schema's required fields (a fact of schema/result_fields.py that its tests read).
    "wide_tf/schema/result_fields.py:REQUIRED",
    # schema/datasets.py's loaders are being made to drive engine/sources.py (a data set's entry
    # names its loader: issue 33 item 3, another change).
    "wide_tf/schema/datasets.py:LOADERS",
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


_PATH = re.compile(r"(?<![\w/.-])((?:wide_tf|docs|configs|tests)/[\w./-]*\w)")


def named_paths_absent(root: pathlib.Path = ROOT) -> list[str]:
    """'file: path' for every repository path (wide_tf/, docs/, configs/, tests/) named in the
    package, the configs, the README or docs/ that does not exist."""
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
