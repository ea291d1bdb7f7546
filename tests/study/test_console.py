"""What a study says while it runs: one console line per finished run (the same line whether one
process or N workers ran it), 'worker' in the singular for one, the coordinator's own log in
WORKDIR/logs/, and detail (each evaluation's numbers, the gradient probe) at debug level only."""

import logging as py_logging

from absl import logging

from wide_tf.engine import summaries
from wide_tf.study import progress

RESULT = {
    "member": "mlp-d2-w29",
    "batch_size": 32,
    "learning_rate": 0.024748737341529166,
    "lr_multiplier": 1.0,
    "seed": 0,
    "status": "reached",
    "steps": 45,
    "steps_to_target": 45,
    "wall_time_s": 5.123,
}


def test_one_line_per_finished_run():
    assert progress.run_line(RESULT) == (
        "run done: mlp-d2-w29 batch 32 lr 0.02475 (x1) seed 0: reached, 45 steps to the target, "
        "5.1 s"
    )
    censored = {**RESULT, "status": "not_reached", "steps": 135, "steps_to_target": None}
    assert "not_reached, 135 steps, 5.1 s" in progress.run_line(censored)
    assert progress.workers_running(1) == "1 worker running"
    assert progress.workers_running(2) == "2 workers running"


def test_the_coordinators_log_is_kept_in_the_workdir(tmp_path):
    path = progress.keep_log(str(tmp_path))
    old = logging.get_verbosity()
    logging.set_verbosity(logging.INFO)  # as under app.run
    try:
        logging.info("a line of the coordinator")
        assert path.startswith(str(tmp_path / "logs" / "coordinator."))
        for h in logging.get_absl_logger().handlers:
            h.flush()
        assert "a line of the coordinator" in open(path).read()
    finally:
        logging.set_verbosity(old)
        for h in list(logging.get_absl_logger().handlers):
            if isinstance(h, py_logging.FileHandler) and h.baseFilename == path:
                logging.get_absl_logger().removeHandler(h)
                h.close()
    assert progress.keep_log("gs://bucket/study") is None


def test_detail_lines_are_debug(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(logging, "debug", lambda *a: seen.append(("debug", a)))
    monkeypatch.setattr(logging, "info", lambda *a: seen.append(("info", a)))
    w = summaries.MetricsWriter(str(tmp_path), True, "t")
    w.log("step %d", 1, debug=True)
    w.log("reached", debug=False)
    assert [lvl for lvl, _ in seen] == ["debug", "info"]
