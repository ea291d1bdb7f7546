"""The report's figures read as what they measure: a censored B_x(1+eps) drawn as a bound, depth
labels that never overlap, the width axis named for the architecture drawn."""

import csv
import os

import pytest
from test_report import BATCHES, MEMBERS, make_records

from wide_tf.analysis import verdict
from wide_tf.report import plots

pytest.importorskip("matplotlib")

# A member whose epochs never double inside the batches tried: its B_x(1+eps) is a lower bound at
# the largest batch, EQUAL to it (not beyond it), the case a range test alone misses.
CENSORED = ("mlp-d1-w362", 1, 362, 1.0e6)


def _figures(monkeypatch, tmp_path, members, eps=0.25):
    recs = make_records(members=members, history=False)
    result = verdict.analyze(recs, eps)
    figures = {}
    real_save = plots._save
    monkeypatch.setattr(
        plots, "_save", lambda fig, *a: figures.setdefault(a[1], fig) and real_save(fig, *a)
    )
    plots.make_plots(result["summaries"], recs, eps, "acc", str(tmp_path), result["verdicts"])
    return result, figures


def test_a_censored_member_is_an_open_marker_with_an_arrow(tmp_path, monkeypatch):
    result, figures = _figures(monkeypatch, tmp_path, MEMBERS[:3] + [CENSORED])
    s = next(s for s in result["summaries"] if s.info.name == CENSORED[0])
    assert s.curve.b_model_free_status == 1  # no crossing: a lower bound ...
    assert s.curve.b_model_free.value == pytest.approx(BATCHES[-1])  # ... AT the largest batch
    assert not s.curve.b_model_free.above_range  # which the range test alone calls measured

    ax = figures["batch_vs_width.png"].axes[1]  # the B_x(1+eps) panel
    marks = [ln for ln in ax.lines if ln.get_gid() == "censored"]
    assert len(marks) == 1
    (m,) = marks
    assert list(m.get_xdata()) == [362.0]
    assert m.get_ydata()[0] == pytest.approx(BATCHES[-1])
    assert m.get_marker() == "^" and m.get_markerfacecolor() == "none"  # open, pointing up
    arrows = [t for t in ax.texts if t.get_gid() == "censored-arrow"]
    assert len(arrows) == 1 and arrows[0].xy == (362.0, 1.0)  # to the top edge of the axes
    # ... and no measured point (a filled circle with an interval) drawn for it
    points = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert points and all(362.0 not in list(ln.get_xdata()) for ln in points)
    assert any("censored" in t.get_text() for t in ax.get_legend().get_texts())

    # On the epochs plot it is a bound along the batch axis: open, pointing right.
    ex = figures["epochs_vs_batch.png"].axes[0]
    (e,) = [ln for ln in ex.lines if ln.get_gid() == "censored"]
    assert e.get_marker() == ">" and e.get_xdata()[0] == pytest.approx(BATCHES[-1])
    assert e.get_markerfacecolor() == "none"


def test_the_tables_say_a_censored_member_is_a_bound(tmp_path):
    from test_report import make_workdir

    from wide_tf import report

    pytest.importorskip("tensorboard")
    wd = make_workdir(tmp_path / "wd", make_records(members=MEMBERS[:3] + [CENSORED]))
    report.write_report(str(wd))
    out = os.path.join(str(wd), "report")
    with open(os.path.join(out, "members.csv")) as f:
        rows = {r["member"]: r for r in csv.DictReader(f)}
    assert rows[CENSORED[0]]["b_x_censored"] == "True"
    assert rows[CENSORED[0]]["b_x"] == "512.0"  # printed at its precision, not 511.99999999999994
    assert rows[MEMBERS[0][0]]["b_x_censored"] == "False"
    md = open(os.path.join(out, "report.md")).read()
    assert ">= 512 (lower bound: no crossing up to the largest batch)" in md
    assert "max_batch" not in md and "model-free batch" not in md


def test_depth_labels_do_not_overlap(tmp_path, monkeypatch):
    # Eight members of nearly one width and one critical batch: their labels start on one spot.
    crowded = [(f"mlp-d{d}-w{100 + d}", d, 100 + d, 60.0 + d) for d in range(1, 9)]
    _, figures = _figures(monkeypatch, tmp_path, crowded)
    fig = figures["batch_vs_width.png"]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in plots.depth_labels(ax)]
        assert len(boxes) in (0, len(crowded))
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not a.overlaps(b), (a, b)
    assert len(plots.depth_labels(fig.axes[1])) == len(crowded)


def test_the_width_axis_is_named_for_the_architecture_drawn(tmp_path, monkeypatch):
    _, figures = _figures(monkeypatch, tmp_path, MEMBERS)
    for ax in figures["batch_vs_width.png"].axes:
        assert ax.get_xlabel() == "width (units per hidden layer)"
        assert "WRN" not in ax.get_xlabel() and "widening" not in ax.get_xlabel()
