"""Theory check: expected batch bound at random initialisation vs width and depth (no training).

  python -m wide_tf.main --config=configs/theory.py --workdir=runs/theory

It writes runs/theory/report/theory.md (design, tables with 95% intervals, a verdict computed from
the numbers), theory.csv and theory.png. For bias-free linear and ReLU networks with Gaussian
inputs, a linear teacher and the squared loss it should show whether the expected batch bound
grows with width at fixed depth and falls with depth at a fixed parameter count, as Chen et al.
(2018) argue for 2-layer and deep linear networks.

Variants (after the colon):
  (default)  d = 32, widths 8..256, depths 2..12 at width 64 and at ~16k parameters, n = 256
             examples, 200 draws per point: 49 s wall on 2 CPU cores (measured: see get_config).
  smoke      a handful of tiny points and draws; seconds; for the tests.
"""

import ml_collections

from wide_tf.checks import loader


@loader.takes_args  # k=v arguments after the variant, e.g. :local:seeds=3,epochs=20
def get_config(arg=None):
    """Default: 42 points x 200 draws, measured at 49 s wall (43 s CPU) on 2 shared CPU cores.

    'smoke': 33 tiny points x 30 draws, under a second.
    """
    variant = arg or "default"
    config = ml_collections.ConfigDict()
    config.kind = "theory"
    t = config.theory = ml_collections.ConfigDict()
    t.input_dim = 32  # d: Gaussian input dimension (and the teacher's)
    t.budget = 16384  # parameters of every member of the fixed-budget sweep
    t.widths = (8, 16, 32, 64, 128, 256)  # width sweep at fixed depth
    t.deep_depth = 4  # depth of the deep linear network in the width sweep
    t.depths = (2, 3, 4, 6, 8, 12)  # depth sweep (at fixed_width) and fixed-budget sweep
    t.fixed_width = 64
    t.kinds = ("linear", "relu")  # networks of the depth and budget sweeps
    t.input_dims = (8, 16, 32, 64, 128)  # input-dimension sweep of 2-layer networks at fixed_width
    t.n_samples = 256  # n: examples per draw (the batch bound is n * diversity)
    t.n_inits = 200  # independent draws of teacher, data and initialisation per point
    t.label_noise = 0.0  # std of Gaussian noise added to the teacher's labels
    t.seed = 0
    if variant == "smoke":
        t.input_dim = 6
        t.budget = 200
        t.widths = (4, 16, 64)
        t.deep_depth = 3
        t.depths = (2, 3, 5)
        t.fixed_width = 8
        t.input_dims = (3, 6, 12)
        t.n_samples = 64
        t.n_inits = 30
    elif variant != "default":
        raise ValueError(
            f"unknown variant {variant!r} of configs/theory.py: use 'smoke' or nothing"
        )
    return config
