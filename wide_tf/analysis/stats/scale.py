"""Owns the scale the design simulation places its generators at: the narrowest member's B_crit
and S_min, and the noise, either the simulator's reference (B_crit 30 examples on the 8x8 digits,
the local studies' measured noise), given, or read off a finished study (its narrowest member's
fitted curve; its noise as `wide_tf.analysis.calibration` reads it). `wide_tf.analysis.simulate`
applies it to every generator and prints its line above and below each table."""

from __future__ import annotations

import dataclasses
import math

from wide_tf.analysis.stats import generators as gen
from wide_tf.analysis.stats.generators import Truth


@dataclasses.dataclass(frozen=True)
class Scale:
    """Where the generators put the narrowest member's curve, and the noise, with their sources."""

    b_crit_ref: float = gen.Truth.b_crit_ref
    s_min: float | None = None  # steps; None: the reference's epochs_small_batch
    noise: object = None  # a NoiseSummary read off a study; None: the generators' own
    source: str = "the simulator's reference"

    def line(self, num_train: int) -> str:
        s_min = self.s_min or gen.Truth.epochs_small_batch * num_train / self.b_crit_ref
        noise = "each generator's own (generators.MEASURED)"
        if self.noise is not None:
            noise = f"{self.noise.line()} (replacing the default noise)"
        return (
            f"Scale: the narrowest member's B_crit {self.b_crit_ref:.3g} examples, S_min "
            f"{s_min:.3g} steps ({self.source}); noise: {noise}"
        )

    def apply(self, truth: Truth, num_train: int) -> Truth:
        """`truth` at this scale (and this noise, if it keeps the default noise)."""
        kw = dict(b_crit_ref=self.b_crit_ref)
        if self.s_min:
            kw["epochs_small_batch"] = self.s_min * self.b_crit_ref / num_train
        d = Truth()
        default_noise = (truth.noise, truth.seed_effect, truth.cell_effect, truth.cell_pool) == (
            d.noise,
            d.seed_effect,
            d.cell_effect,
            (),
        )
        if self.noise is not None and default_noise:
            share = min(max(self.noise.seed_share, 0.0), 1.0)
            kw.update(
                noise=self.noise.sigma * math.sqrt(1.0 - share),
                seed_effect=self.noise.sigma * math.sqrt(share),
                cell_effect=self.noise.cell_sd,
            )
        return dataclasses.replace(truth, **kw)


def scale_from(workdir: str, summaries, noise) -> Scale:
    """The scale of a finished study (its member `summaries`): its narrowest member's fitted
    B_crit and S_min, and its `noise` (a `wide_tf.analysis.seed_variance.NoiseSummary`)."""
    fitted = [s for s in summaries if s.curve is not None and s.curve.fit is not None]
    if not fitted:
        raise ValueError("no member has a fitted curve")
    narrowest = min(fitted, key=lambda s: float(s.info.width))
    fit = narrowest.curve.fit
    return Scale(
        b_crit_ref=float(fit.b_crit),
        s_min=float(math.exp(fit.log_s_min)),
        noise=noise,
        source=f"read off {workdir}, member {narrowest.info.name}",
    )
