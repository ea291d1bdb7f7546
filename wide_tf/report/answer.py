"""Owns a suite's report, WORKDIR/answer.md and answer.csv: one row per study of the suite and
target it recorded (data set x protocol x family x target -> verdict, slope and interval, B_crit
slope, the design's power, the sensitivity lines), the two-factor fit that splits each budget
family's slope into a width part and a depth part (per protocol, data set and architecture), each
study read together with its replicates (`wide_tf.analysis.pooled`), each momentum study's ramp
beside its S_min, and each study's wall time. It reads the studies' workdirs alone (as every
report does) and re-runs the same analysis as each study's own report.md.
"""

from __future__ import annotations

import csv
import io
import math
import os

from scipy import stats

from wide_tf.analysis import decision, equivalence, factors, frozen, pooled, robustness, verdict
from wide_tf.analysis.cells import records_for_target, target_labels
from wide_tf.analysis.members import summarize_members
from wide_tf.report.markdown import _md_table, md_transients
from wide_tf.report.protocol import config_value, eps_from_config
from wide_tf.report.writer import read_workdir
from wide_tf.schema import datasets
from wide_tf.store import suite_dir
from wide_tf.store import workdir as wd

COLUMNS = [
    "study",
    "data",
    "protocol",
    "family",
    "target",
    "verdict",
    "axis",
    "slope",
    "slope_low",
    "slope_high",
    "b_crit_slope",
    "b_crit_low",
    "b_crit_high",
    "detects_80pct",
    "power_at_observed",
    "slope_at_10_steps",
    "slope_at_10_low",
    "slope_at_10_high",
    "slope_per_added_step",
    "without_heaviest",
    "members",
]


def _iv(sl) -> str:
    return "-" if sl is None else f"{sl.value:+.2f} ({sl.low:+.2f} to {sl.high:+.2f})"


def _at10(sens):
    """The slope with 10 steps added to every run (the overhead curve's point), or None."""
    if sens is None or sens.curve is None:
        return None
    return sens.curve.at(robustness.PER_STEP_UPTO)


def _r(v):
    return None if v is None else round(v, 4)


NO_KIND = ("-", "-")  # a study without a config (the tests' simulated studies)


def study_kind(config: dict | None) -> tuple[str, str]:
    """(data set, architecture) of a study from its config.json: the data set's name with its
    pooling and subset ("mnist_embedded 7x7", "fashion_mnist_idx 7x7, 16000 images"), the model's
    architecture (`model.arch`). Readings that combine studies (two-factor fits, comparisons)
    keep these apart: members of different data sets or architectures are not one family."""
    if config is None:
        return NO_KIND
    name = str(config_value(config, "data.name"))
    pool = config_value(config, "data.pool") or 1
    if pool > 1 and name in datasets.DATASETS:  # the registry's shape after pooling
        h, w, _ = datasets.pooled(datasets.get(name), pool).input_shape
        name += f" {h}x{w}"
    elif pool > 1:
        name += f" pooled {pool}x{pool}"
    n = config_value(config, "data.num_train") or 0
    name += f", {n} images" if n else ""
    return name, str(config_value(config, "model.arch"))


def _group(e, kinds) -> tuple:
    """What a reading that combines studies keeps apart: protocol, data set, architecture."""
    return (e.protocol,) + kinds.get(e.name, NO_KIND)


def _study_rows(entry, records, eps, kind=NO_KIND) -> list[dict]:
    result = verdict.analyze(records, eps)
    rows = []
    # (records without a per-target list have the study's target alone)
    per_target = result["per_target"] or {"the target": result["verdicts"]}
    for k, (label, verdicts) in enumerate(per_target.items()):
        for v in verdicts.values():
            d, sens = v.decision, v.sensitivity
            mf, bc = d.model_free_slope, d.b_crit_slope
            heavy = None
            if mf is not None and d.heaviest:
                heavy = decision.heaviest_check(d.heaviest, d.without_heaviest, mf.decision)
            at10 = _at10(sens)
            rows.append(
                {
                    "study": entry.name,
                    "data": kind[0],
                    "protocol": entry.protocol,
                    "family": entry.family,
                    "target": label + (" (the study's)" if k == 0 else ""),
                    "verdict": v.outcome,
                    "axis": d.axis,
                    "slope": None if mf is None else round(mf.value, 4),
                    "slope_low": None if mf is None else round(mf.low, 4),
                    "slope_high": None if mf is None else round(mf.high, 4),
                    "b_crit_slope": None if bc is None else round(bc.value, 4),
                    "b_crit_low": None if bc is None else round(bc.low, 4),
                    "b_crit_high": None if bc is None else round(bc.high, 4),
                    "detects_80pct": None if sens is None else sens.min_detectable,
                    "power_at_observed": None
                    if sens is None or mf is None or not mf.decision
                    else _r(sens.power_observed),
                    "slope_at_10_steps": None if at10 is None else _r(at10.value),
                    "slope_at_10_low": None if at10 is None else _r(at10.low),
                    "slope_at_10_high": None if at10 is None else _r(at10.high),
                    "slope_per_added_step": None
                    if sens is None or sens.curve is None
                    else _r(sens.curve.per_step),
                    "without_heaviest": heavy,
                    "members": len(d.model_free_members),
                    "_at10": at10,
                    "_slope": mf,
                    "_bc": bc,
                }
            )
    return rows


def _first_target(records):
    return records_for_target(records, 0) if target_labels(records) else list(records)


def _pooled_rows(entries, loaded, eps, kinds=None, stamps=None) -> tuple[list[dict], list[str]]:
    """Each study read together with its replicates (entries naming it in `replicate_of`), at
    its own target, with the frozen margin where the set was designed to be read so: (table
    rows, one sentence each)."""
    rows, lines = [], []
    for e in entries:
        reps = [r for r in entries if r.replicate_of == e.name and r.name in loaded]
        if e.name not in loaded or not reps:
            continue
        names = [e.name] + [r.name for r in reps]
        p = pooled.decide(
            [summarize_members(_first_target(loaded[n]), eps) for n in names],
            equivalence=equivalence.Equivalence.from_dict(
                frozen.pooled_equivalence((stamps or {}).get(n) for n in names)
            ),
        )
        lines.append("- " + pooled.sentence(p, names))
        sl, bc, wh = p.slope, p.b_crit_slope, p.without_heaviest
        rows.append(
            {
                "study": " + ".join(names) + " (pooled)",
                "data": (kinds or {}).get(e.name, NO_KIND)[0],
                "protocol": e.protocol,
                "family": e.family,
                "target": "each study's own",
                "verdict": p.outcome,
                "axis": p.axis,
                "slope": None if sl is None else round(sl.value, 4),
                "slope_low": None if sl is None else round(sl.low, 4),
                "slope_high": None if sl is None else round(sl.high, 4),
                "b_crit_slope": None if bc is None else round(bc.value, 4),
                "b_crit_low": None if bc is None else round(bc.low, 4),
                "b_crit_high": None if bc is None else round(bc.high, 4),
                "detects_80pct": None,
                "power_at_observed": None,
                "slope_at_10_steps": None,
                "slope_at_10_low": None,
                "slope_at_10_high": None,
                "slope_per_added_step": None,
                "without_heaviest": None
                if sl is None
                else decision.heaviest_check(p.heaviest, wh, sl.decision),
                "members": len(p.members),
                "_at10": None,
                "_slope": sl,
                "_bc": bc,
            }
        )
    return rows, lines


def _two_factor(entries, loaded, eps, kinds=None) -> list[str]:
    """Per protocol, data set and architecture with a budget family and a width or depth family:
    the two-factor fit at the studies' first target, a replicate's members sharing their random
    effects with the study it repeats; the width-depth difference and the additivity test."""
    out, kinds = [], kinds or {}
    for key in dict.fromkeys(_group(e, kinds) for e in entries):
        protocol = key[0]
        mine = [e for e in entries if _group(e, kinds) == key and e.name in loaded]
        budget = [e.name for e in mine if e.family == "budget" and not e.replicate_of]
        # A budget family and its replicate alone hold one design twice: width and depth move
        # together there, so a width or depth family must be in the group.
        if not budget or not any(e.family != "budget" for e in mine):
            continue
        studies = {e.name: summarize_members(_first_target(loaded[e.name]), eps) for e in mine}
        reps = {e.name: e.replicate_of for e in mine if e.replicate_of}
        tf_ = factors.fit_studies(studies, budget_study=budget[0], replicate_of=reps)
        where = "" if key[1] == "-" else f", {key[1]}, {key[2]}"
        head = f"**{protocol}**{where} ({', '.join(studies)}; each study's first target)"
        if tf_ is None:
            out += [
                f"- {head}: the members cannot separate width from depth (too few, or collinear)."
            ]
            continue
        out.append(factor_line(head, tf_))
    return out


def _diff(a, b) -> str:
    """a - b of two studies' slopes, its 95% interval from their standard errors taken as
    independent (the studies share no runs), on the smaller of their df (conservative)."""
    if a is None or b is None:
        return "-"
    d = a.value - b.value
    h = float(stats.t.ppf(0.975, min(a.df, b.df))) * math.hypot(a.se, b.se)
    return f"{d:+.2f} ({d - h:+.2f} to {d + h:+.2f})"


def _protocols(entries, rows, kinds=None) -> list[str]:
    """Each other budget family against one before it, at their own target: the difference of
    the B_x and B_crit slopes with its interval. The one before it changes one thing where it
    can: an earlier study of the same data set and architecture under another protocol, else
    the first budget family (another data set or architecture, labelled)."""
    kinds = kinds or {}
    first = {r["study"]: r for r in rows if r["target"].endswith("(the study's)")}
    budgets = [e for e in entries if e.family == "budget" and not e.replicate_of]
    budgets = [e for e in budgets if e.name in first]
    if len(budgets) < 2:
        return []
    key, out = {e.name: _group(e, kinds) for e in budgets}, []
    for k, e in enumerate(budgets[1:], start=1):
        mine = key[e.name]
        same_data = [b for b in budgets[:k] if key[b.name][1:] == mine[1:]]
        base = next((b for b in same_data if b.protocol != e.protocol), budgets[0])
        if mine == key[base.name]:
            continue
        label = e.protocol + ("" if mine[1:] == key[base.name][1:] else f"; {mine[2]}, {mine[1]}")
        a, b = first[e.name], first[base.name]
        out.append(
            f"- {e.name} ({label}) minus {base.name} ({base.protocol}): B_x slope "
            f"{_diff(a['_slope'], b['_slope'])}; B_crit slope {_diff(a['_bc'], b['_bc'])}."
        )
    return out


def factor_line(head: str, tf_: factors.TwoFactor) -> str:
    """One two-factor fit in words: the coefficients, the budget slope's split with the
    difference of its parts, and the additivity test (every number with its interval)."""
    w, d = tf_.width, tf_.depth
    line = (
        f"- {head}: {tf_.n_members} member estimates of {tf_.n_groups} members (a replicate's "
        f"member shares its random effect with the study's), {tf_.df} df. Per log width at fixed "
        f"depth {_c(w)}; per log depth at fixed width {_c(d)}."
    )
    if tf_.width_part is not None:
        wp, dp, df_ = tf_.width_part, tf_.depth_part, tf_.difference
        line += (
            f" The budget family's slope on log width, {tf_.budget_slope:+.2f} by this fit, is a "
            f"width part {_c(wp)} plus a depth part {_c(dp)} (log depth falls "
            f"{-tf_.depth_per_width:.2f} per log width across its members); width part minus "
            f"depth part {_c(df_)}"
            + (": the data do not say which carries more." if df_.low <= 0 <= df_.high else ".")
        )
    if tf_.interaction is not None:
        line += (
            " Additivity: the product of centred log width and log depth adds "
            f"{_c(tf_.interaction)}"
            f" (p = {tf_.interaction_p:.2f})"
            + (
                ", no detectable departure from additive effects."
                if tf_.interaction.low <= 0 <= tf_.interaction.high
                else ": the two effects do not simply add."
            )
        )
    return line


def _c(c) -> str:
    return f"{c.value:+.2f} ({c.low:+.2f} to {c.high:+.2f})"


def _finding(entries, rows) -> str:
    """The scope sentence: what each family says at the budget study's own target."""
    first = {r["study"]: r for r in rows if r["target"].endswith("(the study's)")}
    parts = []
    for e in entries:
        r = first.get(e.name)
        if r is None:
            continue
        parts.append(
            f"{e.name} (the {e.family} family under {e.protocol}"
            + (f" on {r['data']}" if r.get("data", "-") != "-" else "")
            + (f", a replicate of {e.replicate_of}" if e.replicate_of else "")
            + f") says {r['verdict'].upper()} (slope on log {r['axis']} {_iv(r['_slope'])})"
        )
    return "At each study's own target: " + "; ".join(parts) + "." if parts else ""


def _read_studies(workdir: str, entries, read):
    """Each study's records and rows: (loaded {name: records}, rows, momentum lines, studies not
    yet run, eps, {study: (data set, architecture)}, {study: its frozen stamp or None})."""
    loaded, rows, transients, missing, eps, data, stamps = {}, [], [], [], None, {}, {}
    for e in entries:
        sub = suite_dir.study_dir(workdir, e)
        config, records = (read(sub)[:2]) if wd.exists(sub) else (None, [])
        if not records:
            missing.append(e.name)
            continue
        eps = eps_from_config(config)
        data[e.name] = study_kind(config)
        loaded[e.name] = records
        stamps[e.name] = frozen.stamp_of(config, records)[0]
        rows += _study_rows(e, records, eps, data[e.name])
        if "momentum" in e.protocol:
            tr = md_transients(summarize_members(records, eps), records)
            transients += [f"- **{e.name}**: {tr[2]}"] if tr else []
    return loaded, rows, transients, missing, eps, data, stamps


def _table(rows) -> list[str]:
    head = [
        "study",
        "data set",
        "protocol",
        "family",
        "target",
        "verdict",
        "B_x slope (95% CI)",
        "B_crit slope (95% CI)",
        "80% power at |slope| >=",
        "power at the observed slope",
        "slope at +10 steps per run (95% CI)",
        "without the heaviest member (the rule's check)",
    ]
    table = [
        [
            r["study"],
            r.get("data", "-"),
            r["protocol"],
            r["family"],
            r["target"],
            r["verdict"],
            _iv(r["_slope"]) + (f" on log {r['axis']}" if r["axis"] != "width" else ""),
            _iv(r["_bc"]),
            "-" if r["detects_80pct"] is None else f"{r['detects_80pct']:.2f}",
            "-" if r["power_at_observed"] is None else f"{r['power_at_observed']:.0%}",
            _iv(r["_at10"]),
            r["without_heaviest"] or "-",
        ]
        for r in rows
    ]
    return ["## Protocol x family x target", ""] + _md_table(head, table) + ["", _TABLE_NOTE, ""]


_TABLE_NOTE = (
    "The slope is log B_x(1+eps) per log width (per log depth in a depth family, where the "
    "paper's claim predicts a negative sign). Power is the smallest slope the study's own "
    "design finds 80% of the time at its estimated noise (simulated), and the share of such "
    "simulated studies that decide a true slope equal to the one observed. 'Slope at +10 "
    "steps': the slope with 10 steps added to every run's steps-to-target (each study's report "
    "gives the whole curve, answer.csv its change per added step). 'Without the heaviest "
    "member': the rule's own check, that member's slope at "
    f"{decision.HEAVIEST_LEVEL:.0%}; no 95% verdict is formed without it."
)


_POOLED_NOTE = (
    "Each member's log B_x(1+eps) pooled over the studies by inverse variance, then the "
    "verdict's rule on the pooled members (the slope without the member of the highest leverage "
    "at its level; analysis/pooled.py); its false rate and power on simulated pairs of studies: "
    "docs/power_table.txt."
)


def render(workdir: str, read=read_workdir) -> tuple[str, list[dict]]:
    """(answer.md's text, the table's rows) from a suite's workdir (`read`: a study folder ->
    (config, records, unreadable); the tests pass simulated studies)."""
    rec = suite_dir.read_record(workdir)
    entries = suite_dir.entries_of(rec)
    loaded, rows, transients, missing, eps, data, stamps = _read_studies(workdir, entries, read)
    lines = [
        "# The answer suite",
        "",
        f"Suite `{rec.get('suite', '?')}`, data "
        f"{', '.join(sorted({k[0] for k in data.values()})) or '-'}, eps "
        f"{eps if eps is not None else '-'}. Each study is a whole study of its own "
        "(its report: `<study>/report/report.md`); the verdicts below re-run the same analysis.",
        "",
    ]
    if missing:
        lines += [f"Not yet run (no finished trial): {', '.join(missing)}.", ""]
    together, sentences = (
        _pooled_rows(entries, loaded, eps, data, stamps) if eps is not None else ([], [])
    )
    if sentences:  # the headline: a study read with its replicate, before either alone
        lines += ["## Each study with its replicate, read together", ""] + sentences
        lines += ["", _POOLED_NOTE, ""]
    finding = _finding(entries, rows)
    lines += [finding, ""] if finding else []
    rows = together + rows
    lines += _table(rows)
    two = _two_factor(entries, loaded, eps, data) if eps is not None else []
    if two:
        lines += ["## Width and depth separated (two-factor fit)", ""] + two + [""]
    compared = _protocols(entries, rows, data)
    if compared:
        lines += ["## The budget family under each protocol and data set, compared", ""]
        lines += compared + [""]
    if transients:
        lines += ["## Momentum's ramp beside S_min", ""] + transients + [""]
    wall = rec.get("wall_s", {})
    if wall:
        lines += ["## Wall time of each study's last invocation", ""]
        lines += [f"- {e.name}: {wall[e.name] / 60:.1f} min" for e in entries if e.name in wall]
        lines += [""]
    return "\n".join(lines), rows


def write_suite_report(workdir: str) -> str:
    """Writes WORKDIR/answer.md and answer.csv; returns answer.md's path."""
    text, rows = render(workdir)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    wd.write_text_atomic(os.path.join(workdir, "answer.csv"), buf.getvalue())
    path = os.path.join(workdir, "answer.md")
    wd.write_text_atomic(path, text + "\n")
    return path
