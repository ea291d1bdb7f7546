"""Owns what runs on one accelerator host of a Ray cluster: the `Host` actor, which holds the host's
device for the whole study (TensorFlow or JAX started once, the strategy and the kept build serve
every group) and runs the (member, batch size) groups the driver hands it, each to the end of its
learning-rate protocol, through the same loop as a local process (study/scheduler.py). It writes
only into the workdir: each trial's folder and its record, whole, once (store/workdir.py).

Plain Python here: the driver (cluster/ray_study.py) makes it a Ray actor with `ray.remote`; Ray
is imported only inside the actor."""

from __future__ import annotations

import os
import socket

from wide_tf.engine import backend
from wide_tf.store import workdir as wd
from wide_tf.study import worker


class Assigned:
    """The claims of a host on a cluster: the driver assigned the group, so it stays this host's
    until the host returns it or Ray declares the host lost (and kills it)."""

    def still_mine(self, key: str) -> bool:
        return True

    def record(self, workdir: str, key: str, result: dict) -> None:
        wd.record_result(workdir, result)


class Host:
    """One accelerator host's actor: `run_group` runs the groups the driver hands it."""

    def __init__(self, frozen: dict, workdir: str, verbose: bool = False):
        backend.select(frozen)  # KERAS_BACKEND, before anything imports Keras
        from absl import flags, logging

        from wide_tf import tf_start

        if not flags.FLAGS.is_parsed():
            flags.FLAGS(["wide_tf.cluster.host"])  # absl's defaults, as under main's app.run
        logging.use_absl_handler()
        logging.set_verbosity(logging.INFO)
        self.config = worker.thaw(frozen)
        if backend.of(self.config) == "tensorflow":  # the JAX backend runs without TensorFlow
            tf_start.import_tensorflow(verbose)
        logging.get_absl_handler().addFilter(tf_start.DropCheckpointChatter())
        self.workdir = workdir
        self.share = None  # opened at the first group: the runtime starts once per host

    def where(self) -> dict:
        """This actor's node (Ray's id: the driver watches it) and host:pid (its log lines)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"node": node, "name": f"{socket.gethostname()}:{os.getpid()}"}

    def run_group(self, member: str, batch: int) -> dict:
        """Runs the group to the end of its protocol; {"ran": trials run, "host": where}."""
        from wide_tf.study import scheduler, trials

        if self.share is None:
            everything = trials.list_trials(self.config)
            self.share = scheduler.open_share(self.config, self.workdir, everything, Assigned())
        ran = scheduler.run_group(self.share, (member, int(batch)))
        return {"ran": ran, "host": self.where()["name"]}
