"""Owns the `predict` study: `as_predict_config` turns any study config into it (one small batch
per member, B_simple measured at every evaluation), and its cost against the full sweep, planned
from the configs alone (docs/prediction.md, "The predict study").

Configs import this module before TensorFlow starts, so it imports nothing heavy: the schema's
budget rule, its command's absl flags (in a FlagValues of their own, so a config's import defines
nothing beside wide_tf.main's), and `wide_tf.checks.validate` (TensorFlow-free) only inside the
functions that need a data set's size.

    python -m wide_tf.analysis.predict_study --config=configs/mlp.py:local   # what its predict
                                                                             # study costs
"""

from __future__ import annotations

import dataclasses

from absl import flags

from wide_tf.schema import cli
from wide_tf.schema import plan as plan_lib

# ----------------------------------------------------------------------------------------------
# The predict study: any study config, one small batch per member
# ----------------------------------------------------------------------------------------------

PROBE_CAP = 4096  # the largest exact probe a predict study uses (as_predict_config)


def as_predict_config(
    config,
    batch: int | None = None,
    seeds: int = 3,
    max_lr_extensions: int = 1,
    probe_cap: int = PROBE_CAP,
):
    """Turns a study config into its `predict` study, in place (and returns it): the same members,
    target, optimizer and learning-rate grid, at one batch size (`batch`, default the sweep's
    smallest), the grid on the tuning seed with at most `max_lr_extensions` extensions, the chosen
    rate on `seeds` seeds in all, and the exact B_simple measured at every evaluation (and at
    initialisation) on a probe of at most `probe_cap` training examples. A given learning rate: set
    `sweep.lr_multipliers = [m]` and `sweep.extend_lr_grid = False` afterwards.

    The report of such a study carries the prediction (wide_tf/report/prediction_section.py)."""
    s, t = config.sweep, config.train
    if s is None or not list(s.batch_sizes):
        raise ValueError("as_predict_config needs a study config with sweep.batch_sizes")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    s.batch_sizes = [int(batch or min(s.batch_sizes))]
    tuning = list(s.seeds)[:1] or [0]
    more = [x for x in list(s.confirm_seeds) + list(range(1, seeds + 1)) if x not in tuning]
    s.seeds = tuning
    s.confirm_seeds = list(dict.fromkeys(more))[: seeds - 1]
    s.max_lr_extensions = min(s.max_lr_extensions, max_lr_extensions)
    # At every evaluation: with stop_at_target the run ends at the evaluation that sees the target,
    # so a measurement lands on (or one interval after) the interpolated crossing.
    # With eval_every_examples = 0 a study evaluates once an epoch: measure once an epoch too.
    n_train = _num_train(config)
    every = int(t.eval_every_examples) or n_train
    if not every:
        raise ValueError(
            f"as_predict_config: set train.eval_every_examples (data set {config.data.name!r} "
            "has no known size, so no epoch to measure once per)"
        )
    t.gradient_every_examples = every
    t.gradient_at_init = True
    # A probe of the whole of a large training set would cost more than the training between two
    # measurements (60,000 MNIST digits every 30,000 examples); a probe of n examples measures
    # B_simple up to about n, so the cap only matters for sets far larger than the critical batch.
    if n_train and probe_cap and (t.probe_size or n_train) > probe_cap:
        t.probe_size = int(probe_cap)
    return config


def _num_train(config) -> int | None:
    from wide_tf.checks import validate  # TensorFlow-free: the sizes of the known data sets

    try:
        return validate.dataset_facts(config)[0]
    except Exception:  # noqa: BLE001  (an unknown data set is validate's to report, not ours)
        return None


# ----------------------------------------------------------------------------------------------
# Cost: the predict study against the full sweep (plans, from the configs alone)
# ----------------------------------------------------------------------------------------------

# The cost model of configs/wrn.py (docs/tpu.md, "What the WRN study costs"): 1.3 GFLOP per training
# example (3 x the 0.42 GFLOP forward pass of WRN-16-2.95), evaluation adds about 26%, a v4 chip
# peaks at 275 TFLOP/s bf16, and networks this small reach 2-10% of peak (an assumption).
WRN_FLOP_PER_EXAMPLE = 1.3e9
WRN_EVAL_OVERHEAD = 0.26
V4_CHIP_PEAK_FLOPS = 275e12
UTILISATION = (0.02, 0.10)
# One exact probe example costs about 2 training examples (tools.bench.speed: exact diversity /
# one training step 1.6-2.0 for WRN-16-2 and the large MLP at B = 256 and 1,024;
# docs/benchmarks.md).
PROBE_COST_PER_EXAMPLE = 2.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a study will run, at most: trials (with every grid extension taken) and training
    examples (every trial to its budget; trials that stop at the target use fewer)."""

    members: int
    batches: tuple
    runs_min: int
    runs_max: int
    examples_max: float  # training examples, every run to its budget
    probe_examples_max: float  # exact-probe examples (each about 2 training examples of compute)

    def chip_hours(self, flop_per_example: float = WRN_FLOP_PER_EXAMPLE) -> tuple[float, float]:
        """(low, high) v4 chip-hours on the cost model of docs/tpu.md."""
        flop = flop_per_example * (
            self.examples_max * (1 + WRN_EVAL_OVERHEAD)
            + PROBE_COST_PER_EXAMPLE * self.probe_examples_max
        )
        return tuple(flop / (V4_CHIP_PEAK_FLOPS * u) / 3600 for u in reversed(UTILISATION))


def plan(config, num_train: int, members: int | None = None) -> Plan:
    """The plan of a study config whose training set has `num_train` examples."""
    s, t = config.sweep, config.train
    if members is None:  # the family's members: widths at a fixed depth, else depths
        members = len(s.family.widths if s.family.kind == "width" else s.family.depths) or 1
    m = members
    batches = tuple(int(b) for b in s.batch_sizes)
    grid = len(s.lr_multipliers) * len(s.seeds)
    ext = (s.max_lr_extensions if s.extend_lr_grid else 0) * len(s.seeds)
    confirm = len(s.confirm_seeds)
    per_cell_min, per_cell_max = grid + confirm, grid + ext + confirm
    examples = probes = 0.0
    for b in batches:
        steps = plan_lib.budget_steps(
            max_steps=t.max_steps,
            max_epochs=t.max_epochs,
            min_steps=t.min_steps,
            num_train=num_train,
            batch=b,
        )
        examples += per_cell_max * steps * b
        probe_n = t.probe_size or num_train
        if t.gradient_every_examples:
            probes += per_cell_max * probe_n * (steps * b // t.gradient_every_examples + 1)
        elif t.gradient_at_init:
            probes += per_cell_max * probe_n
    return Plan(
        members=m,
        batches=batches,
        runs_min=m * len(batches) * per_cell_min,
        runs_max=m * len(batches) * per_cell_max,
        examples_max=m * examples,
        probe_examples_max=m * probes,
    )


def cost_lines(config, spec: str = "the study") -> list[str]:
    """The predict study of `config` against the full sweep: runs, training examples (every run
    to its budget: an upper bound) and, for a WRN, v4 chip-hours on docs/tpu.md's cost model."""
    import copy

    from wide_tf.checks import validate

    n_train = validate.dataset_facts(config)[0]
    full = plan(config, n_train)
    small = plan(as_predict_config(copy.deepcopy(config)), n_train)
    lines = [
        f"{spec}: {full.members} members, batches {', '.join(map(str, full.batches))}; "
        f"its predict study: batch {small.batches[0]}",
        f"  runs: full sweep {full.runs_min}-{full.runs_max}, predict {small.runs_min}-"
        f"{small.runs_max} ({small.runs_max / full.runs_max:.0%} of the sweep at most)",
        f"  training examples, every run to its budget: full sweep {full.examples_max:.3g}, "
        f"predict {small.examples_max:.3g} ({small.examples_max / full.examples_max:.0%}); exact "
        f"probe examples {full.probe_examples_max:.3g} vs {small.probe_examples_max:.3g}",
    ]
    if config.model.arch == "wrn" and validate.dataset_facts(config)[3] is not None:
        (flo, fhi), (plo, phi) = full.chip_hours(), small.chip_hours()
        lines.append(
            "  v4 chip-hours at 2-10% of peak (docs/tpu.md cost model, runs to their budget): "
            f"full sweep {flo:.0f}-{fhi:.0f}, predict {plo:.1f}-{phi:.1f}"
        )
    return lines


PROG = "python -m wide_tf.analysis.predict_study"
HELP = f"""\
Prints what the predict study of a study config costs against its full sweep (one small batch per
member, the noise scale B_simple measured at every evaluation; docs/prediction.md): its runs, its
training and probe examples, and for a wide ResNet its TPU chip-hours. Planned from the configs
alone: nothing runs, and no data set is read beyond its size.

  {PROG} --config=configs/mlp.py:local
  {PROG} --config=configs/wrn.py

Bad input is one `error:` line on stderr and exit status 2."""
# The command's own flags (schema/cli.py): the configs import this module for as_predict_config.
_FLAGS = cli.flag_values()
flags.DEFINE_string("config", None, "a study config[:variant] (configs/wrn.py)", _FLAGS)


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]); its exit status."""
    required = {"config": "pass a study config, e.g. --config=configs/mlp.py:local"}
    return cli.run(_print_cost, _FLAGS, argv, prog=PROG, text=HELP, required=required)


def _print_cost(argv) -> int:
    spec = _FLAGS.config
    from wide_tf.checks import loader, validate

    try:
        config = loader.load_config(spec)
    except validate.UsageError as e:
        cli.fail(str(e).splitlines()[0])
    if config.get("sweep") is None or config.get("kind", "study") != "study":
        cli.fail(f"{spec} is not a study with a sweep; pass a study config")
    print("\n".join(cost_lines(config, spec)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
