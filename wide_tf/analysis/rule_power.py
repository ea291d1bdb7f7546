"""Owns the rule's error rates on one design at one scale: each simulated study (or pair, read
together) is drawn once per truth and read under every rule of interest, so the rates compare on
the same studies.

For each truth (a generator's null, the corner null, the effect B_crit ~ width^0.5 that sets the
equivalence margin) it counts: decisive with the check without the heaviest member at 85% and at
95% (the rule's level, `decision.HEAVIEST_LEVEL`), 'supported' at the rule's level, and the
equivalence reading "no detectable effect" (the interval holds 0 and its upper end lies inside
the margin; `wide_tf.analysis.equivalence`). Under a zero truth that last share is the design's
**power** to say no effect; with the truth at the margin it is its **size**.

    python -m wide_tf.analysis.rule_power --config=configs/wrn.py:fashion7 \\
        --b_crit_ref=213 --s_min=65 --sigma=0.131 --studies=200 --replicates=2

A frozen design (`wide_tf.analysis.frozen`) records these numbers; docs/results/calibration.md
tabulates them for every study the docs quote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time

import numpy as np
from absl import flags

from wide_tf.analysis import decision, equivalence, pooled, simulate
from wide_tf.analysis.members import DEFAULT_EPS, summarize_members
from wide_tf.analysis.stats import generators as gen
from wide_tf.analysis.stats import scale as scale_lib
from wide_tf.schema import cli
from wide_tf.schema.cli import integer, number

LEVELS = (0.85, 0.95)
NULL_TRUTHS = ("fitted", "widest x1.8")


@dataclasses.dataclass(frozen=True)
class Noise:
    """A study's noise as its docs record it (the fields `scale.Scale.apply` reads)."""

    sigma: float
    cell_sd: float = 0.035
    seed_share: float = 0.3

    def line(self) -> str:
        return (
            f"sigma {self.sigma:.3f}, cell sd {self.cell_sd:.3f}, seed share {self.seed_share:.2f}"
        )


@contextlib.contextmanager
def check_level(level: float):
    """The rule's check at `level` for the duration (decision and pooled read it per call)."""
    rule = decision.HEAVIEST_LEVEL
    decision.HEAVIEST_LEVEL = level
    try:
        yield
    finally:
        decision.HEAVIEST_LEVEL = rule


@dataclasses.dataclass
class Counts:
    truth: str
    n: int = 0
    decisive: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(LEVELS, 0))
    supported: int = 0  # at the rule's level
    no_effect: int = 0  # the equivalence reading at the margin
    inconclusive: int = 0  # at the rule's level, without a margin

    def rate(self, k: int) -> str:
        lo, hi = simulate.wilson(k, self.n)
        return f"{k / self.n:.1%} ({k}/{self.n}; {lo:.0%}-{hi:.0%})"

    def to_dict(self) -> dict:
        return {
            "truth": self.truth,
            "n": self.n,
            "decisive": {f"{lv:g}": k for lv, k in self.decisive.items()},
            "supported": self.supported,
            "no_effect": self.no_effect,
            "inconclusive": self.inconclusive,
        }


def _read(studies, eq: equivalence.Equivalence, counts: Counts) -> None:
    """One simulated study (or pair) read under each level, and by the margin."""
    counts.n += 1
    for level in LEVELS:
        with check_level(level):
            if len(studies) > 1:
                out = pooled.decide(studies, eq).outcome
            else:
                out = decision.decide(studies[0], eq).outcome
        if out in (decision.SUPPORTED, decision.CONTRADICTED):
            counts.decisive[level] += 1
        if level == decision.HEAVIEST_LEVEL:
            counts.supported += out == decision.SUPPORTED
            counts.no_effect += out == decision.NO_EFFECT
            counts.inconclusive += out == decision.INCONCLUSIVE


def run(design, truths, n, margin, replicates=1, n_boot=100, seed=0, eps=DEFAULT_EPS):
    """[Counts] per (name, Truth) in `truths`, `n` studies each (`replicates` per draw of
    nature, read together)."""
    # The design's own gate is what is measured here, so the reading assumes it passes.
    eq = equivalence.Equivalence(margin, 1.0, 0.0, "simulated")
    out = []
    for k, (name, truth) in enumerate(truths):
        rng = np.random.default_rng(seed + 1000 * k)
        c = Counts(name)
        for _ in range(n):
            mems = simulate.members_of(design, truth, rng)
            runs = [simulate.simulate_study(rng, design, truth, mems) for _ in range(replicates)]
            _read([summarize_members(r, eps, n_boot=n_boot) for r in runs], eq, c)
        out.append(c)
    return out


def truths_at(scale: scale_lib.Scale, num_train: int, names=NULL_TRUTHS, alpha=0.5):
    """[(label, Truth)]: each named generator's null at the scale, then the fitted effect."""
    got = [(n, scale.apply(gen.GENERATORS[n], num_train)) for n in names]
    fitted = scale.apply(gen.GENERATORS["fitted"], num_train)
    return got + [(f"fitted, B_crit ~ width^{alpha:g}", dataclasses.replace(fitted, alpha=alpha))]


def table(counts: list[Counts]) -> list[str]:
    rows = [
        "| truth | decisive, check at 85% | decisive, check at 95% (the rule) | 'supported' "
        "(the rule) | 'no detectable effect' inside the margin |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in counts:
        rows.append(
            f"| {c.truth} | {c.rate(c.decisive[0.85])} | {c.rate(c.decisive[0.95])} | "
            f"{c.rate(c.supported)} | {c.rate(c.no_effect)} |"
        )
    return rows


def summary(counts: list[Counts]) -> dict:
    """The design's numbers a frozen file records: the nulls' decisive rates at the rule's
    level, the power at the effect, and the equivalence reading's power (zero truth) and size
    (truth at the margin)."""
    by = {c.truth: c for c in counts}
    fitted, effect = by.get("fitted"), counts[-1]
    return {
        "null_decisive": {c.truth: c.decisive[decision.HEAVIEST_LEVEL] / c.n for c in counts[:-1]},
        "power_supported": effect.supported / effect.n,
        "power_null": None if fitted is None else fitted.no_effect / fitted.n,
        "size_margin": effect.no_effect / effect.n,
        "counts": [c.to_dict() for c in counts],
    }


PROG = "python -m wide_tf.analysis.rule_power"
HELP = f"""\
Prints the verdict rule's error rates on one design at one scale, each simulated study (or pair)
read under every rule: decisive under the nulls with the check without the heaviest member at 85%
and 95%, 'supported' under the effect B_crit ~ width^0.5, and the design's power to say "no
detectable effect" and its size at the equivalence margin. No TensorFlow.

  {PROG} --config=configs/wrn.py:fashion7 \\
      --b_crit_ref=213 --s_min=65 --sigma=0.131 --studies=200 --replicates=2

--b_crit_ref and --s_min place the design's scale (a pilot's narrowest member). Bad input is one
`error:` line on stderr and exit status 2."""
REQUIRED = {
    "b_crit_ref": "give the pilot's narrowest B_crit in examples, e.g. --b_crit_ref=213",
    "s_min": "give its S_min in steps, e.g. --s_min=65",
}


def define_flags(fv) -> None:
    """The rule's flags, in `fv`: this command's, and those of the freeze
    (`python -m wide_tf.analysis.frozen`), which simulates the same way."""
    flags.DEFINE_string("config", simulate.DEFAULT_CONFIG, "the study config simulated", fv)
    flags.DEFINE(number(0.0), "b_crit_ref", None, "the narrowest member's B_crit", fv)
    flags.DEFINE(number(0.0), "s_min", None, "its S_min in steps", fv)
    flags.DEFINE(
        number(0.0, high=5.0), "sigma", None, "the study's seed sigma (default: the nulls' own)", fv
    )
    flags.DEFINE(number(0.0, high=5.0), "cell_sd", 0.035, "with --sigma: the cell effect's sd", fv)
    flags.DEFINE(
        number(0.0, high=1.0), "seed_share", 0.3, "with --sigma: the seeds' shared share", fv
    )
    flags.DEFINE(integer(1, 100_000), "studies", 200, "simulated studies per truth", fv)
    flags.DEFINE(integer(1, 10), "replicates", 1, "studies read together (pooled)", fv)
    flags.DEFINE(integer(20, 100_000), "bootstrap", 100, "replicates per member", fv)
    flags.DEFINE(integer(0), "seed", 0, "the simulation's random seed", fv)
    flags.DEFINE_string("generators", ",".join(NULL_TRUTHS), "nulls, comma-separated", fv)


# The command's own flags (schema/cli.py).
_FLAGS = cli.flag_values()
define_flags(_FLAGS)
flags.DEFINE_string("json", None, "also write the counts to this file", _FLAGS)
# A frozen design is checked at the scale its study then measured with the margin it froze, not
# with the one the measured scale would give (that would move the question after the answer).
flags.DEFINE(
    number(0.0, high=5.0),
    "margin",
    None,
    "the equivalence margin (default: the noise-free slope of B_crit ~ width^0.5 at --b_crit_ref;"
    " give a frozen design's to check it at a measured scale)",
    _FLAGS,
)


def setup(a):
    """(design, scale, margin) from parsed flags, or the error line."""
    names = [n.strip() for n in a.generators.split(",") if n.strip()]
    bad = [n for n in names if n not in gen.GENERATORS]
    if bad or not names:
        return f"error: --generators={a.generators}: use some of {', '.join(gen.GENERATORS)}"
    try:
        design = simulate.design_from_config(a.config)
    except Exception as e:  # the loader's and the family's errors, as one line
        return f"error: --config={a.config}: {e}; give a study config such as configs/mlp.py:local"
    noise = None if a.sigma is None else Noise(a.sigma, a.cell_sd, a.seed_share)
    scale = scale_lib.Scale(a.b_crit_ref, a.s_min, noise, "given")
    margin = equivalence.noise_free_slope(a.b_crit_ref, design.widths, design.batch_sizes)
    if margin <= 0.01:
        return (
            f"error: at --b_crit_ref={a.b_crit_ref:g} B_crit ~ width^0.5 moves no member's B_x2 "
            f"inside the batches {list(design.batch_sizes)} (margin {margin:.3f}); give the "
            "pilot's narrowest B_crit, or a design whose batches reach past it"
        )
    return design, scale, margin, names


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]); its exit status."""
    return cli.run(_rule_power, _FLAGS, argv, prog=PROG, text=HELP, required=REQUIRED)


def _rule_power(argv) -> int:
    a = cli.values(_FLAGS)
    got = setup(a)
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 2
    design, scale, margin, names = got
    t0 = time.time()
    print(f"{a.config}: {len(design.widths)} members, batches {list(design.batch_sizes)}")
    print(scale.line(design.num_train))
    print(f"Equivalence margin (noise-free slope of B_crit ~ width^0.5 here): {margin:.3f}")
    if a.margin is not None:
        margin = a.margin
        print(f"Read at the given margin (--margin): {margin:.3f}")
    truths = truths_at(scale, design.num_train, names)
    counts = run(design, truths, a.studies, margin, a.replicates, a.bootstrap, a.seed)
    for line in table(counts):
        print(line, flush=True)
    took = time.time() - t0
    print(f"({a.studies} per truth, {a.replicates} stud(y/ies) each, {took:.0f} s)")
    if a.json:
        out = {
            "config": a.config,
            "scale": scale.line(design.num_train),
            "margin": margin,
            "replicates": a.replicates,
            "seconds": round(took),
            **summary(counts),
        }
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
