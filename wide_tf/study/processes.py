"""Owns which processes a study runs in, and the order in which it starts: `run`, the one call for
a study once main's checks have passed. The workdir's study is opened once (config.json compared,
or written: trials.check_workdir), before TensorFlow and before any worker; then either this
process starts N workers (wide_tf/study/worker.py) and only supervises them, without TensorFlow
(wide_tf/study/workers.py), or it runs every trial itself (wide_tf/study/scheduler.py's loop,
which each worker runs too). The workers read the config this process checked and check nothing
again: each check runs once per process. The report is main's to write, when the `Outcome` says
it is due."""

from __future__ import annotations

from wide_tf import tf_start
from wide_tf.engine import backend
from wide_tf.study import progress, trials, workers


def run(
    config,
    workdir: str,
    *,
    n_workers: str | None = None,
    shard: str | None = None,
    trial: str | None = None,
    verbose: bool = False,
    log=print,
    on_complete=None,
) -> workers.Outcome:
    """Runs the study `config` (checked by the caller) in `workdir`: in `n_workers` processes
    (--workers: a count, or None for the machine's default; one for `trial`), this shard's groups
    (`shard`, i/n), or the one trial `trial` names. Returns a `workers.Outcome`; `on_complete()`
    runs once, in its own thread, when the study's end is near (workers.supervise says when:
    main imports TensorFlow for the report there). SIGTERM: a worker checkpoints and the study
    exits 143 (one process: `preemption.Preempted` reaches the caller)."""
    n = workers.count_for(config, n_workers, one_process=trial is not None)
    trials.check_workdir(config, workdir)  # the "same study" check: once, before anything starts
    progress.keep_log(workdir)  # this command's own log, beside the workers' (once it may write)
    # KERAS_BACKEND before Keras is imported: this process's trials or report, and its workers'.
    backend.select(config)
    if n > 1:
        started = workers.start(config, workdir, n, shard, verbose)
        return workers.supervise(started, config, workdir, shard, log, on_complete)
    if backend.of(config) == "tensorflow":  # the JAX backend runs without TensorFlow
        tf_start.import_tensorflow(verbose)
    from wide_tf.engine import preemption
    from wide_tf.study import scheduler

    preemption.install()  # SIGTERM -> checkpoint after the current host loop, exit 143
    scheduler.run_study(config, workdir, shard=shard, only_trial=trial)
    return workers.Outcome(report_due=True)  # also a shard's or one trial's: the study so far
