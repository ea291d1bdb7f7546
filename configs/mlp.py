"""Fully-connected networks at a fixed parameter budget: does the widest keep epochs-to-target flat
up to larger batches than the deepest? (Chen et al. 2018, fully-connected experiments.)

  python -m wide_tf.main --config=configs/mlp.py:local --workdir=runs/mlp_local

Variants (after the colon):
  local   the embedded 4,000 real MNIST digits, 3 members (1, 2 and 4 hidden layers) at ~100k
          parameters, 6 batch sizes up to the whole training set, a learning-rate grid per batch
          size; under 10 minutes on 2 CPU cores. It shows steps-to-target falling as the batch grows,
          then flattening past each member's critical batch, and the report's verdict.
  single  one run of the middle member at batch 128 (about a minute): the engine alone.
  paper   TFDS MNIST (prepare it first; see README), depths 1 to 8 at 1M parameters, batches 32 to
          16,384: the study at the paper's scale, for a GPU or TPU.
  smoke   seconds; for the tests.
"""

from wide_tf import defaults


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
        s.family.budget = 1.0e5
        s.family.depths = [1, 2, 4]
        s.batch_sizes = [16, 64, 256, 1024, 2000, 4000]
        s.lr_multipliers = [0.5, 1.0, 2.0]
        config.train.max_epochs = 40.0
        # A quarter epoch: epochs-to-target is resolved to 0.25 epochs at every batch size.
        config.train.eval_every_examples = 1000
        config.train.gradient_at_init = True
        config.train.gradient_every_examples = 20_000
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
        config.train.max_epochs = 100.0
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
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/mlp.py: local, single, paper or smoke")
    return config
