"""Owns the claims table: one row per study (or study read with its replicate), each claim scoped
to what ran: the data and image size, the model size and width range, the protocol, the target,
the verdict by the rule (`wide_tf.analysis.decision`, four outcomes), its interval, the power of
its design, and whether it is confirmatory (frozen before it ran) or exploratory.

    python -m wide_tf.report --claims WORKDIR [WORKDIR ...]                 # finished studies
    python -m wide_tf.report.claims_table --recorded=docs/results/claims.json  # recorded numbers

A workdir is read from its files alone (config.json, the results; no TensorFlow), its verdict
computed by the rule with the equivalence margin its frozen design stated (none for an
exploratory study). A recorded row (`reread`) carries the numbers a study printed when it ran:
its slope and 95% interval, and the slope without its highest-leverage member with the interval
at the level it was printed at; the rule is applied to them again: the check converted to the
rule's level (the Knapp-Hartung interval is symmetric, value +- t x se on members - 3 df), and an
interval that holds 0 read "no detectable effect" only under a margin stated before the run.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from absl import flags
from scipy import stats

from wide_tf.analysis import decision, equivalence, frozen, pooled, robustness, verdict
from wide_tf.analysis.cells import records_for_target, target_labels
from wide_tf.analysis.members import summarize_members
from wide_tf.report.protocol import config_value, eps_from_config
from wide_tf.schema import cli, datasets
from wide_tf.store import workdir as wd

COLUMNS = (
    "claim",
    "data, image size",
    "models, width range",
    "protocol",
    "target",
    "verdict",
    "slope (95% CI)",
    "power",
    "design",
)


@dataclasses.dataclass(frozen=True)
class Claim:
    claim: str
    data: str
    models: str
    protocol: str
    target: str
    verdict: str
    interval: str
    power: str
    design: str

    def row(self) -> str:
        cells = dataclasses.astuple(self)
        return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


def _image(cfg: dict) -> str:
    name = config_value(cfg, "data.name", "?")
    try:
        spec = datasets.pooled(datasets.get(name), int(config_value(cfg, "data.pool", 1) or 1))
        h, w = spec.input_shape[:2]
        size = f"{h}x{w}"
    except (KeyError, ValueError, TypeError):
        size = "?"
    n = config_value(cfg, "data.num_train", 0)
    return f"{name} {size}" + (f", {int(n):,} images" if n else "")


def _protocol(cfg: dict) -> str:
    name = config_value(cfg, "optim.name", "?")
    mom = config_value(cfg, "optim.momentum", 0.0) or 0.0
    if name == "sgd" and not mom:
        return "plain SGD"
    if name in ("momentum", "sgd") and mom:
        return f"SGD, momentum {mom:g}"
    return f"{name}" + (f", momentum {mom:g}" if mom else "")


def _models(cfg: dict, members) -> str:
    arch = config_value(cfg, "model.arch", "?")
    budget = config_value(cfg, "sweep.family.budget")
    widths = [float(s.info.width) for s in members if s.info.width]
    kind = config_value(cfg, "sweep.family.kind", "?")
    size = f"{arch}, {kind} family" + (f" at {budget:,.0f} params" if budget else "")
    if len(widths) >= 2:
        lo, hi = min(widths), max(widths)
        size += f", {len(widths)} members, widths {lo:g}-{hi:g} ({hi / lo:.1f}x)"
    return size


def _claim_text(outcome: str, axis: str) -> str:
    what = f"B_x2 on log {axis}"
    return {
        decision.SUPPORTED: f"{what} rises (wider tolerates larger batches)",
        decision.CONTRADICTED: f"{what} falls",
        decision.NO_EFFECT: f"{what} flat within the frozen margin",
        decision.INCONCLUSIVE: f"{what}: not resolved",
    }[outcome]


def _read(path: str) -> tuple[dict, list[dict]]:
    cfg_path = wd.join(path, wd.CONFIG)
    cfg = wd.read_json(cfg_path) if wd.exists(cfg_path) else {}
    records = wd.read_results(path, whole=True)
    if not records:
        raise ValueError(f"{path} holds no finished trial: run the study first")
    return cfg, records


def _power(stamp: dict | None, d) -> str:
    if stamp and (stamp.get("equivalence") or {}).get("power_null") is not None:
        e = stamp["equivalence"]
        return f"no effect read in {e['power_null']:.0%} of null studies; margin {e['margin']:.2f}"
    md = robustness.min_detectable(d) if d is not None and d.model_free_slope else None
    return "-" if md is None else f"80% at slope {md:.2f} (own noise)"


def _target(cfg: dict) -> str:
    t = config_value(cfg, "train", {}) or {}
    return f"{t.get('target_metric', '?')} {t.get('target_value', '?')}"


def from_workdirs(paths: list[str]) -> Claim:
    """The claim of a study read together with its seed replicates (`A+B` on the command line):
    each member's log B_x2 pooled over the studies (`wide_tf.analysis.pooled`), at the first
    study's first target, with the equivalence margin only where a frozen design planned this
    pooling (`frozen.pooled_equivalence`)."""
    read = [_read(p) for p in paths]
    cfg = read[0][0]
    stamps = [frozen.stamp_of(c, r)[0] for c, r in read]
    eq = equivalence.Equivalence.from_dict(frozen.pooled_equivalence(stamps))
    eps = eps_from_config(cfg)
    studies = [
        summarize_members(records_for_target(r, 0) if target_labels(r) else list(r), eps)
        for _, r in read
    ]
    p = pooled.decide(studies, equivalence=eq)
    sl = p.slope
    interval = "-" if sl is None else f"{sl.value:+.2f} ({sl.low:+.2f} to {sl.high:+.2f})"
    labels = [frozen.label(c, r) for c, r in read]
    design = labels[0] if len(set(labels)) == 1 else "; ".join(labels)
    if all(stamps):
        design = (
            "confirmatory, frozen at "
            + " and ".join(f"{s['hash'][: frozen.HASH_CHARS]}" for s in stamps)
            + f" on {stamps[0].get('frozen_on')}"
            + ("" if eq else " (read without a margin)")
        )
    return Claim(
        claim=_claim_text(p.outcome, p.axis) + f" ({len(paths)} studies read together)",
        data=_image(cfg),
        models=_models(cfg, studies[0]),
        protocol=_protocol(cfg),
        target=_target(cfg),
        verdict=p.outcome,
        interval=interval,
        power=_power(stamps[0] if eq else None, None),
        design=design,
    )


def from_workdir(path: str) -> Claim:
    """The claim of a finished study in `path` (its config.json and results)."""
    cfg, records = _read(path)
    stamp, _ = frozen.stamp_of(cfg, records)
    eq = equivalence.Equivalence.from_dict(frozen.study_equivalence(cfg, records))
    result = verdict.analyze(records, eps_from_config(cfg), equivalence=eq)
    (v,) = list(result["verdicts"].values())[:1]
    d = v.decision
    sl = d.model_free_slope
    interval = "-" if sl is None else f"{sl.value:+.2f} ({sl.low:+.2f} to {sl.high:+.2f})"
    return Claim(
        claim=_claim_text(v.outcome, d.axis),
        data=_image(cfg),
        models=_models(cfg, d.members),
        protocol=_protocol(cfg),
        target=_target(cfg),
        verdict=v.outcome,
        interval=interval,
        power=_power(stamp if eq else None, d),
        design=frozen.label(cfg, records),
    )


def check_at_rule_level(value: float, low: float, high: float, level: float, df: int):
    """(low, high) of a symmetric t interval printed at `level` on `df` df, at the rule's
    level (`decision.HEAVIEST_LEVEL`)."""
    half = (high - low) / 2
    se = half / stats.t.ppf(0.5 + level / 2, df)
    t = stats.t.ppf(0.5 + decision.HEAVIEST_LEVEL / 2, df)
    return value - t * se, value + t * se


def reread(entry: dict) -> tuple[str, str]:
    """(outcome, why) of recorded numbers under the rule (module docstring). `entry`: slope,
    low, high; printed (the outcome it printed then), and for a decisive slope the check:
    without = [value, low, high, level, df]; margin (stated in advance, or absent)."""
    low, high = entry["low"], entry["high"]
    sign = 1 if low > 0 else -1 if high < 0 else 0
    if sign == 0:
        eq = equivalence.Equivalence.from_dict(entry.get("equivalence"))
        why = equivalence.reading(low, high, eq, -1 if entry.get("axis") == "depth" else 1)
        return (decision.INCONCLUSIVE, why) if why else (decision.NO_EFFECT, "")
    if entry.get("printed") == decision.INCONCLUSIVE:
        return decision.INCONCLUSIVE, entry.get("why", "inconclusive when it ran")
    value, wlo, whi, level, df = entry["without"]
    rlo, rhi = check_at_rule_level(value, wlo, whi, level, df)
    if not (rlo > 0 if sign > 0 else rhi < 0):
        return decision.INCONCLUSIVE, (
            f"without its heaviest member {value:+.2f} ({decision.HEAVIEST_LEVEL:.0%} CI "
            f"{rlo:+.2f} to {rhi:+.2f}): the check fails"
        )
    return (decision.SUPPORTED if sign > 0 else decision.CONTRADICTED), ""


def from_recorded(entry: dict) -> Claim:
    outcome, why = reread(entry)
    claim = entry["claim"] + (f" ({why})" if why and entry.get("show_why", True) else "")
    return Claim(
        claim=claim,
        data=entry["data"],
        models=entry["models"],
        protocol=entry["protocol"],
        target=entry["target"],
        verdict=outcome,
        interval=f"{entry['slope']:+.2f} ({entry['low']:+.2f} to {entry['high']:+.2f})",
        power=entry.get("power", "-"),
        design=entry.get("design", "exploratory"),
    )


def render(claims) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS)
    return head + "\n" + "\n".join(c.row() for c in claims) + "\n"


PROG = "python -m wide_tf.report --claims"
HELP = f"""\
Prints the claims table (markdown): one row per study, each claim scoped to what ran (the data,
the models, the protocol, the target), its verdict by the rule with its interval, the power of its
design, and whether it was frozen before it ran.

  {PROG} runs/mlp_local runs/wrn_fashion
  {PROG} --recorded=docs/results/claims.json --out=claims.md
  python -m wide_tf.report.claims_table --recorded=docs/results/claims.json

WORKDIR: a finished study's; A+B: a study and its replicate read together; --recorded: the
numbers the studies printed when they ran. Exit status 0; 2 for bad flags (one `error:` line); 1
for a workdir or file that cannot be read."""
# The command's own flags (schema/cli.py); `python -m wide_tf.report --claims` runs it too.
_FLAGS = cli.flag_values()
flags.DEFINE_string(
    "recorded", None, "a JSON list of recorded studies (docs/results/claims.json)", _FLAGS
)
flags.DEFINE_string("out", None, "write the table here instead of printing it", _FLAGS)


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]): flags, then finished studies' workdirs; its
    exit status."""
    return cli.run(_claims, _FLAGS, argv, prog=PROG, text=HELP, positional=True)


def _claims(argv) -> int:
    a, workdirs = cli.values(_FLAGS), argv[1:]
    if not workdirs and not a.recorded:
        cli.fail("give at least one WORKDIR or --recorded=FILE; e.g. --claims runs/mlp_local")
    claims = []
    try:
        if a.recorded:
            with open(a.recorded) as f:
                claims += [from_recorded(e) for e in json.load(f)]
        for arg in workdirs:
            paths = arg.split("+")  # a study and its replicates, read together
            for path in paths:
                if not wd.exists(path):
                    raise ValueError(f"workdir {path!r} does not exist; give a finished study's")
            claims.append(from_workdir(paths[0]) if len(paths) == 1 else from_workdirs(paths))
    except (OSError, ValueError, KeyError) as e:
        cli.fail(f"{e}; fix the input and run the same command again", 1)
    table = render(claims)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table)
    else:
        print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
