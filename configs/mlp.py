"""Fully-connected networks at a fixed parameter budget: does the widest keep epochs-to-target flat
up to larger batches than the deepest? (Chen et al. 2018, fully-connected experiments.)

  python -m wide_tf.main --config=configs/mlp.py:local --workdir=runs/mlp_local

Variants (after the colon):
  local   scikit-learn's 1,797 real 8x8 digits (1,438 for training), 4 members (1, 2, 4 and 8
          hidden layers) at 50k parameters whose widths span 8.4x, 7 batch sizes from 16 to 1,024,
          a sqrt(2)-spaced learning-rate grid per batch size, the chosen rate confirmed on four more
          seeds; on 2 CPU cores (see the README for the measured time). It shows steps-to-target
          against batch size per member with the fitted S_min (1 + B_crit / B) and its band, and a
          verdict from the slope of log B_crit against log width, with its interval.
  single  one run of the middle member at batch 128 (about a minute): the engine alone.
  paper   TFDS MNIST (prepare it first; see README), depths 1 to 8 at 1M parameters, batches 32 to
          16,384: the study at the paper's scale, for a GPU or TPU.
  smoke   seconds; for the tests.
  predict the local study's members at its smallest batch, the learning-rate grid on one seed and
          the chosen rate on two more, B_simple measured at every evaluation: the critical batch
          predicted from the gradient noise scale at the target, without the sweep (under 2
          minutes; docs/prediction.md).
"""

from wide_tf import defaults, predict


def get_config(arg=None):
    variant = arg or "local"
    config = defaults.base_config("mlp", "mnist_embedded")
    config.model.norm = "none"
    config.optim.name = "momentum"
    config.optim.momentum = 0.9
    config.optim.base_lr = 0.07
    config.optim.scaling = "sqrt"
    config.optim.reference_batch = 256
    config.train.target_metric = "train_accuracy"
    config.train.target_value = 0.99
    s = config.sweep
    s.family.kind = "budget"
    if variant == "local":
        # 64 inputs, so the first layer does not eat the budget: at 5e4 parameters the widths are
        # 667/189/117/79 (8.4x). 4,000 MNIST digits at 784 inputs gave 126/110/93 (1.35x), which
        # could not show anything (see the README's calibration table).
        config.data.name = "digits_embedded"
        s.family.budget = 5.0e4
        s.family.depths = [1, 2, 4, 8]
        s.batch_sizes = [16, 32, 64, 128, 256, 512, 1024]
        s.lr_multipliers = [0.7071, 1.0, 1.4142]  # sqrt(2) spacing, extended past a winning edge
        s.confirm_seeds = [1, 2, 3, 4]  # five seeds per cell: the median is robust to one outlier
        config.train.max_epochs = 60.0
        # A step floor: 60 epochs at B = 1,024 are only 85 steps, which would censor the largest
        # batches by the budget rather than by their speed.
        config.train.min_steps = 400
        # A quarter epoch: epochs-to-target is resolved to 0.25 epochs at every batch size.
        config.train.eval_every_examples = 360
        config.train.gradient_at_init = True
    elif variant == "single":
        config.sweep = None
        config.model.depth, config.model.width = 2, 120
        config.train.global_batch = 128
        config.train.max_epochs = 30.0
    elif variant == "paper":
        config.data.name = "mnist"
        s.family.budget = 1.0e6
        s.family.depths = [1, 2, 4, 6, 8]
        s.batch_sizes = [32, 128, 512, 2048, 8192, 16384]
        s.lr_multipliers = [0.25, 0.5, 1.0, 2.0, 4.0]
        s.confirm_seeds = [1, 2]
        config.train.max_epochs = 100.0
        config.train.min_steps = 1000  # 100 epochs at B = 16,384 are only 367 steps
        config.train.eval_every_examples = 30_000
        config.train.eval_train_limit = 10_000
    elif variant == "smoke":
        config.data.name = "digits_embedded"
        s.family.budget = 3.0e3
        s.family.depths = [1, 2]
        s.batch_sizes = [32, 256]
        s.lr_multipliers = [1.0]
        s.extend_lr_grid = False
        config.train.max_epochs = 3.0
        config.train.target_value = 0.5
        config.train.steps_per_loop = 10
    elif variant == "predict":
        # The local study at its smallest batch on three seeds, B_simple measured along training:
        # the critical batch predicted without the sweep (wide_tf/predict.py, docs/prediction.md).
        return predict.as_predict_config(get_config("local"))
    else:
        raise ValueError(
            f"unknown variant {variant!r} of configs/mlp.py: local, single, paper, predict or smoke"
        )
    return config
