"""The code style is checked, not hoped for: `ruff check` (lint) and `ruff format --check` over the
package, its tests, configs, examples and the checkout's tools/, with the configuration in
pyproject.toml. CI runs the same two commands before the tests (.ci/run)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["wide_tf", "tests", "configs", "examples", "tools"]


def _ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    try:
        import ruff  # noqa: F401  (the [test] extra installs it)
    except ImportError:
        pytest.skip("ruff is not installed: pip install -e '.[test]'")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(args):
    proc = subprocess.run(
        _ruff() + args + TARGETS, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
