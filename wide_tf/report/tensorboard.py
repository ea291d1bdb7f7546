"""Owns the report's TensorBoard folder, WORKDIR/report/tb/, made to be usable on open: one
session per (member, batch size) at its chosen learning rate (the seed whose steps to target are
the median), whose training curves are copied from that trial with one tag set (accuracy and
loss in train/, train_set/ and test/ overlay: schema/targets.py), again against the training
examples seen (tags under examples/: batches compare on one axis), and which carries the HParams
(member, batch, rate, provenance) and their metrics, so "Show Metrics" reaches the curves; one
session per member (`<member>/member`) whose metrics are the study's answer for it: B_x(1+eps)
and B_crit with their 95% interval ends (and whether each is censored); and the report's plots as
images. Depth, width, parameters, batch, rate, multiplier and seed are typed HParams (discrete
values or a numeric interval), so the HParams tab filters and plots by them. A study of 9 members
x 6 batches is 4 x 54 + 9 + 2 runs, under TensorBoard's default limit of 500 runs (above it every
run is unticked and the charts open empty). Every trial's own events stay in WORKDIR/trials/
(`tensorboard --logdir` on it shows them all)."""

from __future__ import annotations

import math
import os

import tensorflow as tf
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from wide_tf.analysis import cells
from wide_tf.schema import provenance, targets
from wide_tf.store import workdir as wd
from wide_tf.study import lr_grid

# The outcome of a (member, batch) cell, scalars at step 0 of its session run (the HParams
# table's columns beside the curves' last values), with the description TensorBoard shows.
OUTCOME_DOCS = {
    "outcome/median_steps_to_target": "the median over seeds of the steps to the target at the "
    "chosen rate (absent: the median seed did not reach it)",
    "outcome/median_epochs_to_target": "median steps x batch / n_train",
    "outcome/seeds_reached": "seeds at the chosen rate that reached the target",
    "outcome/steps_to_target": "this session's trial (the median seed): its steps to the target",
}
# A member's session: the study's answer for that member (report/plots.py draws the same values).
MEMBER_DOCS = {
    "member/b_x": "B_x(1+eps): the batch where epochs to target first reach (1 + eps) x those of "
    "the two smallest batches (a censored one: the edge of the batches tried)",
    "member/b_x_low": "B_x(1+eps): low end of its 95% interval",
    "member/b_x_high": "B_x(1+eps): high end of its 95% interval",
    "member/b_x_censored": "1: B_x(1+eps) is only a bound (no crossing up to the largest batch, or "
    "beyond the batches tried); 0: measured",
    "member/b_crit": "B_crit of the fit S = S_min (1 + B_crit / B) (a censored one: the edge)",
    "member/b_crit_low": "B_crit: low end of its 95% interval",
    "member/b_crit_high": "B_crit: high end of its 95% interval",
    "member/b_crit_censored": "1: B_crit lies beyond the batches tried (only a bound); 0: inside",
    "member/eps": "the eps of B_x(1+eps)",
}
MEMBER_SESSION = "member"  # <member>/member, beside the member's <member>/b<batch> sessions
# The curves again against training examples seen (step x batch): tags under this prefix.
EXAMPLES_PREFIX = "examples/"
# The curves' last values in the HParams table: (tag, run within the session, description).
CURVE_METRICS = (
    ("accuracy", "train_set", "training-set accuracy at the last evaluation (the target's metric)"),
    ("loss", "train_set", "training-set loss at the last evaluation"),
    ("accuracy", "test", "test accuracy at the last evaluation"),
)
NUMERIC_HPARAMS = (
    ("depth", int),
    ("width", float),
    ("params", int),
    ("batch_size", int),
    ("learning_rate", float),
    ("lr_multiplier", float),
    ("seed", int),
)
# The provenance shown as HParams (text columns: the table filters on them).
PROVENANCE_HPARAMS = ("wide_tf", "versions", "machine")


def session_name(member: str, batch: int) -> str:
    return f"{member}/b{int(batch)}"


def _median_trial(rs: list[dict], cell) -> dict:
    """The trial a cell's session shows: at the chosen rate, the seed whose steps to target are
    the median (a censored cell: the median of its longest non-diverged runs)."""
    chosen = [
        r
        for r in rs
        if cell.best_multiplier is not None
        and lr_grid.mult_key(r.get("lr_multiplier", 1.0)) == cell.best_multiplier
    ]
    pool = chosen or [r for r in rs if r.get("status") != "diverged"] or list(rs)

    def key(r):
        s = lr_grid.run_steps(r)
        return (math.inf if s is None else s, -(r.get("steps") or 0), int(r.get("seed", 0)))

    pool.sort(key=key)
    return pool[(len(pool) - 1) // 2]


def sessions(records: list[dict]) -> list[tuple[str, object, dict]]:
    """(session name, cell, the trial it shows) per (member, batch), in member, batch order."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["member"], int(r["batch_size"])), []).append(r)
    out = []
    for (member, batch), rs in sorted(groups.items()):
        cell = cells.make_cell(member, batch, rs)
        out.append((session_name(member, batch), cell, _median_trial(rs, cell)))
    return out


def _hparams_of(rec: dict) -> dict:
    hp = {"member": rec.get("member"), "optimizer": rec.get("optimizer")}
    for k, cast in NUMERIC_HPARAMS:
        if rec.get(k) is not None:
            hp[k] = cast(rec[k])
    if isinstance(rec.get("provenance"), dict):
        text = provenance.summary(rec["provenance"])
        hp.update({f"provenance/{k}": text[k] for k in PROVENANCE_HPARAMS})
    return {k: v for k, v in hp.items() if v is not None}


def _outcome_of(cell, rec: dict) -> dict:
    med = cell.median_steps
    m = {
        "outcome/median_steps_to_target": med,
        "outcome/median_epochs_to_target": cell.epochs(med) if med is not None else None,
        "outcome/seeds_reached": float(len(cell.seed_steps)),
        "outcome/steps_to_target": rec.get("steps_to_target"),
    }
    return {k: float(v) for k, v in m.items() if v is not None and math.isfinite(float(v))}


def _number(v) -> float:
    """A scalar summary value's number: a float32 tensor's own field when it has one (what
    tf.summary.scalar writes), else the tensor decoded, else the older simple_value field."""
    if not v.HasField("tensor"):
        return float(v.simple_value)
    t = v.tensor
    if t.dtype == types_pb2.DT_FLOAT and len(t.float_val) == 1 and not t.tensor_content:
        return float(t.float_val[0])
    from tensorboard.util import tensor_util

    return float(tensor_util.make_ndarray(t))


def _scalar_value(tag: str, number: float, metadata):
    """A scalar summary value under `tag`: a rank-0 float32 tensor, as tf.summary.scalar writes
    it (built as a proto: tensor_util's general path costs more than the copy's reading)."""
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        float_val=[number],
    )
    return summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)


def copy_curves(trial_dir: str, session_dir: str, batch_size: int | None = None) -> int:
    """Copies a trial's scalars into session_dir/<run>/ in today's layout (schema/targets.py; older
    workdirs' eval/ and batch_* tags mapped); with `batch_size`, each again under examples/<tag>
    at step = training examples seen (step x batch), so that the curves of every batch size share
    one axis. Returns the number of values copied (the step-axis ones)."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    meta = scalar_metadata.create_summary_metadata(display_name=None, description=None)
    by_run: dict[str, list] = {}
    for folder in targets.FOLDERS:
        for f in sorted(tf.io.gfile.glob(wd.join(trial_dir, folder, "events.out.tfevents.*"))):
            # TensorBoard's own record reader: a tf.data pipeline costs an op per record.
            for raw in event_file_loader.RawEventFileLoader(f).Load():
                ev = event_pb2.Event.FromString(raw)
                for v in ev.summary.value:
                    if not (v.HasField("tensor") or v.HasField("simple_value")):
                        continue
                    run, tag = targets.place(folder, v.tag)
                    number = _number(v)
                    by_run.setdefault(run, []).append(
                        (ev.step, ev.wall_time, _scalar_value(tag, number, meta))
                    )
                    if batch_size:
                        by_run[run].append(
                            (
                                ev.step * batch_size,
                                ev.wall_time,
                                _scalar_value(EXAMPLES_PREFIX + tag, number, meta),
                                False,
                            )
                        )
    n = 0
    for run, values in by_run.items():
        writer = EventFileWriter(os.path.join(session_dir, run))
        for step, wall, value, *counted in sorted(values, key=lambda x: (x[0], x[1])):
            writer.add_event(
                event_pb2.Event(
                    wall_time=wall, step=int(step), summary=summary_pb2.Summary(value=[value])
                )
            )
            n += not counted
        writer.close()
    return n


def _domain(hp_api, values, cast):
    """A typed HParams domain: the values themselves when few (the tab shows a tick box each),
    else their numeric interval (the tab shows min and max)."""
    vals = sorted({cast(v) for v in values if v is not None})
    if not vals:
        return None
    if len(vals) <= 12 or cast is str:
        return hp_api.Discrete(vals)
    if cast is int:
        return hp_api.IntInterval(vals[0], vals[-1])
    return hp_api.RealInterval(vals[0], vals[-1])


# Always an interval, whatever the count: a continuous quantity filtered by a range.
INTERVAL_HPARAMS = ("width", "learning_rate", "params")


def hparam_infos(hp_api, records: list[dict]) -> list:
    """The experiment's HParams, typed from the values the records hold."""
    hparams = [
        hp_api.HParam("member", hp_api.Discrete(sorted({str(r["member"]) for r in records}))),
        hp_api.HParam("optimizer", _domain(hp_api, [r.get("optimizer") for r in records], str)),
    ]
    for k, cast in NUMERIC_HPARAMS:
        vals = [r.get(k) for r in records if r.get(k) is not None]
        if k in INTERVAL_HPARAMS and vals:
            lo, hi = min(cast(v) for v in vals), max(cast(v) for v in vals)
            iv = hp_api.IntInterval if cast is int else hp_api.RealInterval
            hparams.append(hp_api.HParam(k, iv(lo, hi)))
        else:
            hparams.append(hp_api.HParam(k, _domain(hp_api, vals, cast)))
    hparams += [hp_api.HParam(f"provenance/{k}") for k in PROVENANCE_HPARAMS]
    return hparams


def _member_hparams(s, rec: dict | None) -> dict:
    hp = {"member": s.info.name}
    for k, v in (("depth", s.info.depth), ("width", s.info.width), ("params", s.info.params)):
        if isinstance(v, (int, float)):
            hp[k] = dict(NUMERIC_HPARAMS)[k](v)
    if rec is not None and rec.get("optimizer"):
        hp["optimizer"] = rec["optimizer"]
    return hp


def member_metrics(s, eps: float) -> dict:
    """A member's answer as scalars (MEMBER_DOCS): only the values it has."""
    from wide_tf.report.plots import bound_side

    cv = s.curve
    out: dict = {"member/eps": eps}
    if cv is None:
        return out
    for field, key in (("b_model_free", "b_x"), ("b_crit", "b_crit")):
        iv = getattr(cv, field)
        if iv is None:
            continue
        out[f"member/{key}"] = iv.value
        out[f"member/{key}_low"] = iv.low
        out[f"member/{key}_high"] = iv.high
        out[f"member/{key}_censored"] = 0.0 if bound_side(cv, field) is None else 1.0
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def _write_sessions(hp_api, workdir, records, tbdir, summaries=(), eps: float = 1.0) -> int:
    found = sessions(records)
    metrics = [hp_api.Metric(k, display_name=k, description=d) for k, d in OUTCOME_DOCS.items()]
    metrics += [
        hp_api.Metric(tag, group=run, display_name=f"{run}/{tag}", description=d)
        for tag, run, d in CURVE_METRICS
    ]
    if summaries:
        metrics += [
            hp_api.Metric(k, display_name=k.replace("b_x", f"B_x{1 + eps:g}"), description=d)
            for k, d in MEMBER_DOCS.items()
        ]
    # Every writer is closed before the report folder is renamed into place (on GCS an event file
    # is uploaded when its writer closes).
    writer = tf.summary.create_file_writer(tbdir)
    with writer.as_default():
        hp_api.hparams_config(hparams=hparam_infos(hp_api, records), metrics=metrics)
    writer.close()
    for name, cell, rec in found:
        session_dir = os.path.join(tbdir, *name.split("/"))
        writer = tf.summary.create_file_writer(session_dir)
        with writer.as_default():
            hp_api.hparams(_hparams_of(rec), trial_id=name)
            for k, v in _outcome_of(cell, rec).items():
                tf.summary.scalar(k, v, step=0)
        writer.close()
        copy_curves(
            wd.trial_dir(workdir, str(rec["trial_id"])), session_dir, int(rec["batch_size"])
        )
    first = {}
    for _, _, rec in found:
        first.setdefault(rec["member"], rec)
    for s in summaries:
        name = f"{s.info.name}/{MEMBER_SESSION}"
        writer = tf.summary.create_file_writer(os.path.join(tbdir, s.info.name, MEMBER_SESSION))
        with writer.as_default():
            hp_api.hparams(_member_hparams(s, first.get(s.info.name)), trial_id=name)
            for k, v in member_metrics(s, eps).items():
                tf.summary.scalar(k, v, step=0, description=MEMBER_DOCS[k])
        writer.close()
    return len(found) + len(summaries)


def _write_images(plots, pdir: str) -> None:
    writer = tf.summary.create_file_writer(pdir)
    with writer.as_default():
        for name, caption, png in plots:
            img = tf.image.decode_png(png, channels=4)[None]
            tf.summary.image(os.path.splitext(name)[0], img, step=0, description=caption)
    writer.close()


def write_tensorboard(
    workdir: str, records: list[dict], plots, tbdir: str, summaries=(), eps: float = 1.0
) -> bool:
    """The curated TensorBoard folder (a session per (member, batch) with its curves and HParams,
    a session per member with its B_x(1+eps) and B_crit, the plots as images) into `tbdir` (a
    fresh folder: each report is written whole into its own, publish.py); False when tensorboard
    is not installed."""
    try:
        # Lazy and optional: the HParams plugin comes with the `tensorboard` package, which a
        # report does not need (without it the report says so and writes everything else).
        from tensorboard.plugins.hparams import api as hp_api
    except ImportError:
        return False
    _write_sessions(hp_api, workdir, records, tbdir, summaries, eps)
    if plots:
        _write_images(plots, os.path.join(tbdir, "plots"))
    return True
