"""Owns the theory check's run: `run_theory` computes every point of the sweeps
(`wide_tf.theory.bound`, pure NumPy; docs/science.md, "Theory check") and writes
WORKDIR/report/theory.{md,csv,png} (`wide_tf.theory.report`). TensorFlow is imported only to
write through tf.io.gfile (gs:// works)."""

from __future__ import annotations

import time

from absl import logging

from wide_tf.theory import bound, report


def run_theory(config, workdir: str) -> dict:
    """Run the theory study of ``config.theory`` and write WORKDIR/report/theory.{md,csv,png}.

    Returns {'points': [row dicts], 'summary': {sweep: {network: {statistic: Trend}}},
    'verdict': str, 'paths': {...}}.
    """
    # Lazy, and only for tf.io.gfile (gs:// workdirs): see report.render_plot.
    import tensorflow as tf

    cfg = config.theory
    start = time.time()
    logging.info(
        "theory: %d points x %d draws, n=%d, d=%d",
        len(bound.plan_points(cfg)),
        cfg.n_inits,
        cfg.n_samples,
        cfg.input_dim,
    )
    points = bound.run_points(cfg)
    summary = bound.summarize(points, cfg)
    elapsed = time.time() - start
    report_dir = f"{workdir.rstrip('/')}/report"
    tf.io.gfile.makedirs(report_dir)
    paths = {ext: f"{report_dir}/theory.{ext}" for ext in ("md", "csv", "png")}
    with tf.io.gfile.GFile(paths["csv"], "w") as f:
        f.write(report.render_csv(points))
    with tf.io.gfile.GFile(paths["png"], "wb") as f:
        f.write(report.render_plot(points, cfg))
    text = report.verdict(summary, cfg)
    with tf.io.gfile.GFile(paths["md"], "w") as f:
        f.write(report.render_markdown(points, cfg, summary, elapsed))
    logging.info("theory: %s", text)
    logging.info("theory: wrote %s (%.1fs)", ", ".join(paths.values()), elapsed)
    return {
        "points": [p.row() for p in points],
        "summary": summary,
        "verdict": text,
        "paths": paths,
    }
