"""SIGTERM (what a preempted or stopped Cloud TPU VM, a spot GPU VM or `kill` sends) turns into a
checkpoint and a clean, non-zero exit instead of a lost trial.

`install()` (called by main) makes the first SIGTERM set a flag and return; the training loop
checks `requested()` after every host loop (a `tf.function` call of `train.steps_per_loop` steps),
saves its checkpoint and raises `Preempted`; main logs one line and exits with `EXIT_CODE` (143,
the shell's code for "terminated by SIGTERM"). Re-running the same command resumes: finished
trials are skipped and the interrupted one continues from that checkpoint. A second SIGTERM while
the first is being handled restores the default action and kills the process (a stuck save must
not keep a VM from shutting down).

Why not `tf.distribute.experimental.PreemptionCheckpointHandler`: it wraps each distributed step
in its own `run()` and saves through its own CheckpointManager at a step it agrees on with the
other workers through the coordination service; this loop runs many steps per `tf.function` call
and keeps host-side state (metric history, noise-scale averages) in the checkpoint, and the handler
needs a cluster resolver on CPU, so it could not be tested here. A flag checked between host loops
needs nothing from TensorFlow, is the same on TPU, GPU and CPU, and is tested on the CPU
(tests/engine/test_preemption.py). Its limit: with `runtime.strategy=multi_worker` every worker must
get the signal (a checkpoint save may run collectives); on a Cloud TPU, including a pod slice, one
client process drives the TPU, so that case does not arise there.

The grace period is short: Compute Engine allows 30 seconds between the soft-off signal and the
power-off for spot VMs (120 for standard ones; the Compute API's `Scheduling.skipGuestOsShutdown`
field, https://cloud.google.com/compute/docs/reference/rest/v1/instances). That TPU VMs get the
same grace period is an assumption: no TPU document checked here states it. A host loop plus a
save must fit, so keep `train.steps_per_loop` to a few seconds of work on preemptible machines.

Several hosts (a multi-host TPU slice under JAX, `runtime.strategy=multi_worker` under
TensorFlow) must stop at the same step: a host that saves and leaves while the others enter the
next step's collectives hangs them. So the loop does not act on its own flag but on the hosts'
agreement (`stop_agreed`): after every host loop each host contributes its flag to one tiny
all-reduce (the maximum), and every host sees the same answer at the same step, saves there and
stops. This is the step agreement that `tf.distribute.experimental.PreemptionCheckpointHandler`
makes through the coordination service
(https://www.tensorflow.org/api_docs/python/tf/distribute/experimental/PreemptionCheckpointHandler)
and that `jax.experimental.multihost_utils.reached_preemption_sync_point(step)` makes for Orbax's
CheckpointManager (https://orbax.readthedocs.io/en/latest/guides/checkpoint/preemption_checkpointing.html),
at this loop's granularity: the host loop, not one step, because a host loop is one compiled call
of `train.steps_per_loop` steps on every host alike. The collective is the backend's
(`jax_collective`: `multihost_utils.process_allgather`; `tf_collective`: the strategy's
all-reduce); one process alone needs none. Each host also asks JAX's own preemption service
(`reached_preemption_sync_point`) where jax.distributed started one, so a notice that JAX's
service caught counts too.

The notice itself: besides SIGTERM, on a Compute Engine VM (a TPU VM is one) the metadata server
says `TRUE` at `instance/preempted` when the VM is being preempted, and names an upcoming
maintenance event at `instance/maintenance-event` (`TERMINATE_ON_HOST_MAINTENANCE` when the VM
will be stopped; `MIGRATE_ON_HOST_MAINTENANCE` for a live migration, which needs no stop)
(https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice,
https://cloud.google.com/compute/docs/instances/create-use-preemptible).
`watch_gce_notice()` long-polls both (`?wait_for_change=true`) in a daemon thread and sets the same
flag as SIGTERM; it starts only where the metadata server answers (GCE_METADATA_HOST, else
metadata.google.internal), so elsewhere it costs one failed connection at start.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

from absl import logging

EXIT_CODE = 128 + signal.SIGTERM  # 143

_requested = threading.Event()


class Preempted(Exception):
    """The run saved a checkpoint after SIGTERM and stopped; running the same command resumes it."""

    def __init__(self, name: str, step: int):
        super().__init__(
            f"[{name}] stopped by SIGTERM at step {step} after saving a checkpoint; "
            "run the same command again to resume"
        )
        self.name, self.step = name, step


def _on_sigterm(signum, frame) -> None:
    if _requested.is_set():  # the second one: give up on the clean stop
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        return
    _requested.set()
    logging.warning("SIGTERM: checkpointing after the current host loop, then exiting")


def install() -> bool:
    """Routes SIGTERM to the flag; only possible from the main thread (returns False elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    watch_gce_notice()  # on a Compute Engine VM: its preemption and maintenance notices too
    return True


def requested() -> bool:
    """True once SIGTERM has arrived (after `install()`): the loop should checkpoint and stop."""
    return _requested.is_set()


def request(reason: str = "a preemption notice") -> None:
    """Sets the stop flag as SIGTERM does (the metadata watcher; tests)."""
    if not _requested.is_set():
        _requested.set()
        logging.warning("%s: checkpointing after the current host loop, then exiting", reason)


# ------------------------------------------------------------------------------------------------
# The hosts' agreement on the step at which they stop

_collective = None  # flag (0/1) -> the maximum over every host; None: this process alone
_sync_point = None  # step -> JAX's preemption service says all hosts reached its sync point


def set_collective(collective=None, sync_point=None) -> None:
    """The all-reduce (max) over the hosts of one run, and JAX's sync point; None: one host."""
    global _collective, _sync_point
    _collective, _sync_point = collective, sync_point


def stop_agreed(step: int) -> bool:
    """Whether every host stops after this host loop: called by every host at the same host
    loops (the loop is SPMD), so all of them get the same answer at the same step."""
    local = requested()
    if _sync_point is not None and _sync_point(step):
        local = True
    if _collective is None:
        return local
    return bool(_collective(1 if local else 0))


def jax_collective():
    """(the maximum over JAX's processes, JAX's preemption sync point) when this run spans
    several processes; (None, None) for one."""
    import jax

    if jax.process_count() == 1:
        return None, None
    import numpy as np
    from jax.experimental import multihost_utils

    def collective(flag: int) -> int:
        return int(np.max(multihost_utils.process_allgather(np.int32(flag))))

    def sync_point(step: int) -> bool:
        try:
            return bool(multihost_utils.reached_preemption_sync_point(step))
        except RuntimeError:  # no preemption service in this jax.distributed setup
            return False

    return collective, sync_point


def tf_collective(strategy):
    """The maximum over a multi-worker strategy's workers; None for one worker."""
    import tensorflow as tf

    # A TPUStrategy drives every host of a slice from one client process: nothing to agree on.
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    spec = strategy.cluster_resolver.cluster_spec().as_dict()
    if sum(len(v) for v in spec.values()) <= 1:
        return None

    def collective(flag: int) -> int:
        local = strategy.run(lambda: tf.constant(flag, tf.int32))
        # tf.distribute reduces by SUM or MEAN only: the flags' sum is non-zero when any is set
        return int(strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None).numpy() > 0)

    return collective


# ------------------------------------------------------------------------------------------------
# The Compute Engine notice

METADATA = "http://{host}/computeMetadata/v1/instance/{key}"
NOTICE_KEYS = {
    "preempted": lambda v: v.strip().upper() == "TRUE",
    "maintenance-event": lambda v: v.strip().upper().startswith("TERMINATE"),
}
_watching = threading.Event()


def on_gce() -> bool:
    """A Compute Engine VM (a TPU VM is one): its DMI product name, read without the network."""
    try:
        with open("/sys/class/dmi/id/product_name") as f:
            return "Google" in f.read()
    except OSError:
        return False


def _get(host: str, key: str, timeout: float, wait: bool) -> str:
    url = METADATA.format(host=host, key=key) + ("?wait_for_change=true" if wait else "")
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310  (http to the VM's server)
        return r.read(4096).decode("utf-8", errors="replace")


def watch_gce_notice(host: str | None = None, probe_s: float = 2.0, poll_s: float = 3600.0) -> bool:
    """Starts one daemon thread per notice key that sets the stop flag when Compute Engine
    announces a preemption or a stopping maintenance event; False (nothing started) off Compute
    Engine (`host` None), where no metadata server answers within `probe_s`, or when already
    watching. `host`: the metadata server's host:port (tests start their own)."""
    if _watching.is_set() or (host is None and not on_gce()):
        return False
    host = host or os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    try:
        _get(host, "preempted", probe_s, wait=False)
    except (OSError, ValueError):  # urllib's URLError is an OSError
        return False
    _watching.set()
    for key, stops in NOTICE_KEYS.items():
        threading.Thread(
            target=_watch, args=(host, key, stops, poll_s), name=f"gce-{key}", daemon=True
        ).start()
    return True


def _watch(host: str, key: str, stops, poll_s: float) -> None:
    wait = False  # the current value first (a notice given before the watch began), then changes
    while True:
        try:
            value = _get(host, key, poll_s, wait)
        except (OSError, ValueError):
            time.sleep(5.0)  # the server restarts during maintenance: ask again
            continue
        if stops(value):
            request(f"Compute Engine notice {key}={value.strip()}")
            return
        wait = True
