"""Owns the before/after study timing: one study run on an older commit (checked out into a
temporary git worktree) and then on this checkout, one after the other on the same machine, each
with `time`'s wall and CPU seconds, and each workdir's verdict line.

  python -m tools.bench.study_pair --old=f8423f1 --config=configs/mlp.py:local

Both runs start from empty workdirs (under --root, default a new temporary folder), use the same
Python, and are never run in parallel. The verdicts are read from each workdir's
report/verdict.txt (the line the study prints last)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_study(code_dir: str, config: str, workdir: str, extra: list[str]) -> dict:
    """One study in a child process with `code_dir` first on the path; its wall and CPU seconds."""
    env = dict(os.environ, PYTHONPATH=code_dir)
    cmd = [sys.executable, "-m", "wide_tf.main", f"--config={config}", f"--workdir={workdir}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd + extra, cwd=code_dir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    verdict_path = os.path.join(workdir, "report", "verdict.txt")
    verdict = open(verdict_path).read().strip() if os.path.exists(verdict_path) else ""
    return {
        "code": code_dir,
        "returncode": proc.returncode,
        "wall_s": round(wall, 1),
        "user_s": round(after.ru_utime - before.ru_utime, 1),
        "sys_s": round(after.ru_stime - before.ru_stime, 1),
        "verdict": verdict,
        "stderr_tail": proc.stderr[-2000:] if proc.returncode else "",
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.study_pair",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--old", required=True, help="the commit to compare against (any git rev)")
    p.add_argument("--config", default="configs/mlp.py:local")
    p.add_argument("--root", default="", help="where the worktree and workdirs go")
    p.add_argument("--json", default="", help="also write the two rows here")
    a, extra = p.parse_known_args(argv)
    root = a.root or tempfile.mkdtemp(prefix="study_pair_")
    old_code = os.path.join(root, "old_code")
    if not os.path.isdir(old_code):
        made = subprocess.run(
            ["git", "-C", REPO, "worktree", "add", "--detach", old_code, a.old],
            capture_output=True,
            text=True,
        )
        if made.returncode:
            print(f"error: cannot check out --old={a.old}: {made.stderr.strip()}", file=sys.stderr)
            return 2
    rows = []
    for name, code in (("old", old_code), ("new", REPO)):
        workdir = os.path.join(root, f"workdir_{name}")
        if os.path.exists(workdir):
            print(f"error: {workdir} exists; give an empty --root", file=sys.stderr)
            return 2
        row = dict(_run_study(code, a.config, workdir, extra), name=name)
        rows.append(row)
        print(json.dumps(row), flush=True)
    old, new = rows
    if old["returncode"] == 0 and new["returncode"] == 0:
        print(f"wall old/new: {old['wall_s'] / new['wall_s']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
