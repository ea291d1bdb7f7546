"""Owns what runs on a TPU VM, as the shell lines `gcloud ... ssh --command=` takes: the install
(vm_setup.sh), --check, the run's start under nohup, the run check the watch reads, the Ray
cluster's start; each line built from argument lists, every word quoted for the VM's shell."""

from __future__ import annotations

import pathlib
import re
import shlex
import tomllib

from wide_tf.launch import software
from wide_tf.launch.software import Software

# The files on each worker, in the ssh user's home folder ('~' is for the VM's shell to expand).
# One venv per backend: tensorflow-cpu over a tensorflow-tpu (both install the `tensorflow`
# package) would leave two TensorFlows in one folder.
CHECKOUT, ENV, LOGS = "~/wide_tf", "~/wide_tf_env.sh", "~/wide_tf_logs"
PID, EXIT = "~/wide_tf.pid", "~/wide_tf.exit"
RAY_PORT = 6379
_HOME_SAFE = re.compile(r"~/[-A-Za-z0-9_./]*")


def venv(sw: Software) -> str:
    return "~/wide_tf_venv_jax" if sw.jax else "~/wide_tf_venv"


def words(*args: str) -> str:
    """Shell words for the VM: each quoted, but a leading '~/' left for its shell to expand."""
    return " ".join(a if _HOME_SAFE.fullmatch(a) else shlex.quote(a) for a in args)


# "wide_tf: running PID idle S [waiting]" when the pid file names a live wide_tf.main process (S:
# seconds since its log last changed, the watchdog's measure; 'waiting' when its last line says it
# waits for groups held elsewhere), else "wide_tf: exited CODE" from the last run's exit file,
# else "wide_tf: no run active". POSIX sh: it runs on a VM that may not have the venv yet.
PID_CHECK = (
    f'p=$(cat {PID} 2>/dev/null || true); if [ -n "$p" ] && kill -0 "$p" 2>/dev/null && '
    f'grep -q wide_tf.main /proc/"$p"/cmdline 2>/dev/null; then m=$(stat -L -c %Y '
    f"{LOGS}/latest.log 2>/dev/null || date +%s); w=''; tail -n 1 {LOGS}/latest.log 2>/dev/null "
    "| grep -q 'No group free: waiting' && w=' waiting'; echo \"wide_tf: running $p idle "
    f'$(($(date +%s) - m))$w"; elif [ -s {EXIT} ]; then echo "wide_tf: exited $(cat {EXIT})"; '
    "else echo 'wide_tf: no run active'; fi"
)
STATUS = (
    f"{PID_CHECK}; echo '--- last lines of {LOGS}/latest.log:'; tail -n 5 {LOGS}/latest.log "
    "2>/dev/null || echo '(no log yet)'"
)
# The run's wrapper (argv: log, gs:// folder, command): runs it, copies the log to the workdir (the
# VM's disk goes with the VM), then writes the exit status the watch reads: 0 done, 143 preempted
# (wide_tf/engine/preemption.py), anything else failed. gcloud ships on TPU VM images; gsutil is
# the fallback.
RUNNER = (
    'log=$1; dest=$2; shift 2; "$@" > "$log" 2>&1 < /dev/null; code=$?; '
    '{ gcloud storage cp "$log" "$dest/" || gsutil -q cp "$log" "$dest/"; } >> "$log" 2>&1; '
    'echo "$code" > ~/wide_tf.exit; exit "$code"'
)


def package_requirements(repo: pathlib.Path) -> tuple[list[str], dict[str, list[str]]]:
    """pyproject.toml's dependencies and optional dependencies (the one home of the pins)."""
    with open(repo / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return list(project["dependencies"]), dict(project.get("optional-dependencies", {}))


def requirements(repo: pathlib.Path, sw: Software, ray: bool) -> list[str]:
    """The package's dependencies for the VM: less tensorflow and the tensorboard pin (the TPU
    build brings its own), or with TensorFlow's CPU wheel at the same pin under JAX (gs:// files,
    TensorBoard and TFDS need it; it never opens the TPU); plus cloud-tpu-client on a TensorFlow
    pod and the [ray] extra under --shards."""
    deps, extras = package_requirements(repo)
    out = []
    for r in deps:
        name = re.split(r"[=<>~!; \[]", r, maxsplit=1)[0]
        if sw.jax and name == "tensorflow":
            out.append("tensorflow-cpu" + r[len(name) :])
        elif sw.jax or name not in ("tensorflow", "tensorboard"):
            out.append(r)
    if sw.tf_pod:
        out += extras.get("tpu") or ["cloud-tpu-client>=0.10"]
    if ray:  # Ray's dashboard and autoscaler pieces ride on ray[default]
        out += [r.replace("ray", "ray[default]", 1) for r in extras.get("ray", [])] or [
            "ray[default]==2.60.*"
        ]
    return out


def install(repo: pathlib.Path, sw: Software, python: str, tpu_name: str, ray: bool) -> str:
    """On every worker: the checkout unpacked, then vm_setup.sh (a venv, one pip install of
    everything, this package, the environment file and a line of versions)."""
    v = venv(sw)
    if sw.jax:
        pip = [f"jax[tpu]=={software.JAX_TPU}", *requirements(repo, sw, ray)]
    else:
        pip = [f"tensorflow-tpu=={sw.tf_tpu}", f"libtpu=={sw.libtpu}"]
        pip += [*requirements(repo, sw, ray), "-f", software.LIBTPU_INDEX]
    setup = [f"--env={ENV}", f"--runtime={sw.runtime}", f"--stack={sw.stack}"]
    if sw.tf_pod:
        setup.append(f"--tpu={tpu_name}")
    if sw.jax and sw.multi_host:
        setup.append("--distributed")
    return (
        f"set -e; rm -rf {CHECKOUT}; mkdir -p {CHECKOUT}; tar -xzf /tmp/wide_tf.tar.gz -C "
        f"{CHECKOUT}; bash {words(f'{CHECKOUT}/vm_setup.sh', v, python, *pip, '--', *setup)}"
    )


def in_checkout(sw: Software, *steps: list[str]) -> str:
    """`steps` (argument lists) in the checkout with the environment file, joined by &&."""
    line = f"cd {CHECKOUT} && . {ENV}"
    for s in steps:
        line += " && " + words(*s)
    return line


def tpu_check(sw: Software, tpu_arg: str, check_flags, study_flags) -> str:
    """--check on the VM: the TPU as the run takes it (replicas, runtime, libtpu, memory), then
    the config's :check variant in a scratch folder, then the study stage (TensorFlow only)."""
    py = f"{venv(sw)}/bin/python"
    n = str(sw.slice.replicas)
    if sw.jax:
        steps = [[py, "-m", "wide_tf.launch.vm.jax_check", f"--replicas={n}"]]
    else:
        steps = [[py, "-m", "wide_tf.launch.vm.tpu_check", f"--tpu={tpu_arg}", f"--replicas={n}"]]
    if sw.jax and sw.multi_host:  # a sweep is refused over several processes: no :check study
        return in_checkout(sw, *steps)
    steps += [
        ["rm", "-rf", "/tmp/wide_tf_check"],
        [py, "-m", "wide_tf.main", *check_flags],
        ["echo", "wide_tf check: the :check run passed"],
    ]
    if not sw.jax:
        steps += [
            [py, "-m", "wide_tf.launch.vm.check", *study_flags],
            ["echo", "wide_tf check: the study stage passed"],
        ]
    return in_checkout(sw, *steps)


def start(sw: Software, stamp: str, dest: str, main_flags: list[str]) -> tuple[str, str]:
    """The run under nohup, its pid on file, one log per launch (latest.log points to it); returns
    (the line, the log's path). JAX on a multi-host slice: every worker logs, named by host."""
    log = f"{LOGS}/{stamp}.log"
    if sw.jax and sw.multi_host:
        log = f"{LOGS}/{stamp}-$(hostname).log"
    main = words(f"{venv(sw)}/bin/python", "-m", "wide_tf.main", *main_flags)
    # The braces: '&' would otherwise send the whole '&&' chain to a subshell, and $! would be
    # its pid. The log's name stays unquoted for $(hostname) to expand.
    line = (
        f"cd {CHECKOUT} && mkdir -p {LOGS} && rm -f {EXIT} && . {ENV} && ln -sfn {log} "
        f"{LOGS}/latest.log && {{ nohup bash -c {shlex.quote(RUNNER)} wide_tf_run {log} "
        f"{words(dest)} {main} > /dev/null 2>&1 < /dev/null & echo $! > {PID}; }}"
    )
    return line, log


def ray_start(sw: Software, head: str | None) -> str:
    """Ray on worker 0 of a VM: the head (head=None) or a node joining HEAD:6379; a Ray left from
    an earlier launch is stopped first."""
    ray = f"{venv(sw)}/bin/ray"
    join = ["--head", f"--port={RAY_PORT}"] if head is None else [f"--address={head}:{RAY_PORT}"]
    return f"cd {CHECKOUT} && . {ENV} && ({words(ray, 'stop', '--force')} || true) && " + words(
        ray, "start", *join
    )
