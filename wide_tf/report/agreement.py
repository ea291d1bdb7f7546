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

from wide_tf.analysis import members, verdict
from wide_tf.analysis import prediction as pr

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


def main(argv=None) -> int:
    """`--workdir=DIR`: the prediction section of a finished study; with `--source=TEXT` (and
    `--study=NAME`), also its entry for docs/local_agreement.md. Bad flags: one line, exit 2; a
    workdir that is not a finished study: one line, exit 1."""
    from wide_tf.schema.cli import UsageParser  # bad flags: one line, exit 2

    ap = UsageParser(prog="python -m wide_tf.report.agreement", description=main.__doc__)
    ap.add_argument("--workdir", required=True, help="a finished study's workdir")
    ap.add_argument("--source", help="print a docs/local_agreement.md entry with this source")
    ap.add_argument("--study", help="with --source: the study's name in that entry")
    args = ap.parse_args(argv)
    from wide_tf import tf_start

    tf_start.import_tensorflow(verbose=False)  # the workdir reader's, without its start-up lines
    from wide_tf import report
    from wide_tf.report import prediction_section

    try:
        config, records, _ = report.read_workdir(args.workdir)
    except report.ReportError as e:
        return _fail(f"{e}; pass the workdir of a study (python -m wide_tf.main ...)")
    if not records:
        return _fail(f"{args.workdir} holds no finished trial; run the study first")
    result = verdict.analyze(records, members.DEFAULT_EPS)
    c = prediction_section.compare_study(config, records, result)
    print("\n".join(prediction_section.md_prediction(c, members.DEFAULT_EPS)))
    if args.source:
        print("\n".join(entry_lines(c, args.study or args.workdir, args.source)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
