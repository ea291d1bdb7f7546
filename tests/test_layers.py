"""The package's layers (docs/layout.md): who may import whom, which layers never load TensorFlow,
and the size limits that keep one job per module. Read from the source with `ast`, so a planted
upward import fails here before it can run."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wide_tf"

# Each layer and the layers it may import (besides itself). Lower layers first; nothing imports
# upward. `study.lr_grid` is the one module above analysis's floor that analysis and report read:
# it is the learning-rate protocol, TensorFlow-free, shared by the trainer's planner and the cells.
ALLOWED = {
    "schema": set(),
    "store": {"schema"},
    "checks": {"schema", "store"},
    "engine": {"schema", "store"},
    "study": {"schema", "store", "checks", "engine", "tf_start"},
    "analysis": {"schema", "store", "checks", "study.lr_grid"},
    "report": {"schema", "store", "checks", "study.lr_grid", "analysis", "tf_start"},
    "theory": {"schema", "store", "engine"},
    # A study on a Ray cluster: the driver and the hosts' actor, over the study's own loop.
    "cluster": {"schema", "store", "checks", "engine", "study", "tf_start"},
    "tools": {"schema", "store", "checks", "engine", "study", "analysis", "report", "theory"},
    # errors.py turns any exception into one line by its base (schema/problems.py), which every
    # layer's errors subclass: it needs the lowest layer only. Only the entry points import it.
    "errors": {"schema"},
    "tf_start": {"schema"},  # TensorFlow's quiet import reads the GPU probe
    # The launcher runs on a workstation: the slice table is schema's; the rest of the package
    # it reaches only through `python -m wide_tf.main` (a process), never by import.
    "launch": {"schema"},
}
# The package's entry points sit on top like main: a worker of --workers=N ends in one `error:`
# line as main does (errors.py), and runs no main.
# What the launcher runs on a TPU VM (wide_tf/launch/vm) is an entry point there too.
ENTRY_POINTS = (
    "wide_tf.main",
    "wide_tf.study.worker",
    "wide_tf.launch.vm.check",
    "wide_tf.launch.vm.jax_check",
)
# Layers that must run without TensorFlow: the checks before a run, the planner, the analysis,
# and what the parent of --workers=N supervises with (the workdir, the trials, the progress).
TF_FREE = (
    "schema",
    "checks",
    "analysis",
    "study.lr_grid",
    "store",
    "study.trials",
    "study.progress",
    "study.workers",
    "study.worker",
    "study.processes",
    "engine.preemption",
    "launch",
    "cluster.ray_study",
)


def _module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
    """The wide_tf modules a file imports (absolute names), at any depth of the file."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:  # `from x import y`: y is a module of x, or a name in x
                sub = f"{base}.{a.name}"
                found.add(sub if _is_module(sub, root) else base)
    return {m for m in found if m == "wide_tf" or m.startswith("wide_tf.")}


def _is_module(name: str, root: pathlib.Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _layer(module: str) -> str:
    """A module's layer: the package under wide_tf, or the top-level module's name."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def _allowed(src: str, dst: str) -> bool:
    """Whether module `src` may import module `dst`."""
    a, b = _layer(src), _layer(dst)
    if dst == "wide_tf" or a == b or src in ENTRY_POINTS:
        return True
    rules = ALLOWED.get(a)
    if rules is None:  # a new top-level module: only main may import it, and it imports nothing
        return False
    sub = ".".join(dst.split(".")[1:3])
    return b in rules or sub in rules


def violations(root: pathlib.Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        src = _module_name(path, root.parent)
        for dst in sorted(_imports(path, root.parent)):
            if not _allowed(src, dst):
                out.append(f"{src} imports {dst}")
    return out


def test_every_import_follows_the_layer_rules():
    assert violations() == []


# The engine's backend folders (docs/layout.md): the shared driver imports neither (the registry,
# engine/backend.py, finds a backend by name with importlib at run time), a backend folder does
# not import the other, and host arrays come from engine/arrays.py, the one reader of sources.py.
BACKEND_FOLDERS = ("wide_tf.engine.tf", "wide_tf.engine.jax")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def engine_violations(root: pathlib.Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        src = _module_name(path, root.parent)
        for dst in sorted(_imports(path, root.parent)):
            home = next((f for f in BACKEND_FOLDERS if _in(src, f)), None)
            for folder in BACKEND_FOLDERS:
                if _in(dst, folder) and home != folder and _in(src, "wide_tf.engine"):
                    out.append(f"{src} imports {dst} (a backend folder)")
            if dst == "wide_tf.engine.sources" and src != "wide_tf.engine.arrays":
                out.append(f"{src} imports {dst} (only engine.arrays reads sources)")
    return out


def test_the_shared_engine_imports_no_backend_folder_and_only_arrays_reads_sources():
    assert engine_violations() == []


def test_a_planted_backend_import_and_a_planted_sources_reader_are_caught(tmp_path):
    pkg = tmp_path / "wide_tf"
    for sub in ("engine/tf", "engine/jax"):
        (pkg / sub).mkdir(parents=True)
    for p in (pkg, pkg / "engine", pkg / "engine" / "tf", pkg / "engine" / "jax"):
        (p / "__init__.py").write_text("")
    (pkg / "engine" / "sources.py").write_text("")
    (pkg / "engine" / "arrays.py").write_text("from wide_tf.engine import sources\n")
    (pkg / "engine" / "loop.py").write_text("from wide_tf.engine.tf import run\n")
    (pkg / "engine" / "tf" / "run.py").write_text("from wide_tf.engine.jax import data\n")
    (pkg / "engine" / "jax" / "data.py").write_text("from wide_tf.engine import sources\n")
    assert engine_violations(pkg) == [
        "wide_tf.engine.jax.data imports wide_tf.engine.sources (only engine.arrays reads sources)",
        "wide_tf.engine.loop imports wide_tf.engine.tf.run (a backend folder)",
        "wide_tf.engine.tf.run imports wide_tf.engine.jax.data (a backend folder)",
    ]


def test_a_planted_upward_import_is_caught(tmp_path):
    # A copy of two modules, one of which reaches up a layer: the rule must see it.
    pkg = tmp_path / "wide_tf"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "schema").mkdir()
    for p in (pkg, pkg / "engine", pkg / "schema"):
        (p / "__init__.py").write_text("")
    (pkg / "schema" / "plan.py").write_text("from wide_tf.engine import train\n")
    (pkg / "engine" / "train.py").write_text("from wide_tf.study import scheduler\n")
    (pkg / "study").mkdir()
    (pkg / "study" / "__init__.py").write_text("")
    (pkg / "study" / "scheduler.py").write_text("from wide_tf.schema import plan\n")
    assert violations(pkg) == [
        "wide_tf.engine.train imports wide_tf.study.scheduler",
        "wide_tf.schema.plan imports wide_tf.engine.train",
    ]


def _graph() -> dict[str, set[str]]:
    mods = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for d in _imports(path):
            # `from wide_tf.x import y`: y may be a module or a name in x
            target = d if d in mods else d.rpartition(".")[0]
            if target in mods and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    return graph


def test_no_import_cycle():
    graph, state, cycle = _graph(), {}, []

    def visit(u, path):
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1 and not cycle:
                cycle.extend(path[path.index(v) :] + [v])
            elif not state.get(v):
                visit(v, path + [v])
        state[u] = 2

    for u in sorted(graph):
        if not state.get(u):
            visit(u, [u])
    assert cycle == []


@pytest.mark.parametrize("module", TF_FREE)
def test_the_tensorflow_free_layers_never_load_tensorflow(module):
    names = [
        _module_name(p)
        for p in sorted((PACKAGE / module.replace(".", "/")).parent.rglob("*.py"))
        if _module_name(p) == f"wide_tf.{module}"
        or _module_name(p).startswith(f"wide_tf.{module}.")
    ] or [f"wide_tf.{module}"]
    code = (
        "import importlib, sys\n"
        f"for m in {names!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"{names} loaded {out.stdout.strip()}"


def _sizes():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        lines = len(path.read_text().splitlines())
        yield path, tree, lines


def test_one_job_per_module_no_module_over_600_lines_main_at_most_200():
    big = [f"{p.relative_to(ROOT)} ({n})" for p, _, n in _sizes() if n > 600]
    assert big == []
    assert len((PACKAGE / "main.py").read_text().splitlines()) <= 200


def test_no_function_over_60_lines_no_class_over_250():
    long = []
    for path, tree, _ in _sizes():
        for x in ast.walk(tree):
            n = getattr(x, "end_lineno", 0) - getattr(x, "lineno", 0) + 1
            if isinstance(x, ast.FunctionDef | ast.AsyncFunctionDef) and n > 60:
                long.append(f"{path.relative_to(ROOT)}:{x.name} ({n})")
            if isinstance(x, ast.ClassDef) and n > 250:
                long.append(f"{path.relative_to(ROOT)}:{x.name} ({n})")
    assert long == []
