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

from wide_tf.analysis.seed_variance import NoiseSummary, summarize
from wide_tf.analysis.seed_variance import read_records as _records
from wide_tf.schema.cli import UsageParser, integer

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


def main(argv=None) -> int:
    p = UsageParser(
        prog="python -m wide_tf.analysis.calibration", description=__doc__.splitlines()[0]
    )
    p.add_argument("workdirs", nargs="*", help="finished studies' workdirs")
    p.add_argument("--simulate", default="", help="a config: summarise simulated studies of it")
    p.add_argument("--studies", type=integer(1), default=40, help="simulated studies")
    a = p.parse_args(argv)
    if not a.workdirs and not a.simulate:
        print("error: give a study's workdir or --simulate=CONFIG", file=sys.stderr)
        return 2
    for wd in a.workdirs:
        try:
            print(f"{wd}: {summarize(_records(wd)).line()}")
        except (OSError, ValueError) as e:
            print(f"error: {wd}: {e}; give a finished study's workdir", file=sys.stderr)
            return 2
    if a.simulate:
        print(
            f"simulated {a.simulate} ({a.studies} studies, the default generator): "
            f"{simulated(a.simulate, a.studies).line()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
