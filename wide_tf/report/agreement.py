"""Owns the agreement of a finished study's noise-scale prediction as an entry of
docs/local_agreement.md, where the measured agreement of the local sweeps is kept (data, not code:
a study's own report speaks of that study only).

    python -m wide_tf.report.agreement --workdir=DIR       # the prediction section of a finished
                                                            # study
    python -m wide_tf.report.agreement --workdir=DIR --study=NAME --source=TEXT
                                                            # ... and its docs/local_agreement.md
                                                            # entry

Not imported by `wide_tf.report` (so `-m` runs it once), and imports TensorFlow only through the
workdir reader, quietly, once its flags are checked.
"""

from __future__ import annotations

import sys

from absl import flags

from wide_tf.analysis import members, verdict
from wide_tf.analysis import prediction as pr
from wide_tf.schema import cli

ROW_HEADER = (
    "| member | width | B_simple at target | measured B_crit | ratio | model-free batch | ratio |"
)


def entry_lines(c: pr.Comparison, study: str, source: str) -> list[str]:
    """One entry of docs/local_agreement.md: the pooled ratios and slopes in a sentence, then one
    row per member (B_simple at the target, the sweep's B_crit and model-free batch, the ratios)."""
    pooled_mf = pr.fmt_est(c.pooled_ratio_model_free, "member")
    mf = pr.fmt_slope(c.slope_model_free)
    lines = [
        f"**{study}** ({source}): B_simple at the target / B_crit, pooled over members: "
        f"{pr.fmt_est(c.pooled_ratio, 'member')}"
        + (f"; / the model-free batch: {pooled_mf}" if pooled_mf != "-" else "")
        + f". Width slope of log B_simple {pr.fmt_slope(c.slope_predicted)}; the sweep's: log "
        f"B_crit {pr.fmt_slope(c.slope_measured)}"
        + (f", model-free {mf}" if mf != "-" else "")
        + ".",
        "",
        ROW_HEADER,
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {m.name} | {float(m.width or 0):g} | {pr.fmt_est(m.at_target)} | "
        f"{members.fmt_interval(m.b_crit)} | {pr.fmt_est(m.ratio_b_crit)} | "
        f"{members.fmt_interval(m.b_model_free)} | {pr.fmt_est(m.ratio_model_free)} |"
        for m in c.members
    ]
    return lines + [""]


def _fail(message: str) -> int:
    """A workdir that cannot be reported on: a runtime error, exit 1 (bad flags exit 2)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 1


PROG = "python -m wide_tf.report.agreement"
HELP = f"""\
Prints the noise-scale prediction of a finished study against what its sweep measured (the section
of its report), and with --source its entry for docs/local_agreement.md.

  {PROG} --workdir=runs/mlp_local
  {PROG} --workdir=runs/mlp_local --study=mlp_local --source="8 cores, 2 workers"

Exit status 0; 2 for bad flags (one `error:` line); 1 for a workdir that is not a finished
study."""
# The command's own flags (schema/cli.py).
_FLAGS = cli.flag_values()
flags.DEFINE_string("workdir", None, "a finished study's workdir", _FLAGS)
flags.DEFINE_string(
    "source", None, "print a docs/local_agreement.md entry with this source", _FLAGS
)
flags.DEFINE_string("study", None, "with --source: the study's name in that entry", _FLAGS)


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]); its exit status."""
    required = {"workdir": "pass a finished study's workdir, e.g. --workdir=runs/mlp_local"}
    return cli.run(_agreement, _FLAGS, argv, prog=PROG, text=HELP, required=required)


def _agreement(argv) -> int:
    a = cli.values(_FLAGS)
    from wide_tf import tf_start

    tf_start.import_tensorflow(verbose=False)  # the workdir reader's, without its start-up lines
    from wide_tf import report
    from wide_tf.report import prediction_section

    try:
        config, records, _ = report.read_workdir(a.workdir)
    except report.ReportError as e:
        return _fail(f"{e}; pass the workdir of a study (python -m wide_tf.main ...)")
    if not records:
        return _fail(f"{a.workdir} holds no finished trial; run the study first")
    result = verdict.analyze(records, members.DEFAULT_EPS)
    c = prediction_section.compare_study(config, records, result)
    print("\n".join(prediction_section.md_prediction(c, members.DEFAULT_EPS)))
    if a.source:
        print("\n".join(entry_lines(c, a.study or a.workdir, a.source)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
