"""Owns a worker process of `--workers=N` from its first instruction to its exit status, and the
two things its parent hands it: the environment a config asks for (`environment`, the one place
that maps a config to a child's variables) and the one "die with the parent" (`die_with_parent`,
also run first by a suite's study, wide_tf/main.py).

    python -m wide_tf.study.worker --config_json=PATH --workdir=W [--shard=i/n] [--verbose]

The parent (wide_tf/study/workers.py) checked the command and the workdir once and wrote the
checked config to PATH; a worker reads it and runs no check again: no config file, no overrides,
no flags of main. Its cores, GPU and run id come in WIDE_TF_WORKER (`WorkerSpec`). In order: die
with the parent (before anything else is imported: a parent killed, even by SIGKILL, at any moment
after a worker's start leaves no worker behind), the config's environment (KERAS_BACKEND before
anything imports Keras), its cores and threads, TensorFlow's quiet import, SIGTERM -> checkpoint,
then study/scheduler.py's loop until no group is left. Any error is one `error:` line (its log
file's last one, which the parent quotes); SIGTERM exits 143 after a checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time

from wide_tf.engine import backend  # os and sys only: nothing of Keras or TensorFlow

PARENT_ENV = "WIDE_TF_PARENT_PID"
ENV = "WIDE_TF_WORKER"  # the worker's WorkerSpec, as JSON


def die_with_parent(parent: str | None, grace_s: float | None = None) -> None:
    """Two death signals from the parent (`parent`: the pid it wrote in PARENT_ENV): SIGTERM the
    moment it dies (PR_SET_PDEATHSIG: the worker checkpoints after its current host loop, as on a
    preemption), and a final one: a watchdog thread that sees the parent gone (this process
    re-parented) and, `grace_s` later, ends the process with os._exit. The SIGTERM only sets a
    flag, which a worker blocked in a read that never returns (a FIFO, a hung NFS or bucket read)
    never looks at again; the watchdog runs while the main thread is blocked. Exits now when the
    parent is already gone."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG = 1, SIGTERM = 15
    except (OSError, AttributeError):  # not Linux: the parent's cleanup still stops workers
        pass
    if not (parent and parent.isdigit()):
        return
    if os.getppid() != int(parent):
        # The parent died before the signal was set: this worker was re-parented.
        sys.exit(143)
    grace = ORPHAN_GRACE_S if grace_s is None else grace_s
    threading.Thread(
        target=_watch_parent, args=(int(parent), grace), name="parent-watchdog", daemon=True
    ).start()


# After the parent is gone, the time a worker has to finish its SIGTERM checkpoint and exit by
# itself; then the watchdog ends it. A checkpoint is written after the current host loop, which
# lasts seconds (the loop's cadence); a trial cut here resumes from its previous checkpoint.
ORPHAN_GRACE_S = 20.0
WATCH_S = 0.5  # how often the watchdog looks at the parent


def _watch_parent(parent: int, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    time.sleep(grace_s)
    with contextlib.suppress(OSError):
        os.write(
            2,
            f"error: the study's process (pid {parent}) is gone and this worker did not stop "
            f"within {grace_s:.0f} s of its SIGTERM (blocked, e.g. in a read): it exits now; its "
            f"trial resumes from its last checkpoint when the study runs again\n".encode(),
        )
    os._exit(143)


def environment(config) -> dict[str, str]:
    """The environment variables a worker running `config` needs before anything imports Keras
    (a ConfigDict or the plain dict of a frozen config): KERAS_BACKEND, runtime.backend as
    engine/backend.py reads it ('tensorflow' for a config without the field). The parent passes
    them to every worker; the worker (and main, for its own run) sets them with
    `backend.select` before its first import of Keras."""
    return {"KERAS_BACKEND": backend.of(config)}


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """One worker's share of the machine, chosen by its parent (workers.plan)."""

    index: int
    count: int
    run_id: str
    cpus: tuple[int, ...]
    gpu: int | str | None  # an index or a UUID, as CUDA_VISIBLE_DEVICES names it

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_env(text: str) -> WorkerSpec:
        d = json.loads(text)
        return WorkerSpec(d["index"], d["count"], d["run_id"], tuple(d["cpus"]), d["gpu"])


def pin_before_tensorflow(spec: WorkerSpec) -> None:
    """Before TensorFlow is imported: the worker's cores, its GPU, its thread counts."""
    if spec.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec.cpus)
    threads = str(max(1, len(spec.cpus)))
    os.environ["OMP_NUM_THREADS"] = threads
    os.environ["TF_NUM_INTRAOP_THREADS"] = threads
    os.environ["TF_NUM_INTEROP_THREADS"] = threads
    if spec.gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(spec.gpu)


def set_tensorflow_threads(spec: WorkerSpec) -> None:
    """Right after TensorFlow's import and before its first op."""
    import tensorflow as tf

    threads = max(1, len(spec.cpus))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # already initialised (a test importing it first): the env vars hold
        pass


def command(config_json: str, workdir: str, shard: str | None, verbose: bool) -> list[str]:
    """The command line that starts a worker (the parent's side of `_arguments`)."""
    cmd = [sys.executable, "-m", "wide_tf.study.worker", f"--config_json={config_json}"]
    cmd.append(f"--workdir={workdir}")
    return cmd + ([f"--shard={shard}"] if shard else []) + (["--verbose"] if verbose else [])


def _arguments(argv: list[str]) -> dict:
    """The flags `command` writes, nothing else (the parent wrote them: no user types them)."""
    given = {"config_json": None, "workdir": None, "shard": None, "verbose": False}
    for a in argv:
        name, eq, value = a.removeprefix("--").partition("=")
        if name not in given or not a.startswith("--") or (name == "verbose") == bool(eq):
            sys.exit(
                f"error: wide_tf.study.worker: unexpected argument {a!r}; a worker is started "
                "by its parent (python -m wide_tf.main --workers=N), not by hand"
            )
        given[name] = value if eq else True
    if not given["config_json"] or not given["workdir"]:
        sys.exit("error: wide_tf.study.worker needs --config_json and --workdir (its parent's)")
    return given


def _tuples(x):
    """A frozen config's lists back as the tuples the schema's list fields hold."""
    if isinstance(x, dict):
        return {k: _tuples(v) for k, v in x.items()}
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def thaw(frozen: dict):
    """The checked config the parent wrote (workers.freeze_config, read as JSON) as the
    ConfigDict it was: the same values and types."""
    import ml_collections

    return ml_collections.ConfigDict(_tuples(frozen))


def main(argv: list[str]) -> None:
    die_with_parent(os.environ.get(PARENT_ENV))
    from wide_tf.store import workdir as wd  # after the death signals are set

    args = _arguments(argv)
    try:
        frozen = wd.read_json(args["config_json"])
        spec = WorkerSpec.from_env(os.environ[ENV])
    except (OSError, ValueError, KeyError) as e:
        sys.exit(
            f"error: wide_tf.study.worker: no config or worker spec from its parent "
            f"({type(e).__name__}: {e}); run the study with python -m wide_tf.main"
        )
    backend.select(frozen)  # KERAS_BACKEND, before anything imports Keras
    pin_before_tensorflow(spec)
    from absl import flags, logging

    from wide_tf import errors, tf_start
    from wide_tf.engine import preemption

    flags.FLAGS(sys.argv[:1])  # absl's defaults and its log format, as under main's app.run
    logging.use_absl_handler()
    logging.set_verbosity(logging.INFO)  # (app.run's default verbosity: INFO lines shown)
    config = thaw(frozen)
    try:
        if backend.of(config) == "tensorflow":  # the JAX backend runs without TensorFlow
            tf_start.import_tensorflow(args["verbose"])
            set_tensorflow_threads(spec)
        logging.get_absl_handler().addFilter(tf_start.DropCheckpointChatter())
        preemption.install()  # SIGTERM -> checkpoint after the current host loop, exit 143
        from wide_tf.study import scheduler

        scheduler.run_worker(config, args["workdir"], spec.run_id, shard=args["shard"])
    except preemption.Preempted as e:
        logging.warning("%s", e)
        sys.exit(preemption.EXIT_CODE)
    except (Exception, KeyboardInterrupt) as e:  # every error is one line unless --verbose
        if args["verbose"]:
            raise
        errors.fail(*errors.error_line(e, config))
    exit_now()


def exit_now() -> None:
    """Ends a worker whose groups are all done, at once: every result, log line and checkpoint
    is written and every claim released by then, and the interpreter's teardown with TensorFlow
    loaded (its kept functions, thread pools and module finalisers) writes nothing a study reads
    but takes seconds (4-10 s after a local study's last trial), which the parent waits out
    before its report."""
    from absl import logging

    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
