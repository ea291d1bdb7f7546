"""Owns what a launch does on this machine: the config checked with the VM's own flags for the
slice's replica count (`python -m wide_tf.main --dry_run`, no TensorFlow, no VM), the study's
groups counted, the checkout's archive, the kept spot choice."""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile

from wide_tf.launch.gcloud import TIMED_OUT, call
from wide_tf.launch.options import PROG, Stop, failed

CHECK_S = 600  # the checks here read the config and count its groups: seconds, not minutes

# The study's (member, batch size) groups, from the config and the VM's flags (no TensorFlow).
GROUPS_PY = """import sys
from absl import flags
from ml_collections import config_flags
config = config_flags.DEFINE_config_file("config")
flags.FLAGS(sys.argv, known_only=True)
from wide_tf.study.trials import group_trials, list_trials
print(len(group_trials(list_trials(config.value))))
"""


class Here:
    """Runs wide_tf on this machine, from this checkout, with the interpreter PYTHON names, through
    `execute` (gcloud.call's signature: the launcher's own runner of commands)."""

    def __init__(self, repo: pathlib.Path, env, note, execute=call):
        self.repo, self.env, self.note, self.execute = repo, env, note, execute
        self.python = env.get("PYTHON") or "python3"

    def run(self, args: list[str], extra_env=None) -> tuple[int, str]:
        path = str(self.repo) + (
            os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else ""
        )
        env = {**self.env, "PYTHONPATH": path, **(extra_env or {})}
        try:
            code, out, err = self.execute([self.python, *args], CHECK_S, True, env, cwd=self.repo)
        except OSError as e:
            return 127, str(e)
        if code == TIMED_OUT:
            raise failed(
                f"the config's check on this machine ({self.python} running wide_tf) did not "
                f"finish in {CHECK_S}s and was stopped; --no_validate skips it"
            )
        return code, out + err

    def usable(self) -> None:
        """Called when the check could not start: whether PYTHON has what it needs."""
        code, _ = self.run(["-c", "import absl, ml_collections"])
        if code:
            raise failed(
                f"cannot check the config on this machine: '{self.python}' lacks absl-py and "
                "ml-collections; pip install -e . here (TensorFlow is not needed for the check), "
                "point PYTHON= at a Python that has them, or skip the check with --no_validate"
            )

    def dry_run(self, what: str, flags: list[str], slice_, prefix: str, extra_env) -> None:
        """`wide_tf.main FLAGS --dry_run --replicas=N --accelerator=FAMILY`: refused here as one
        line (exit 2 for a config that cannot run there, 1 for anything else), or its notes."""
        args = ["-m", "wide_tf.main", *flags, "--dry_run", f"--replicas={slice_.replicas}"]
        code, out = self.run([*args, f"--accelerator={slice_.family}"], extra_env)
        lines = out.splitlines()
        if code and ("No module named" in out or code == 127 or not out.strip()):
            self.usable()
        if code:
            said = [x for x in lines if x.startswith(("error: ", "memory: "))]
            line = (said[-1] if said else (lines[-1] if lines else "")).removeprefix("error: ")
            raise Stop(
                2 if code in (2, 3) else 1,
                f"{PROG}: error: {what} on {slice_.name} ({slice_.replicas} replicas): {line}",
            )
        for x in lines:
            if x.startswith(("dry run: ", "memory: ")):
                self.note(f"{prefix}: {x}")

    def groups(self, flags: list[str]) -> int | None:
        code, out = self.run(["-c", GROUPS_PY, "wide_tf", *flags])
        last = out.strip().splitlines()[-1:] or [""]
        return int(last[0]) if code == 0 and last[0].isdigit() else None


def tracked(repo: pathlib.Path, path: str) -> bool:
    p = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "--error-unmatch", "--", path],
        capture_output=True,
    )
    return p.returncode == 0


def make_archive(repo: pathlib.Path, folder: str, untracked: str = "") -> str:
    """The checkout's tracked files as they are in the working tree (no .venv, no runs/), and
    the config file when git does not track it, as FOLDER/wide_tf.tar.gz (git and tar, each an
    argument list; the names travel NUL-separated on stdin)."""
    names = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    names = b"\0".join(n for n in names.split(b"\0") if n and os.path.lexists(repo / n.decode()))
    if untracked:
        names += b"\0" + untracked.encode()
    path = os.path.join(folder, "wide_tf.tar.gz")
    subprocess.run(
        ["tar", "--null", "-T", "-", "-czf", path], input=names, cwd=repo, check=True,
        capture_output=True,
    )  # fmt: skip
    return path


class SpotMemory:
    """The spot choice per project, zone and name (one line: 1 spot, 0 not), kept on this machine:
    Google deletes a preempted spot node, after which `describe` no longer says it was spot."""

    def __init__(self, env, project: str, zone: str):
        base = env.get("WIDE_TF_STATE_DIR") or os.path.join(
            env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or "/tmp", ".local/state"),
            "wide_tf",
        )
        self.base, self.prefix = base, f"spot-{project or 'default'}-{zone}-"

    def path(self, name: str) -> str:
        return os.path.join(self.base, self.prefix + name)

    def remember(self, name: str, spot: bool) -> None:
        try:  # best effort: a read-only home only loses the note
            os.makedirs(self.base, exist_ok=True)
            with open(self.path(name), "w") as f:
                f.write("1\n" if spot else "0\n")
        except OSError:
            pass

    def recall(self, name: str) -> bool:
        try:
            with open(self.path(name)) as f:
                return f.read().strip() == "1"
        except OSError:
            return False


def temp_folder(env) -> str:
    return tempfile.mkdtemp(prefix="wide_tf_checkout.", dir=env.get("TMPDIR") or None)
