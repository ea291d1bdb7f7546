"""Owns the verdict's headline without the report: on a machine without TensorFlow (the JAX
backend's GPU or TPU machines), where the report (TensorBoard's HParams, tf.io.gfile) cannot be
written, the study still ends with its verdict, computed by the analysis from the workdir alone.
No TensorFlow."""

from __future__ import annotations

from absl import logging

from wide_tf import tf_start
from wide_tf.analysis import equivalence, frozen, verdict
from wide_tf.report.protocol import eps_from_config
from wide_tf.store import workdir as wd


def without_report(workdir: str) -> str:
    """The verdict's headline sentence(s) of the study in `workdir` (local), as report/verdict.txt
    would hold them, and where to write the report."""
    config = (
        wd.read_json(wd.join(workdir, wd.CONFIG))
        if wd.exists(wd.join(workdir, wd.CONFIG))
        else None
    )
    records = wd.read_results(workdir, whole=True)
    eq = equivalence.Equivalence.from_dict(frozen.study_equivalence(config, records))
    result = verdict.analyze(records, eps_from_config(config), equivalence=eq)
    heads = [
        (f"{a}: " if len(result["verdicts"]) > 1 else "") + v.headline
        for a, v in result["verdicts"].items()
    ]
    note = (
        f"(no report written: TensorFlow is not installed here; write it where it is with "
        f"`python -m wide_tf.report --workdir={workdir}`)"
    )
    return "\n".join(heads + [note])


def conclude(workdir: str, verbose: bool) -> None:
    """A study's last words: its report written and the verdict's sentence printed; without
    TensorFlow, the verdict alone (TensorFlow is imported here, for the report only)."""
    if not tf_start.installed():
        print(without_report(workdir), flush=True)
        return
    tf_start.import_tensorflow(verbose)
    from wide_tf import report

    logging.info("Report: %s", report.write_report(workdir))
    print(report.verdict_line(workdir), flush=True)  # the verdict in one sentence
