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
"""

from __future__ import annotations

import signal
import threading

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
    return True


def requested() -> bool:
    """True once SIGTERM has arrived (after `install()`): the loop should checkpoint and stop."""
    return _requested.is_set()
