"""Owns the study simulator: whole studies with a known answer, run through the real protocol
(`wide_tf.study.lr_grid`) and the real analysis (`wide_tf.analysis.verdict`), to calibrate the
verdict.

The design (members, batches, learning-rate grid, seeds, budget, evaluation cadence) is read from
a study config (default `configs/mlp.py:local`), so the calibration is of the study a user runs.
What nature does is a generator (`wide_tf.analysis.stats.generators`): a simulated run of member
w at batch B and learning-rate multiplier m takes

    S = S_curve(B) * (1 + c log(m / m*)^2) * cell effect * seed effect * exp(sigma Z) + overhead

steps to the target, where S_curve is the member's curve (McCandlish et al.'s, or one that differs
from it), m* a per-cell optimum scattered about the scaling rule's guess, the cell effect shared by
the cell's seeds, the seed effect shared by a seed's runs at every batch size of the member, and
sigma Z the run's own noise (the default sizes are those the local studies measure:
`wide_tf.analysis.stats.generators.MEASURED`). A rate more than `diverge_factor` x m* diverges. A
run is censored by its budget (max(max_epochs * n / B, min_steps) steps, as in `train.py`), and is
seen only at the evaluation cadence: the target is detected at the first evaluation at or after S,
and the interpolated crossing lands between that evaluation and the one before.

    python -m wide_tf.analysis.simulate    # the calibration table quoted in the README
    python -m wide_tf.analysis.simulate --studies=200 --generators=fitted,overhead
    python -m wide_tf.analysis.simulate --scale_from=WORKDIR   # at a finished study's own scale

**The scale.** The generators' curves are placed by the narrowest member's B_crit (`b_crit_ref`,
examples) and S_min (steps). Their reference (30 examples, 2 epochs of S_min B_crit / n) was set
on the 8x8 digits' earliest studies; the power of a design depends on where B_crit sits against
its batches, so `--b_crit_ref` and `--s_min` place it elsewhere, and `--scale_from=WORKDIR` reads
both off a finished study (its narrowest member's fitted curve) together with its noise (as
`python -m wide_tf.analysis.calibration WORKDIR` reads it), which then replaces the measured noise
of every generator that keeps the default noise. Every table says which scale and noise it used.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time

import numpy as np
from absl import flags

from wide_tf.analysis import decision, pooled, seed_variance, verdict
from wide_tf.analysis.members import DEFAULT_EPS, summarize_members
from wide_tf.analysis.stats import generators as gen
from wide_tf.analysis.stats import scale as scale_lib
from wide_tf.analysis.stats.generators import Truth
from wide_tf.schema import cli, fields
from wide_tf.schema import plan as plan_lib
from wide_tf.schema.cli import integer, number
from wide_tf.study import lr_grid

DEFAULT_CONFIG = "configs/mlp.py:local"


@dataclasses.dataclass(frozen=True)
class Design:
    """What the experimenter chooses (defaults: the shape of `configs/mlp.py:local`; a config's
    own design comes from `design_from_config`)."""

    widths: tuple = (64.0, 79.0, 92.0, 117.0, 140.0, 189.0, 667.0)
    depths: tuple = (12, 8, 6, 4, 3, 2, 1)
    batch_sizes: tuple = (8, 16, 32, 64, 128, 176)
    lr_multipliers: tuple = (0.5, 1.0, 2.0)
    tuning_seeds: tuple = (0, 1)
    confirm_seeds: tuple = (2, 3, 4)
    max_lr_extensions: int = 4
    num_train: int = 1438
    max_epochs: float = 30.0
    min_steps: int = 400
    eval_every_examples: int = 144


def design_from_config(spec: str = DEFAULT_CONFIG) -> Design:
    """The design of a study config (members resolved as the study resolves them; no TensorFlow)."""
    from wide_tf.checks import loader, validate
    from wide_tf.schema import families

    config = loader.load_config(spec)
    num_train, classes, shape, _ = validate.dataset_facts(config)
    s, t = config.sweep, config.train
    members = families.from_config(
        config.model.arch, s.family, num_classes=classes, input_shape=shape, norm=config.model.norm
    )
    members = sorted(members, key=lambda m: m.width)
    return Design(
        widths=tuple(float(m.width) for m in members),
        depths=tuple(int(m.depth) for m in members),
        batch_sizes=tuple(int(b) for b in s.batch_sizes),
        lr_multipliers=tuple(float(m) for m in s.lr_multipliers),
        tuning_seeds=tuple(int(v) for v in s.seeds),
        confirm_seeds=tuple(int(v) for v in s.confirm_seeds),
        max_lr_extensions=int(s.max_lr_extensions) if s.extend_lr_grid else 0,
        num_train=int(num_train),
        max_epochs=float(t.max_epochs),
        min_steps=int(t.min_steps),
        eval_every_examples=int(t.eval_every_examples) or int(num_train),
    )


def _budget(design: Design, batch: int) -> int:
    return plan_lib.budget_steps(
        max_steps=0,
        max_epochs=design.max_epochs,
        min_steps=design.min_steps,
        num_train=design.num_train,
        batch=batch,
    )


@functools.lru_cache(maxsize=1024)
def _eval_steps(design: Design, batch: int, budget: int) -> np.ndarray:
    # The same few (batch, budget) pairs for every run of a study: computed once (a third of a
    # simulated study's time otherwise).
    return np.asarray(plan_lib.eval_steps(batch, design.eval_every_examples, budget))


@dataclasses.dataclass(frozen=True)
class _Member:
    name: str
    width: float
    depth: int
    b_crit: float
    s_min: float
    exponent: float
    widest: bool
    noise_scale: float = 1.0  # this member's seed noise relative to the generator's


def simulate_run(
    rng,
    design: Design,
    truth: Truth,
    mem: _Member,
    batch: int,
    m_opt: float,
    cell: float,
    mult: float,
    seed: int,
    role: str,
    seed_effect: float = 1.0,
) -> dict:
    budget = _budget(design, batch)
    rec = {
        "trial_id": f"{mem.name}_b{batch}_lr{mult:g}_s{seed}",
        "member": mem.name,
        "arch": "sim",
        "depth": mem.depth,
        "width": mem.width,
        "params": 50_000,
        "batch_size": batch,
        "lr_multiplier": mult,
        "learning_rate": 0.1 * mult,
        "seed": seed,
        "role": role,
        "num_train": design.num_train,
        "budget_steps": budget,
        "steps_to_target": None,
        "steps_to_target_interp": None,
        "epochs_to_target": None,
    }
    if mult > truth.diverge_factor * m_opt:
        rec.update(status="diverged", steps=int(rng.integers(1, 20)))
        return rec
    s = float(gen.curve_steps(mem.s_min, mem.b_crit, batch, mem.exponent))
    s *= 1 + truth.lr_curvature * math.log(mult / m_opt) ** 2
    lb = np.log(design.batch_sizes)
    pos = (math.log(batch) - lb.min()) / (np.ptp(lb) or 1.0)
    s *= cell * truth.seed_draw(rng, pos, mem.noise_scale) * seed_effect

    s += truth.overhead_steps
    if s > budget:
        rec.update(status="not_reached", steps=budget)
        return rec
    evals = _eval_steps(design, batch, budget)
    i = int(np.searchsorted(evals, s))  # first evaluation at or after the crossing
    seen = int(evals[min(i, len(evals) - 1)])
    prev = int(evals[i - 1]) if i > 0 else 0
    # A crossing interpolated on a noisy metric lands near, not at, the true one.
    interp = min(max(s + (rng.random() - 0.5) * 0.5 * (seen - prev), prev), seen)
    rec.update(
        status="reached",
        steps=seen,
        steps_to_target=seen,
        steps_to_target_interp=interp,
        epochs_to_target=seen * batch / design.num_train,
    )
    return rec


def members_of(design: Design, truth: Truth, rng, eps: float = DEFAULT_EPS):
    b_crits = gen.member_b_crits(truth, design.widths, design.batch_sizes, eps, rng)
    ps = gen.member_exponents(truth, design.widths)
    deepest = max(design.depths)
    widest = max(design.widths)
    # S_min from the narrowest member's B_crit: the members share S_min unless told otherwise.
    s_min = truth.epochs_small_batch * design.num_train / truth.b_crit_ref
    ld = np.log(np.asarray(design.depths, dtype=float))
    pos = (ld - ld.min()) / (np.ptp(ld) or 1.0)  # 0 shallowest .. 1 deepest
    spread = truth.s_min_spread ** (pos - 1.0)  # the deepest keeps S_min, the shallowest / spread
    scales = np.ones(len(design.widths))
    if truth.noise_spread != 1.0:  # drawn only here, so the other generators' streams are as before
        scales = truth.noise_spread ** (rng.random(len(design.widths)) - 0.5)
    return [
        _Member(
            f"sim-d{d}-w{w:g}",
            w,
            d,
            bc,
            s_min * f * (truth.deepest_s_min_factor if d == deepest else 1.0),
            p,
            w == widest,
            float(k),
        )
        for w, d, bc, p, f, k in zip(design.widths, design.depths, b_crits, ps, spread, scales)
    ]


def simulate_study(
    rng: np.random.Generator, design: Design, truth: Truth, members: list | None = None
) -> list[dict]:
    """Every record of one simulated study, driven by the real learning-rate protocol; `members`
    (from `members_of`) lets a replicate share nature's draw with the study it repeats."""
    records = []
    b0 = min(design.batch_sizes)
    seeds = tuple(design.tuning_seeds) + tuple(design.confirm_seeds)
    for mem in members if members is not None else members_of(design, truth, rng):
        shared = {s: math.exp(truth.seed_effect * rng.standard_normal()) for s in seeds}
        for batch in design.batch_sizes:
            log_m = truth.lr_opt_spread * rng.standard_normal()
            if mem.widest:
                log_m += truth.lr_drift_widest * math.log2(batch / b0)
            m_opt = math.exp(log_m)
            cell = truth.cell_draw(rng)
            args = (rng, design, truth, mem, batch, m_opt, cell)
            runs = [
                simulate_run(*args, m, s, lr_grid.TUNE, shared[s])
                for m in design.lr_multipliers
                for s in design.tuning_seeds
            ]
            while True:
                nxt = lr_grid.next_runs(
                    runs,
                    design.lr_multipliers,
                    design.tuning_seeds,
                    design.confirm_seeds,
                    design.max_lr_extensions,
                    extend=design.max_lr_extensions > 0,
                )
                if not nxt:
                    break
                runs += [simulate_run(*args, m, s, role, shared.get(s, 1.0)) for m, s, role in nxt]
            records += runs
    return records


@dataclasses.dataclass(frozen=True)
class Calibration:
    n_studies: int
    supported: int
    contradicted: int
    no_effect: int
    inconclusive: int
    median_min_detectable: float | None
    examples_per_study: float = 0.0  # mean over studies of sum(steps x batch) over its runs


def calibrate(
    design: Design,
    truth: Truth,
    n_studies: int,
    seed: int = 0,
    eps: float = DEFAULT_EPS,
    n_boot: int = 200,
    replicates: int = 1,
) -> Calibration:
    """Runs n_studies simulated studies through the analysis and counts the outcomes. With
    `replicates` > 1 each study is run that many times on fresh noise over one draw of nature
    (the members' true curves) and read together (`wide_tf.analysis.pooled`)."""
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(
        (verdict.SUPPORTED, verdict.CONTRADICTED, verdict.NO_EFFECT, verdict.INCONCLUSIVE), 0
    )
    mds, examples = [], 0.0
    for _ in range(n_studies):
        mems = members_of(design, truth, rng)
        runs = [simulate_study(rng, design, truth, mems) for _ in range(replicates)]
        examples += sum(float(r.get("steps") or 0) * r["batch_size"] for rs in runs for r in rs)
        studies = [summarize_members(recs, eps, n_boot=n_boot) for recs in runs]
        if replicates > 1:
            counts[pooled.decide(studies).outcome] += 1
            continue
        d = verdict.decide(studies[0])
        counts[d.outcome] += 1
        if d.model_free_slope is not None:
            mds.append(d.model_free_slope.min_detectable)
    return Calibration(
        n_studies,
        counts[verdict.SUPPORTED],
        counts[verdict.CONTRADICTED],
        counts[verdict.NO_EFFECT],
        counts[verdict.INCONCLUSIVE],
        float(np.median(mds)) if mds else None,
        examples / n_studies,
    )


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson 95% interval of a binomial rate k / n."""
    z = 1.959964
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def _rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k / n:.1%} ({k}/{n}; {lo:.0%}-{hi:.0%})"


def table(
    design: Design,
    names,
    n_studies: int,
    alpha: float,
    n_boot: int,
    seed: int = 0,
    power_for=None,
    replicates: int = 1,
    generators=None,
) -> list[str]:
    """One row per generator: the decisive rate under its null and (for the generators in
    `power_for`, default all) 'supported' under B_crit ~ width^alpha, with Wilson 95% intervals,
    and the mean examples processed per study (steps x batch over every run: the compute).
    `generators` maps the names to their Truth (default: generators.GENERATORS, at the
    reference scale)."""
    generators = gen.GENERATORS if generators is None else generators
    rows = [
        "| generator | decisive under the null | 'supported' with B_crit ~ width^"
        f"{alpha:g} | inconclusive (null / effect) | examples per study |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k, name in enumerate(names):
        truth = name if isinstance(name, Truth) else generators[name]
        null = calibrate(
            design, truth, n_studies, seed=seed + 100 + k, n_boot=n_boot, replicates=replicates
        )
        eff = None
        if power_for is None or name in power_for:
            eff_truth = dataclasses.replace(truth, alpha=alpha)
            eff = calibrate(
                design,
                eff_truth,
                n_studies,
                seed=seed + 200 + k,
                n_boot=n_boot,
                replicates=replicates,
            )
        rows.append(
            f"| {truth.name} | {_rate(null.supported + null.contradicted, n_studies)} | "
            + ("-" if eff is None else _rate(eff.supported, n_studies))
            + f" | {null.inconclusive / n_studies:.0%} / "
            + ("-" if eff is None else f"{eff.inconclusive / n_studies:.0%}")
            + f" | {null.examples_per_study:.3g} |"
        )
    return rows


def with_overrides(design: Design, extra_seeds: int = 0, batches: str = "") -> Design:
    """The design with `extra_seeds` more confirmation seeds per cell and/or other batch sizes
    (comma-separated): the design simulation's variants of a config."""
    if extra_seeds:
        top = max(design.tuning_seeds + design.confirm_seeds)
        more = tuple(range(top + 1, top + 1 + extra_seeds))
        design = dataclasses.replace(design, confirm_seeds=design.confirm_seeds + more)
    if batches:
        design = dataclasses.replace(
            design, batch_sizes=tuple(int(b) for b in batches.split(",") if b.strip())
        )
    return design


def _summaries_of(workdir: str):
    """The member summaries of a finished study's results (plain JSON files, no TensorFlow)."""
    return summarize_members(seed_variance.read_records(workdir), n_boot=20)


def _scale(a) -> scale_lib.Scale | str:
    """The scale the flags ask for, or the error line."""
    if a.scale_from and (a.b_crit_ref or a.s_min):
        return "error: --scale_from reads B_crit and S_min off the study; drop --b_crit_ref/--s_min"
    if a.scale_from:
        try:
            noise = seed_variance.summarize(seed_variance.read_records(a.scale_from))
            return scale_lib.scale_from(a.scale_from, _summaries_of(a.scale_from), noise)
        except (OSError, ValueError) as e:
            return f"error: --scale_from={a.scale_from}: {e}; give a finished study's workdir"
    if a.b_crit_ref or a.s_min:
        return scale_lib.Scale(
            b_crit_ref=a.b_crit_ref or gen.Truth.b_crit_ref,
            s_min=a.s_min,
            source="given by --b_crit_ref/--s_min",
        )
    return scale_lib.Scale()


def _setup(a) -> tuple[Design, list[str]] | str:
    """(the design, the generators' names) from the parsed flags, or the error line."""
    names = [n.strip() for n in a.generators.split(",") if n.strip()]
    unknown = [n for n in names if n not in gen.GENERATORS]
    if unknown or not names:
        return (
            f"error: --generators={a.generators}: "
            + (f"unknown {', '.join(unknown)}" if unknown else "names no generator")
            + f"; use some of {', '.join(gen.GENERATORS)}, comma-separated"
        )
    if not (1 <= a.studies <= MAX_COUNT and 20 <= a.bootstrap <= MAX_COUNT):
        return (
            f"error: --studies={a.studies} --bootstrap={a.bootstrap}: --studies must be >= 1 and "
            f"--bootstrap >= 20, each at most {MAX_COUNT}; e.g. --studies=200 --bootstrap=200"
        )
    try:
        design = with_overrides(design_from_config(a.config), a.extra_seeds, a.batches)
    except Exception as e:  # the config loader's and the family's errors, as one line
        return f"error: --config={a.config}: {e}; give a study config such as {DEFAULT_CONFIG}"
    scale = _scale(a)
    if isinstance(scale, str):
        return scale
    n = design.num_train
    # This run's generators at this scale (the module's registry stays at the reference).
    a.generators = {k: scale.apply(v, n) for k, v in gen.GENERATORS.items()}
    a.scale_line = scale.line(n)
    if a.noise is not None:
        a.generators = {k: dataclasses.replace(v, noise=a.noise) for k, v in a.generators.items()}
        a.scale_line += f"; the run's own seed sigma {a.noise:g} in every generator (--noise)"
    if a.residuals_from:
        try:
            resampled = gen.from_residuals(_summaries_of(a.residuals_from), a.residuals_from)
            names.append(scale.apply(resampled, n))
        except (OSError, ValueError) as e:
            return (
                f"error: --residuals_from={a.residuals_from}: {e}; give a finished study's workdir"
            )
    return design, names


# Bounds on the flags that could run away (--noise=1e308 overflowed, --bootstrap=1e11
# asked for 745 GiB, --replicates and --extra_seeds were unbounded). MAX_COUNT studies or
# replicates take hours already (200 x 200 take minutes); a seed-noise sigma of MAX_NOISE on log
# steps-to-target is a 150-fold spread per seed, about 40x the generators' own (0.12,
# analysis/stats/generators.py).
MAX_COUNT, MAX_NOISE = 100_000, 5.0
MAX_EXTRA_SEEDS = MAX_REPLICATES = 1_000


def _batches(text) -> str:
    """--batches: at least two distinct integers in [1, 2^24] (B_x compares the two smallest)."""
    try:
        values = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if text.strip() and (
        len(set(values)) < 2 or any(not 1 <= b <= fields.MAX_BATCH for b in values)
    ):
        raise ValueError(
            f"{text!r}: use at least two distinct batch sizes, each an integer >= 1 and "
            f"<= {fields.MAX_BATCH}, e.g. 32,64,128"
        )
    return text


PROG = "python -m wide_tf.analysis.simulate"
HELP = f"""\
Simulates whole studies of a config's design with a known answer (B_crit growing with width, or
not), through the study's real protocol and analysis, and prints how often the verdict is right:
its power and error rates, per generator of what the runs do. Nothing is trained (no TensorFlow,
no data set).

  {PROG}
  {PROG} --studies=200 --generators=fitted,overhead
  {PROG} --config=configs/mlp.py:local --scale_from=WORKDIR

The last at a finished study's own scale and noise. Bad input is one `error:` line on stderr and
exit status 2."""
LEVEL_HELP = "the check without the heaviest member at this level, not the rule's (what it costs)"
# The command's own flags (schema/cli.py): calibration and rule_power import this module.
_FLAGS = cli.flag_values()
flags.DEFINE(integer(), "studies", 200, "simulated studies per table cell", _FLAGS)
flags.DEFINE_string(
    "generators",
    ",".join(gen.GENERATORS),
    f"comma-separated (default: all), of: {', '.join(gen.GENERATORS)}",
    _FLAGS,
)
flags.DEFINE_string("config", DEFAULT_CONFIG, "the study whose design is simulated", _FLAGS)
flags.DEFINE(number(), "alpha", 0.5, "effect: B_crit ~ width^alpha", _FLAGS)
flags.DEFINE(
    number(0.0, high=MAX_NOISE),
    "noise",
    None,
    "the run's own seed-noise sigma, every generator (default: each generator's own)",
    _FLAGS,
)
flags.DEFINE(number(0.0), "b_crit_ref", None, "the narrowest member's B_crit (default: 30)", _FLAGS)
flags.DEFINE(
    number(0.0), "s_min", None, "its S_min in steps (default: 2 epochs x n / B_crit)", _FLAGS
)
flags.DEFINE_string(
    "scale_from", None, "a finished study's workdir: B_crit, S_min, noise read off it", _FLAGS
)
flags.DEFINE(integer(), "bootstrap", 200, "replicates per member", _FLAGS)
flags.DEFINE(integer(0), "seed", 0, "the simulation's random seed", _FLAGS)
flags.DEFINE(
    integer(0, MAX_EXTRA_SEEDS), "extra_seeds", 0, "more confirmation seeds per cell", _FLAGS
)
flags.DEFINE(
    cli.Typed(_batches, "comma-separated batch sizes"),
    "batches",
    "",
    "other batch sizes, comma-separated",
    _FLAGS,
)
flags.DEFINE_string(
    "power_for",
    "",
    "generators that also get the effect row (default: all), comma-separated",
    _FLAGS,
)
flags.DEFINE(
    integer(1, MAX_REPLICATES),
    "replicates",
    1,
    "run each study this many times on fresh noise and read them together (pooled)",
    _FLAGS,
)
flags.DEFINE_string(
    "residuals_from",
    None,
    "a study's workdir: add a generator that resamples its fit residuals",
    _FLAGS,
)
flags.DEFINE(number(0.5, high=0.999), "heaviest_level", None, LEVEL_HELP, _FLAGS)


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]); its exit status."""
    return cli.run(_simulate, _FLAGS, argv, prog=PROG, text=HELP)


def _simulate(argv) -> int:
    a = cli.values(_FLAGS)
    got = _setup(a)
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 2
    design, names = got
    rule_level = decision.HEAVIEST_LEVEL
    decision.HEAVIEST_LEVEL = a.heaviest_level or rule_level
    try:  # (the level is read by decision and pooled at each call)
        return _run(a, design, names)
    finally:
        decision.HEAVIEST_LEVEL = rule_level


def _run(a, design, names) -> int:
    if a.heaviest_level:
        print(f"The check without the heaviest member at {a.heaviest_level:.0%} (not the rule's)")
    t0 = time.time()
    print(
        f"Design of {a.config}: {len(design.widths)} members (widths "
        f"{', '.join(f'{w:g}' for w in design.widths)}), batches {list(design.batch_sizes)}, "
        f"{len(design.tuning_seeds) + len(design.confirm_seeds)} seeds per cell, "
        f"n = {design.num_train}"
    )
    print(a.scale_line)
    power_for = [n.strip() for n in a.power_for.split(",") if n.strip()] or None
    if a.replicates > 1:
        print(f"Each study and {a.replicates - 1} replicate(s) read together (analysis/pooled.py)")
    args = (a.studies, a.alpha, a.bootstrap, a.seed, power_for, a.replicates, a.generators)
    rows = table(design, names, *args)
    for line in rows:
        print(line, flush=True)
    print(
        f"\n({a.studies} studies per cell, {a.bootstrap} replicates per member, "
        f"{time.time() - t0:.0f} s)\n{a.scale_line}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
