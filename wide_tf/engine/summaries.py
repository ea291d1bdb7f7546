"""Owns where a run's numbers go: TensorBoard scalars (train/, train_set/ and test/ events, one
tag set: schema/targets.py), metrics.jsonl and the run's log lines (MetricsWriter)."""

from __future__ import annotations

import math
import time

import numpy as np
from absl import logging
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from wide_tf.schema import targets
from wide_tf.store import workdir as wd


class MetricsWriter:
    """Where a run's numbers go: `scalars` sends a dict of scalars to TensorBoard (a 'train' or
    'eval' dict, each value to the run folder and tag schema/targets.py gives it: accuracy and loss
    overlay across train/, train_set/ and test/; non-finite values are skipped), `history`
    rewrites metrics.jsonl (one line per evaluation, atomically) and `log` writes the log line.
    Only the chief writes files; every worker logs. Adding a logged scalar is one key in a dict
    passed to `scalars`.

    Events are written by TensorBoard's own event-file writer (a background thread; tf.gfile
    paths, so gs:// works) in the format of tf.summary.scalar (a float32 tensor with the scalars
    plugin's metadata): tf.summary costs ~0.3 ms of eager ops per value, this ~0.01 ms, and a
    run in a study writes a dozen values per host loop."""

    _SCALAR = scalar_metadata.create_summary_metadata(display_name=None, description=None)

    def __init__(self, workdir: str, chief: bool, name: str, write_log=None):
        self.workdir, self.chief, self.name = workdir, chief, name
        # write_log(message, *args, warning=): absl's by default; a caller may pass its own, so
        # that absl's prefix names the caller's file (see engine/train.py).
        self._write_log = write_log or _absl_log
        # Event files are created on the first scalar, not here: a run that stops before it
        # trains (a damaged checkpoint, say) leaves the workdir exactly as it found it.
        self._writers: dict = {}

    def scalars(self, kind: str, step: int, values: dict) -> None:
        if not self.chief:
            return
        by_run: dict[str, list] = {}
        for k, v in values.items():
            if v is not None and math.isfinite(v):
                run, tag = targets.place(kind, k)
                by_run.setdefault(run, []).append(
                    summary_pb2.Summary.Value(
                        tag=tag,
                        tensor=tensor_util.make_tensor_proto(np.float32(v)),
                        metadata=self._SCALAR,
                    )
                )
        for run, value in by_run.items():
            if run not in self._writers:
                # (Its file name holds the time, host, pid and a counter: a resumed run adds one.)
                self._writers[run] = EventFileWriter(wd.join(self.workdir, run))
            self._writers[run].add_event(
                event_pb2.Event(
                    wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=value)
                )
            )

    def history(self, records: list) -> None:
        if self.chief:
            wd.write_text_atomic(
                wd.join(self.workdir, wd.METRICS), "".join(wd.dumps_line(r) + "\n" for r in records)
            )

    def log(self, message: str, *args, warning: bool = False, debug: bool = False) -> None:
        # debug: detail (each evaluation's numbers, the gradient probe) that --verbosity=1 shows
        self._write_log("[%s] " + message, self.name, *args, warning=warning, debug=debug)

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()


def _absl_log(message: str, *args, warning: bool = False, debug: bool = False) -> None:
    (logging.warning if warning else logging.debug if debug else logging.info)(message, *args)
