"""Runs the launcher against the fake `gcloud` of tests/fake_gcloud.py. In this process
(`make_fake`, `run_launcher`): wide_tf.launch.command.main with an Outside whose commands are
answered here (gcloud by the fake, the checks here by wide_tf.main in this process, anything else
run for real), whose waits between polls are recorded and not taken, and whose checkout archive is
a stand-in unless the test opens it. As a process (`fake_env`, with GCLOUD_SCRIPT on PATH): the
Ctrl-C and SIGTERM cases and one full launch through launch_tpu.sh. Helpers name the calls."""

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import sys
import tarfile
import warnings

import fake_gcloud
from helpers import REPO

from wide_tf.launch import command as cli
from wide_tf.launch import gcloud, local

SCRIPT = REPO / "launch_tpu.sh"
REQUIRED = ["--name=wide-v4", "--config=configs/wrn.py", "--workdir=gs://bucket/wrn"]
# A launch onto a missing VM: look it up, create it, copy the checkout and install on every worker,
# start on worker 0, check that the run is alive.
FRESH_LAUNCH = [
    ("describe", None),
    ("create", None),
    ("scp", "--worker=all"),
    ("install", "--worker=all"),
    ("start", "--worker=0"),
    ("check", "--worker=0"),
]

# The fake as a script on PATH, for launchers run as processes: the standard library alone.
GCLOUD_SCRIPT = f"""#!{sys.executable} -SE
import sys
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
import fake_gcloud
sys.exit(fake_gcloud.main())
"""

# The launcher checks the config with `python -m wide_tf.main --dry_run` (no TensorFlow): this
# interpreter has the package's requirements. A launcher run as a process waits for nothing between
# polls; in this process the waits keep the launcher's defaults and are recorded instead.
BASE_ENV = {"PYTHON": sys.executable}
PROCESS_ENV = {**BASE_ENV, "WIDE_TF_POLL_S": "0", "WIDE_TF_ALIVE_WAIT_S": "0"}


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    waits: list[float] = dataclasses.field(default_factory=list)  # seconds, in order
    stopped: list[float] = dataclasses.field(default_factory=list)  # the limits of hung steps


def stand_in_archive(repo, folder, untracked=""):
    """An empty .tar.gz where the checkout's would be: tarring and compressing the checkout
    (local.make_archive) is most of a launch's time here, and only the tests that open the
    archive need it."""
    path = os.path.join(folder, "wide_tf.tar.gz")
    with tarfile.open(path, "w:gz"):
        pass
    return path


class InProcess:
    """The launcher's Outside in this process; `waits` and `stopped` record what it asked for."""

    def __init__(self, archive=None):
        self.waits: list[float] = []
        self.stopped: list[float] = []
        self.outside = cli.Outside(
            execute=self.execute, sleep=self.waits.append, archive=archive or stand_in_archive
        )

    def execute(self, cmd, limit, capture=False, env=None, grace=gcloud.GRACE_S, cwd=None):
        env = os.environ if env is None else env
        if cmd[0] == "gcloud":
            code, out, err, hangs = fake_gcloud.answer(cmd[1:], env["FAKE_DIR"], env)
            if hangs:
                # what gcloud.call returns once a step is past its limit and stopped
                assert limit is not None, f"a step with no limit hangs the launcher: {cmd}"
                self.stopped.append(limit)
                return gcloud.TIMED_OUT, "", ""
            if not capture:  # a child's own output: on this process's, as from a child
                sys.stdout.write(out)
                sys.stderr.write(err)
                out = err = ""
            return code, out, err
        if cmd[0] == sys.executable and cmd[1:3] == ["-m", "wide_tf.main"]:
            return main_here(cmd[3:], env, cwd)
        if cmd[0] == sys.executable and cmd[1:3] == ["-c", local.GROUPS_PY]:
            return groups_here(cmd[4:], env, cwd)
        return gcloud.call(cmd, limit, capture, env, grace, cwd)


@contextlib.contextmanager
def _as_its_own_process(argv, env, cwd):
    """wide_tf.main's command line, environment and folder for the block, its output captured;
    then this process's back, and the flags unparsed (ml_collections defines a flag per override
    as it parses one: the next command must not find them defined)."""
    from absl import flags

    from wide_tf import main

    saved = sys.argv, dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    sys.argv = argv
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        # A process shows no DeprecationWarning from the libraries it imports (Python's default
        # filters); ml_collections' loading of a config file raises one under pytest's.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                yield out, err
    finally:
        sys.argv = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
        os.chdir(saved[2])
        flags.FLAGS.unparse_flags()
        for name in [f for f in flags.FLAGS if f.startswith(f"{main._CONFIG.name}.")]:
            delattr(flags.FLAGS, name)


def main_here(args, env, cwd=REPO):
    """`python -m wide_tf.main ARGS --dry_run` in this process: (exit status, stdout, stderr)."""
    from wide_tf import main

    assert "--dry_run" in args, args  # the checks here run nothing
    argv = ["wide_tf.main", *args]
    code = 0
    with _as_its_own_process(argv, env, cwd) as (out, err):
        try:
            main.main(main._parse_flags(argv))
        except SystemExit as e:  # as the interpreter ends on it
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
            if isinstance(e.code, str):
                print(e.code, file=err)
    return code, out.getvalue(), err.getvalue()


def groups_here(args, env, cwd):
    """local.GROUPS_PY in this process: the study's group count from the same flags."""
    from wide_tf import main
    from wide_tf.study.trials import group_trials, list_trials

    argv = ["wide_tf.main", *args]
    with _as_its_own_process(argv, env, cwd) as (out, err):
        try:
            main._parse_flags(argv)
            print(len(group_trials(list_trials(main._CONFIG.value))))
        except SystemExit as e:
            return int(e.code or 1), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def run_launcher(*args, env, archive=None) -> Result:
    """`python -m wide_tf.launch ARGS` in this process (see InProcess), its output captured."""
    here = InProcess(archive)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), env=env, out=out, err=err, outside=here.outside)
    return Result(code, out.getvalue(), err.getvalue(), here.waits, here.stopped)


def _launch(*args, env=None):
    """--dry_run and argument errors: no gcloud on PATH at all (they must not call it), unless
    `env` says otherwise."""
    return run_launcher(*args, env=env or {"PATH": "/usr/bin:/bin", **BASE_ENV})


def make_fake(tmp_path):
    """The `fake` fixture of the launcher's tests: runs the launcher in this process with the fake
    gcloud and returns (result, the recorded calls), each call without 'compute tpus tpu-vm'
    (queued-resources calls as 'qr-VERB ...'). The fake is also written to tmp_path/bin/gcloud:
    the launcher looks for it on PATH, and a launcher run as a process calls it there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(GCLOUD_SCRIPT)
    (bin_dir / "gcloud").chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def launch(
        *args,
        state="",
        running=False,
        spot=False,
        queued=False,
        request=None,
        states=(),
        checks=(),
        env=None,
        validate=False,
        archive=None,
    ):
        # The config check here only where a test is about it (fake.validated): the gcloud calls
        # do not depend on it.
        if not validate and "--no_validate" not in args:
            args = ("--no_validate", *args)
        log.write_text("")
        vm = {"state": state, "spot": spot, "queued": queued, "started": running}
        for old in [*tmp_path.glob("vm-*.json"), *tmp_path.glob("qr-*.json")]:
            old.unlink()
        (tmp_path / "vm-wide-v4.json").write_text(json.dumps(vm))
        if request or (queued and state):  # a request of that name (a queued VM has one)
            (tmp_path / "qr-wide-v4.json").write_text(json.dumps({"state": request or "ACTIVE"}))
        (tmp_path / "states").write_text(json.dumps(list(states)))
        (tmp_path / "checks").write_text(json.dumps(list(checks)))
        p = run_launcher(*args, env=fake_env(tmp_path, env, process=False), archive=archive)
        return p, calls_of(log)

    def validated(*args, **kwargs):
        return launch(*args, validate=True, **kwargs)

    launch.tmp_path = tmp_path
    launch.validated = validated
    return launch


def fake_env(tmp_path, extra=None, process=True) -> dict:
    """The environment of a launcher against the fake on tmp_path/bin; one run as a process takes
    no time between polls, one in this process waits the defaults (recorded: Result.waits)."""
    return {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "FAKE_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "WIDE_TF_STATE_DIR": str(tmp_path / "state"),
        **(PROCESS_ENV if process else BASE_ENV),
        **(extra or {}),
    }


def calls_of(log) -> list[list[str]]:
    calls = []
    for line in log.read_text().splitlines():
        c = json.loads(line)
        assert c[:2] == ["compute", "tpus"] and c[2] in ("tpu-vm", "queued-resources"), c
        calls.append(c[3:] if c[2] == "tpu-vm" else ["qr-" + c[3], *c[4:]])
    return calls


def _verbs(calls):
    """(verb, --worker=...) of every call; the run check is 'check', --check's is 'tpucheck',
    Ray's start 'ray'."""
    out = []
    for c in calls:
        verb = c[0]
        if verb == "ssh":
            cmd = _command(c)
            verb = fake_gcloud.ssh_step(cmd) or ("ray" if "/bin/ray start" in cmd else "tail")
        worker = next((a for a in c if a.startswith("--worker=")), None)
        out.append((verb, worker))
    return out


def _command(call):
    return next(a for a in call if a.startswith("--command="))
