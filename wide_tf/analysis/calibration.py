"""Owns the calibration command line: a study's seed variance (its noise between runs, not the
gradient noise scale) against simulated studies' (`simulated`): the summary the generators are
matched to, read by `wide_tf.analysis.seed_variance` (the pooled seed sigma of log steps within
cells, the cell effect beyond the seeds and its F ratio, the seeds' shared share, the learning-rate
curvature).

    python -m wide_tf.analysis.calibration runs/mlp_local runs/mlp_local_replicate
    python -m wide_tf.analysis.calibration --simulate=configs/mlp.py:local   # the default generator

The generators' defaults (`wide_tf.analysis.stats.generators`) are set so that simulated studies
read this way give what the real ones give (`tests/analysis/test_calibration.py`). The curvature is
read from the tuning seeds' median steps at the best rate and its two neighbours on the x2 grid:
a noisy and biased reading (selection on noise), compared only with simulated studies read the
same way. Pure NumPy on records; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from absl import flags

from wide_tf.analysis.seed_variance import NoiseSummary, summarize
from wide_tf.analysis.seed_variance import read_records as _records
from wide_tf.schema import cli
from wide_tf.schema.cli import integer

__all__ = ["NoiseSummary", "summarize", "simulated", "main"]


def simulated(config: str, n_studies: int, seed: int = 1, truth=None) -> NoiseSummary:
    """The mean summary of `n_studies` studies of a config's design under a generator (default:
    the fitted model at the measured noise), read as a real study is."""
    from wide_tf.analysis import simulate
    from wide_tf.analysis.stats import generators as gen

    design = simulate.design_from_config(config)
    rng = np.random.default_rng(seed)
    rows = [
        summarize(simulate.simulate_study(rng, design, truth or gen.Truth()))
        for _ in range(n_studies)
    ]
    fields = [f.name for f in dataclasses.fields(NoiseSummary) if f.name != "n_cells"]
    mean = {f: float(np.nanmean([getattr(r, f) for r in rows])) for f in fields}
    return NoiseSummary(**mean, n_cells=int(sum(r.n_cells for r in rows)))


PROG = "python -m wide_tf.analysis.calibration"
HELP = f"""\
Prints a study's seed variance (its noise between runs: the seed sigma of log steps, the cell
effect and its F ratio, the seeds' shared share, the learning-rate curvature), or that of
simulated studies of a config's design, to compare the two. No TensorFlow.

  {PROG} runs/mlp_local runs/mlp_local_replicate
  {PROG} --simulate=configs/mlp.py:local

Exit status 0, or 2 with one `error:` line."""
# The command's own flags (schema/cli.py); the workdirs follow them.
_FLAGS = cli.flag_values()
flags.DEFINE_string("simulate", "", "a config: summarise simulated studies of it", _FLAGS)
flags.DEFINE(integer(1), "studies", 40, "simulated studies", _FLAGS)


def main(argv=None) -> int:
    """The command on argv (default: sys.argv[1:]): flags, then workdirs; its exit status."""
    return cli.run(_calibration, _FLAGS, argv, prog=PROG, text=HELP, positional=True)


def _calibration(argv) -> int:
    a, workdirs = cli.values(_FLAGS), argv[1:]
    if not workdirs and not a.simulate:
        cli.fail(
            "give a study's workdir or --simulate=CONFIG, e.g. --simulate=configs/mlp.py:local"
        )
    for wd in workdirs:
        try:
            print(f"{wd}: {summarize(_records(wd)).line()}")
        except (OSError, ValueError) as e:
            cli.fail(f"{wd}: {e}; give a finished study's workdir")
    if a.simulate:
        print(
            f"simulated {a.simulate} ({a.studies} studies, the default generator): "
            f"{simulated(a.simulate, a.studies).line()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
