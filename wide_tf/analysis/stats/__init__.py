"""Owns the statistics that turn per-member estimates into a verdict and check that verdict on
simulated data: the random-effects meta-regression across members (`meta`), the lack-of-fit test
and the hierarchical variance of one member's curve (`lof`), and the calibration generators that
simulate curves which differ from the fitted model (`generators`), and the scale they are placed at
(`scale`: the narrowest member's B_crit and S_min and the noise, given or read off a study).

NumPy and SciPy only, no TensorFlow: every rule is unit-tested on hand-made numbers and calibrated
on simulated studies (`python -m wide_tf.analysis.simulate`)."""
