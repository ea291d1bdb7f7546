"""Owns the report's TensorBoard entries: HParams (one run per trial, its settings and outcome) and
the report's plots as images, under WORKDIR/report/tb/."""

from __future__ import annotations

import math
import os

import tensorflow as tf

from wide_tf.analysis import cells

# The metrics of the HParams table, with the description TensorBoard shows.
METRIC_DOCS = {
    "steps_to_target": "optimizer steps until the target was first reached (absent: not reached)",
    "epochs_to_target": "steps_to_target x batch / n_train",
    "final_train_accuracy": "training accuracy at the end of the run",
    "final_test_accuracy": "test accuracy at the end of the run",
    "best_test_accuracy": "best test accuracy over the run's evaluations",
    "status_code": "1 reached, 0 not reached, -1 diverged",
}
# The numeric hyperparameters of a trial and their types.
NUMERIC_HPARAMS = (
    ("depth", int),
    ("width", float),
    ("params", int),
    ("batch_size", int),
    ("learning_rate", float),
    ("lr_multiplier", float),
    ("seed", int),
)


def _hparams_of(rec: dict) -> dict:
    hp = {"member": rec.get("member"), "optimizer": rec.get("optimizer")}
    for k, cast in NUMERIC_HPARAMS:
        if rec.get(k) is not None:
            hp[k] = cast(rec[k])
    return {k: v for k, v in hp.items() if v is not None}


def _metrics_of(rec: dict) -> dict:
    final = rec.get("final") or {}
    m = {
        "steps_to_target": rec.get("steps_to_target"),
        "epochs_to_target": rec.get("epochs_to_target"),
        "final_train_accuracy": final.get("train_accuracy"),
        "final_test_accuracy": final.get("test_accuracy"),
        "best_test_accuracy": rec.get("best_test_accuracy"),
        "status_code": cells.STATUS_CODE.get(rec.get("status")),
    }
    return {k: float(v) for k, v in m.items() if v is not None and math.isfinite(float(v))}


def _write_hparams(hp_api, records: list[dict], hdir: str) -> None:
    optimizers = sorted({str(r.get("optimizer")) for r in records if r.get("optimizer")})
    hparams = [
        hp_api.HParam("member", hp_api.Discrete(sorted({str(r["member"]) for r in records}))),
        hp_api.HParam("optimizer", hp_api.Discrete(optimizers or ["unknown"])),
    ]
    hparams += [hp_api.HParam(k) for k, _ in NUMERIC_HPARAMS]
    metrics = [hp_api.Metric(k, display_name=k, description=d) for k, d in METRIC_DOCS.items()]
    # Every writer is closed before the report folder is renamed into place (on GCS an event file
    # is uploaded when its writer closes).
    writer = tf.summary.create_file_writer(hdir)
    with writer.as_default():
        hp_api.hparams_config(hparams=hparams, metrics=metrics)
    writer.close()
    for i, rec in enumerate(records):
        tid = str(rec.get("trial_id") or f"trial{i}")
        writer = tf.summary.create_file_writer(os.path.join(hdir, tid))
        with writer.as_default():
            hp_api.hparams(_hparams_of(rec), trial_id=tid)
            for k, v in _metrics_of(rec).items():
                tf.summary.scalar(k, v, step=0)
        writer.close()


def _write_images(plots, pdir: str) -> None:
    writer = tf.summary.create_file_writer(pdir)
    with writer.as_default():
        for name, caption, png in plots:
            img = tf.image.decode_png(png, channels=4)[None]
            tf.summary.image(os.path.splitext(name)[0], img, step=0, description=caption)
    writer.close()


def write_tensorboard(records: list[dict], plots, tbdir: str) -> bool:
    """HParams (one run per trial) and the plots as images, into `tbdir` (a fresh folder: each
    report is written whole into its own, publish.py); False when tensorboard is not installed."""
    try:
        # Lazy and optional: the HParams plugin comes with the `tensorboard` package, which a
        # report does not need (without it the report says so and writes everything else).
        from tensorboard.plugins.hparams import api as hp_api
    except ImportError:
        return False
    _write_hparams(hp_api, records, os.path.join(tbdir, "hparams"))
    if plots:
        _write_images(plots, os.path.join(tbdir, "plots"))
    return True
