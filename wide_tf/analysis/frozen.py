"""Owns frozen designs: a study's config, verdict rule, targets, equivalence margin, seeds and its
simulated size and power, written to a file with its hash before the study runs, and the check
that a run is the frozen study and nothing else.

    python -m wide_tf.analysis.frozen --config=configs/wrn.py:fashion_confirm \\
        --b_crit_ref=213 --s_min=65 --sigma=0.131 --studies=200 --replicates=2 \\
        --pilot="a pilot" --out=configs/frozen/wrn_fashion_confirm.json

* **The file** holds the resolved config (less the machine-local fields `LOCAL_FIELDS`), its
  hash, the rule (its check level and eps), the primary and secondary targets, the margin, the
  seeds, the scale it was simulated at and the simulated rates (`wide_tf.analysis.rule_power`),
  the date, and `hash`: SHA-256 of all of it. Commit it before the first run; git then dates it.
* **The check.** `python -m wide_tf.main --config=... --frozen=FILE` (or, with no flag, the file
  `frozen/<config stem>_<variant>.json` beside the config when it exists) refuses to run unless
  the file is whole (its hash) and the resolved config, overrides included, is the frozen one
  (a field added to the schema since, at its default, is no difference): one line naming the
  first field that differs, exit 2.
* **The stamp.** A checked run exports `ENV` (the hash, the date, the margin and the simulated
  power and size); every provenance it writes (config.json, each result.json) carries it, so
  the report says "confirmatory, frozen at <hash> on <date>" only when every record does
  (`label`), and reads an interval that holds 0 by the frozen margin.

No TensorFlow.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import sys

from absl import flags

from wide_tf.schema import cli, fields, provenance
from wide_tf.schema.problems import UsageError

FORMAT = "wide_tf frozen design 1"
ENV = provenance.FROZEN_ENV
# Where the data sit on a machine, not what the study is.
LOCAL_FIELDS = (("data", "data_dir"), ("data", "download"))
HASH_CHARS = 12  # the short hash the report prints


class FrozenError(UsageError):
    """A frozen design that is missing, damaged, or not the config being run (one line)."""

    exit_code = 2


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_dict(config) -> dict:
    """The resolved config as plain JSON (tuples as lists), less `LOCAL_FIELDS`."""
    d = json.loads(_canonical(config.to_dict() if hasattr(config, "to_dict") else config))
    for section, key in LOCAL_FIELDS:
        if isinstance(d.get(section), dict):
            d[section].pop(key, None)
    return d


def config_hash(config) -> str:
    return hashlib.sha256(_canonical(config_dict(config)).encode()).hexdigest()


def content_hash(doc: dict) -> str:
    return hashlib.sha256(
        _canonical({k: v for k, v in doc.items() if k != "hash"}).encode()
    ).hexdigest()


def _targets(cfg: dict) -> dict:
    t = cfg.get("train") or {}
    return {
        "primary": f"{t.get('target_metric')}:{t.get('target_value')}",
        "secondary": list(t.get("extra_targets") or []),
    }


def design(config, spec: str, rule: dict, scale: dict, sim: dict, frozen_on: str) -> dict:
    """The frozen design document (with its hash)."""
    cfg = config_dict(config)
    sweep = cfg.get("sweep") or {}
    doc = {
        "format": FORMAT,
        "config_spec": spec,
        "config_hash": config_hash(config),
        "config": cfg,
        "rule": rule,
        "targets": _targets(cfg),
        "equivalence": {
            "margin": sim["margin"],
            "power_null": sim["power_null"],
            "size_margin": sim["size_margin"],
        },
        "seeds": {"tuning": sweep.get("seeds"), "confirm": sweep.get("confirm_seeds")},
        "scale": scale,
        "simulation": sim,
        "frozen_on": frozen_on,
    }
    doc["hash"] = content_hash(doc)
    return doc


def load(path: str) -> dict:
    """The frozen design at `path`, whole, or FrozenError."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise FrozenError(
            f"frozen design {path} cannot be read ({e.strerror}); give the committed file"
        ) from None
    except json.JSONDecodeError as e:
        raise FrozenError(
            f"frozen design {path} is not valid JSON ({e.msg}); restore it from git"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FrozenError(f"{path} is not a frozen design ({FORMAT!r}); give one that is")
    if doc.get("hash") != content_hash(doc):
        raise FrozenError(
            f"frozen design {path} does not match its own hash (edited after freezing); restore "
            "it from git, or freeze a new design and run it as a new study"
        )
    return doc


def _first_difference(a, b, path="") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    return None if a == b else f"{path} is {b!r}, frozen {a!r}"


def _added_since(frozen_cfg: dict, current: dict) -> dict:
    """`current` less the fields the frozen config lacks that hold their schema default: a field
    added to the schema after a design was frozen, at the default that computes what the code did
    before it (runtime.cohort=1: one run at a time), is not a change of the study. Any other value
    of it stays, and differs."""
    out = {}
    for section, values in current.items():
        frozen_section = frozen_cfg.get(section)
        if not isinstance(values, dict) or not isinstance(frozen_section, dict):
            out[section] = values
            continue
        out[section] = {
            k: v
            for k, v in values.items()
            if k in frozen_section or not _is_default(f"{section}.{k}", v)
        }
    return out


def _is_default(path: str, value) -> bool:
    field = fields.FIELDS.get(path)
    return field is not None and json.loads(_canonical(field.default)) == value


def check(config, path: str) -> dict:
    """The frozen design at `path` when `config` is the frozen config (fields added to the schema
    since, at their defaults, aside), else FrozenError."""
    doc = load(path)
    current = _added_since(doc["config"], config_dict(config))
    if hashlib.sha256(_canonical(current).encode()).hexdigest() != doc["config_hash"]:
        diff = _first_difference(doc["config"], current) or "the config differs"
        raise FrozenError(
            f"this config is not the study frozen in {path} ({diff}); run the frozen config "
            "unchanged, or freeze a new design for this one"
        )
    return doc


def default_file(spec: str | None) -> str | None:
    """`<config dir>/frozen/<stem>_<variant>.json` for `--config=<path>.py:<variant>`."""
    if not spec:
        return None
    path, _, variant = spec.partition(":")
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(os.path.dirname(path), "frozen", f"{stem}_{variant or 'default'}.json")


def config_spec(argv) -> str | None:
    """The --config=PATH[:VARIANT] of a command line (not its --config.x overrides)."""
    for arg in argv[1:]:
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def check_run(config, path: str | None, argv) -> dict | None:
    """main's check: the stamp of a run of the frozen design at `path` (--frozen), or of the
    file beside the config when there is one (`default_file`); None for an exploratory run.
    FrozenError when `config` is not the frozen one."""
    if path is None:
        guess = default_file(config_spec(argv))
        path = guess if guess and os.path.isfile(guess) else None
    if not path:  # an exploratory run never carries a stamp it inherited
        os.environ.pop(ENV, None)
        return None
    return stamp(check(config, path), path)


def stamp(doc: dict, path: str) -> dict:
    """What every provenance of the run carries (exported in `ENV` for its workers)."""
    s = {
        "hash": doc["hash"],
        "frozen_on": doc["frozen_on"],
        "file": path,
        "config_spec": doc.get("config_spec"),
        "equivalence": doc.get("equivalence"),
    }
    os.environ[ENV] = _canonical(s)
    return s


def stamp_of(config_json: dict | None, records) -> tuple[dict | None, str]:
    """(the stamp every record and the config carry, or None; why not when None)."""
    stamps = [((config_json or {}).get("provenance") or {}).get("frozen")]
    stamps += [(r.get("provenance") or {}).get("frozen") for r in records]
    hashes = {s.get("hash") if isinstance(s, dict) else None for s in stamps}
    if hashes == {None}:
        return None, "no frozen design"
    if len(hashes) > 1:
        return None, "its records do not all carry one frozen design's hash"
    return stamps[0], ""


def _design_of(s: dict) -> dict | None:
    """The frozen file a stamp names, where it is found (relative to the working folder, else to
    the checkout holding this package) and is the design the stamp hashed; else None."""
    name = s.get("file") or ""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in (name, os.path.join(root, name)):
        if name and os.path.isfile(path):
            try:
                doc = load(path)
            except FrozenError:
                return None
            return doc if doc.get("hash") == s.get("hash") else None
    return None


def pooled_equivalence(stamps) -> dict | None:
    """The equivalence margin (its dict) under which a study read together with its replicates
    may say "no detectable effect": only where every study of the set carries a frozen stamp,
    they share one margin, and the first one's design said it is read pooled over exactly this
    many studies. An exploratory set, or a frozen study read with an unplanned one, gets None:
    that reading is given only where a design was made for it."""
    stamps = list(stamps)
    if not stamps or any(not isinstance(s, dict) for s in stamps):
        return None
    margins = {_canonical(s.get("equivalence")) for s in stamps}
    doc = _design_of(stamps[0])
    if len(margins) != 1 or doc is None:
        return None
    if (doc.get("rule") or {}).get("pooled_replicates", 1) != len(stamps):
        return None
    return stamps[0].get("equivalence")


def study_equivalence(config_json: dict | None, records) -> dict | None:
    """The margin a study read alone may use: its frozen design's, where that design planned a
    single study (a pair's design is read pooled: `pooled_equivalence`)."""
    return pooled_equivalence([stamp_of(config_json, records)[0]])


def label(config_json: dict | None, records) -> str:
    """'confirmatory, frozen at <hash> on <date>' or 'exploratory (why)'; a study whose design is
    read pooled with its replicates says so (alone, it is not the confirmatory reading)."""
    s, why = stamp_of(config_json, records)
    if s is None:
        return f"exploratory ({why})"
    out = f"confirmatory, frozen at {s['hash'][:HASH_CHARS]} on {s.get('frozen_on')}"
    planned = ((_design_of(s) or {}).get("rule") or {}).get("pooled_replicates", 1)
    if planned > 1:  # the frozen reading is the pooled one (report/answer.py, --claims A+B)
        out += f", as {planned} studies read together (this study alone is not that reading)"
    return out


PROG = "python -m wide_tf.analysis.frozen"
HELP = f"""\
Freezes a study's design before it runs: simulates it at the given scale (the verdict rule's error
rates, its power and size at the equivalence margin) and writes the frozen file, the resolved
config with its hash, that `python -m wide_tf.main` then checks every run against. No TensorFlow.

  {PROG} --config=configs/wrn.py:fashion_confirm \\
      --b_crit_ref=213 --s_min=65 --sigma=0.131 --studies=200 --replicates=2 \\
      --pilot="a pilot" --out=configs/frozen/wrn_fashion_confirm.json

A frozen file is never rewritten (an existing --out is refused). Bad input is one `error:` line
on stderr and exit status 2."""


def _replicate(text) -> tuple[str, str]:
    """--replicate=CONFIG,OUT: split at the last comma (a config's variant arguments may hold
    commas; a file name seldom does)."""
    spec, comma, out = str(text).rpartition(",")
    if not (comma and spec.strip() and out.strip()):
        raise ValueError(
            f"expected CONFIG,OUT, got {text!r}; e.g. "
            "--replicate=configs/wrn.py:fashion_confirm_replicate,"
            "configs/frozen/wrn_fashion_confirm_replicate.json"
        )
    return spec.strip(), out.strip()


@functools.cache
def _flags():
    """The freeze's flags: the rule's (rule_power.define_flags), then its own; built on the first
    call, since wide_tf.main imports this module for the check alone."""
    from wide_tf.analysis import rule_power

    fv = cli.flag_values()
    rule_power.define_flags(fv)
    flags.DEFINE_string("out", None, "the frozen design file to write", fv)
    flags.DEFINE_string("pilot", "", "where the scale was read (a pilot, a study)", fv)
    flags.DEFINE(
        cli.Typed(_replicate, "CONFIG,OUT"),
        "replicate",
        None,
        "the seed replicate read with it, CONFIG,OUT: its config and frozen file (the same "
        "simulation)",
        fv,
    )
    return fv


def _documents(a, margin, counts) -> tuple[dict, dict, dict]:
    """(simulation, rule, scale) of a frozen design from the parsed flags and the counts."""
    from wide_tf.analysis import decision, rule_power
    from wide_tf.analysis.members import DEFAULT_EPS

    sim = {
        "studies": a.studies,
        "replicates": a.replicates,
        "bootstrap": a.bootstrap,
        "seed": a.seed,
        "margin": margin,
        **rule_power.summary(counts),
    }
    rule = {
        "name": "random-effects slope of log B_x(1+eps) on log width, leave-one-out, the check "
        "without the heaviest member, B_crit sign, censoring, grid edges; equivalence margin",
        "heaviest_level": decision.HEAVIEST_LEVEL,
        "eps": DEFAULT_EPS,
        "pooled_replicates": a.replicates,
    }
    scale_doc = {
        "b_crit_ref": a.b_crit_ref,
        "s_min": a.s_min,
        "sigma": a.sigma,
        "cell_sd": a.cell_sd,
        "seed_share": a.seed_share,
        "source": a.pilot,
    }
    return sim, rule, scale_doc


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]); its exit status."""
    from wide_tf.analysis import rule_power

    required = {**rule_power.REQUIRED, "out": "e.g. --out=configs/frozen/<study>.json"}
    return cli.run(_freeze, _flags(), argv, prog=PROG, text=HELP, required=required)


def _freeze(argv) -> int:
    from wide_tf.analysis import rule_power
    from wide_tf.checks import loader

    a = cli.values(_flags())
    outs = [(a.config, a.out)] + ([a.replicate] if a.replicate else [])
    for _, out in outs:
        if os.path.exists(out):
            print(
                f"error: {out} exists: a frozen design is never rewritten; delete it only if no "
                "study has run on it, or write a new file",
                file=sys.stderr,
            )
            return 2
    try:
        configs = [(spec, out, loader.load_config(spec)) for spec, out in outs]
    except Exception as e:  # the loader's one-line errors
        print(f"error: {e}", file=sys.stderr)
        return 2
    got = rule_power.setup(a)
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 2
    design_, scale, margin, names = got
    truths = rule_power.truths_at(scale, design_.num_train, names)
    counts = rule_power.run(design_, truths, a.studies, margin, a.replicates, a.bootstrap, a.seed)
    for line in rule_power.table(counts):
        print(line)
    sim, rule, scale_doc = _documents(a, margin, counts)
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    for spec, out, config in configs:
        doc = design(config, spec, rule, scale_doc, sim, today)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"frozen at {doc['hash'][:HASH_CHARS]} on {today}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
