"""Fully-connected networks at a fixed parameter budget: does the widest keep epochs-to-target flat
up to larger batches than the deepest? (Chen et al. 2018, fully-connected experiments.)

  python -m wide_tf.main --config=configs/mlp.py:local --workdir=runs/mlp_local

Variants (after the colon):
  local   scikit-learn's 1,797 real 8x8 digits (1,438 for training), 9 members (1, 2, 3, 4, 5, 6,
          8, 10 and 12 hidden layers) at 50k parameters whose widths span 10.4x (667 to 64), 6
          batch sizes 4, 8, 32, 64, 128 and 176 (at most n / 8: sampling without replacement
          keeps 88% or more of the gradient-noise variance), plain SGD (the theory's setting: no
          momentum ramp, so the steps to target are not an optimizer transient), a x2-spaced
          learning-rate grid per batch size on 2 tuning seeds, extended up to 4 times until the
          best rate is interior, the chosen rate confirmed on 3 more seeds; on 2 CPU cores (see
          the README for the measured time). The design simulation at the noise the local
          studies measure gives it 80% power or more at B_crit ~ width^0.5
          (docs/power_table.txt). A fixed budget cannot space MLP widths evenly: one hidden layer
          takes width ~ P / (inputs + outputs), two take ~ sqrt(P), so depth 1 stands alone; the
          width family at fixed depth (`local_width`) and the depth family at fixed width
          (`local_depth`) separate the two.
  local7  the earlier design: 7 members (depths 1, 2, 3, 4, 6, 8, 12), batches 8 to 176.
  local12 12 members at the budget (depths 1-6, 8, 10, 12, 16, 20, 24), batches 8 to 176: an
          earlier candidate (its deep members train unreliably: docs/power_table.txt).
  local_replicate  `local` on another set of seeds (100-104): the replicate a verdict must survive.
  local_width  the same protocol on 6 MLPs of 2 hidden layers, widths 32 to 512 (16x, even in log).
  local_depth  the same protocol on 6 MLPs of width 128, depths 1 to 12.
  local_momentum  `local` with momentum 0.9 (heavy ball, base rate 0.01 at batch 32: the same
          effective rate lr / (1 - momentum) as plain SGD's 0.1): whether the verdict survives an
          optimizer with a ~10-step ramp (1 / (1 - momentum)); its report gives the ramp beside
          each member's S_min.
  mnist7  the confirmatory study on real 28x28 digits, frozen before its first run (its design,
          rule and target committed with their simulated power first:
          docs/results/mnist7_mlp.md): the 5,000 embedded MNIST digits (4,000 for training) average-
          pooled to 7x7 (49 inputs keep the family's width span: 833 to 80, 10.4x, where 784
          inputs leave 1.6x), 8 members (depths 1-8) at 50k parameters, batches 8 to 500 (n / 8),
          plain SGD, the local protocol (x2 grid on 2 tuning seeds, extended, confirmed on 3 more),
          95% training accuracy, runs stopped there; the verdict rule as for `local`.
  fashion7  the same family and protocol on Fashion-MNIST, frozen before its first run
          (docs/results/fashion7_mlp.md): Debian's idx files (`apt-get install -y
          dataset-fashion-mnist`) pooled to 7x7, a fixed subset of 16,000 training images,
          depths 1-8, batches 16 to 2,000 (n / 8), 80% training accuracy (the deep members
          reach 85% only after 8-14 epochs; depth 12 stalls at batch 1,024). A cut design: its
          simulated power at B_crit ~ width^0.5 is 57%, below the 80% asked for.
  fashion7_replicate  fashion7 on seeds 100-104, read together with it (the pair: 79% power at
          width^0.5 simulated; specified before fashion7's result was read).
  fashion7_width, fashion7_depth, fashion7_momentum  on the same data and protocol: the
          width-only family (depth 2, widths 32 to 512), the depth-only family (width 128, depths
          1 to 8) and the budget family under momentum 0.9 (as `local_momentum`): the answer
          suite's other rows on Fashion-MNIST, each design-simulated before it ran.
  fashion14  the MLP answer on larger images, frozen (configs/frozen/mlp_fashion14.json) and not
          yet run: fashion7's protocol and data on 14x14 images (pool 2) at 100k parameters, so
          depths 1-8 span 4.7x in width (at 50k the span is 3.5x; at 28x28 a 4x span needs about
          1.2M parameters), read with its seed replicate `fashion14_replicate` (seeds 100-104).
          Its design, margin and cost: docs/results/designs.md.
  single  one run of the middle member at batch 128 (about a minute): the engine alone.
  paper   TFDS MNIST (prepare it first; see README), depths 1 to 8 at 1M parameters, batches 32 to
          16,384: the study at the paper's scale, for a GPU or TPU.
  smoke   seconds; for the tests.
  smoke_width  the smoke study (seconds) as a width family at depth 2: the answer suite's test.
  smoke_depth  the smoke study as a depth family at width 32.
  smoke_sgd  the smoke study under plain SGD (smoke itself runs momentum 0.9).
  check   the smoke study at batches 256 and 512, one seed, no confirmation runs (4 trials): a
          whole number of examples per replica on up
          to 256 replicas; `launch_tpu.sh --check` runs it on the VM before the study.
  predict the local study's members at its smallest batch, the learning-rate grid on one seed and
          the chosen rate on two more, B_simple measured at every evaluation: the critical batch
          predicted from the gradient noise scale at the target, without the sweep (45 s on 2
          idle cores; docs/prediction.md).
"""

from wide_tf.analysis import predict_study
from wide_tf.checks import loader
from wide_tf.schema import defaults

LOCAL_VARIANTS = (
    "local",
    "local7",
    "local12",
    "local_replicate",
    "local_width",
    "local_depth",
    "local_momentum",
    "mnist7",
    "fashion7",
    "fashion7_replicate",
    "fashion7_width",
    "fashion7_depth",
    "fashion7_momentum",
    "fashion14",
    "fashion14_replicate",
)
FASHION_VARIANTS = tuple(v for v in LOCAL_VARIANTS if v.startswith("fashion"))
SMOKE_FAMILIES = ("smoke_width", "smoke_depth", "smoke_sgd")


@loader.takes_args  # k=v arguments after the variant, e.g. :local:seeds=3,epochs=20
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
    if variant in LOCAL_VARIANTS:
        _local(config, variant)
    elif variant == "single":
        config.sweep = None
        config.model.depth, config.model.width = 2, 120
        config.train.global_batch = 128
        config.train.max_epochs = 30.0
    elif variant == "paper":
        config.data.name = "mnist"
        s.family.budget = 1.0e6
        s.family.depths = (1, 2, 4, 6, 8)
        s.batch_sizes = (32, 128, 512, 2048, 8192, 16384)
        s.lr_multipliers = (0.25, 0.5, 1.0, 2.0, 4.0)
        s.confirm_seeds = (1, 2)
        config.train.max_epochs = 100.0
        config.train.min_steps = 1000  # 100 epochs at B = 16,384 are only 367 steps
        config.train.eval_every_examples = 30_000
        config.train.eval_train_limit = 10_000
    elif variant in ("smoke", "check") or variant in SMOKE_FAMILIES:
        config.data.name = "digits_embedded"
        s.family.budget = 3.0e3
        s.family.depths = (1, 2)
        s.batch_sizes = (32, 256)
        s.lr_multipliers = (1.0,)
        s.extend_lr_grid = False
        config.train.max_epochs = 3.0
        config.train.target_value = 0.5
        config.train.steps_per_loop = 10
        if variant == "smoke_width":
            s.family.kind, s.family.depth, s.family.widths = "width", 2, (16, 48)
        elif variant == "smoke_depth":
            s.family.kind, s.family.width, s.family.depths = "depth", 32.0, (1, 3)
        elif variant == "smoke_sgd":
            _sgd(config)
        if variant == "check":
            s.batch_sizes = (256, 512)  # smoke's 32 would not split over 64 replicas
            s.seeds, s.confirm_seeds = (0,), ()  # 4 trials: a check of the machinery
    elif variant == "predict":
        # The local study at its smallest batch on three seeds, B_simple measured along training:
        # the critical batch predicted without the sweep (wide_tf/analysis/predict_study.py,
        # docs/prediction.md).
        return predict_study.as_predict_config(get_config("local"))
    else:
        raise ValueError(
            f"unknown variant {variant!r} of configs/mlp.py: local, local7, local12, "
            "local_replicate, local_width, local_depth, local_momentum, mnist7, fashion7, "
            "fashion7_replicate, fashion7_width, fashion7_depth, fashion7_momentum, fashion14, "
            "fashion14_replicate, single, "
            "paper, smoke, smoke_width, smoke_depth, smoke_sgd, check or predict"
        )
    return config


def _local(config, variant):
    """The local studies: 8x8 digits, plain SGD, a x2 learning-rate grid on two tuning seeds."""
    s = config.sweep
    config.data.name = "digits_embedded"
    # Plain SGD: momentum 0.9's ~10-step ramp was the scale of the old target's S_min.
    config.optim.name = "sgd"
    config.optim.momentum = 0.0
    config.optim.base_lr = 0.1
    config.optim.reference_batch = 32
    s.family.budget = 5.0e4
    # Nine members: the design simulation's cheapest with >= 80% power at B_crit ~ width^0.5 at
    # the noise the local studies measure (docs/power_table.txt). Depths 5 and 10 add members
    # between the two-layer and the twelve-layer ends, where the check without the one-layer
    # member reads its slope; deeper plain MLPs (16, 24) train unreliably here (censored runs).
    s.family.depths = (1, 2, 3, 4, 5, 6, 8, 10, 12)
    if variant == "local7":  # the earlier seven-member design (its power: docs/power_table.txt)
        s.family.depths = (1, 2, 3, 4, 6, 8, 12)
    if variant == "local12":  # 12 members at the budget (the design simulation's candidate)
        s.family.depths = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24)
    if variant == "local_width":
        s.family.kind, s.family.depth = "width", 2
        s.family.widths = (32, 56, 90, 160, 288, 512)
    elif variant == "local_depth":
        s.family.kind, s.family.width = "depth", 128.0
        s.family.depths = (1, 2, 3, 4, 6, 12)
    # At most n / 8 of the 1,438 training digits (the old design went to 1,024, 71%): the
    # gradient-noise variance of sampling without replacement keeps (n - B) / (n - 1) >= 0.88.
    # From 4: the reference E_ref (the two smallest batches) sits nearer the small-batch limit,
    # so B_x2 = B_crit + 2 x (their geometric mean) on the fitted curve is less diluted by the
    # constant (+11 rather than +23 examples): the slope it shows is nearer B_crit's. Every
    # member's B_x2 lies above 32 (59 to 130 measured), so no cell at 16 is needed to read it.
    s.batch_sizes = (4, 8, 32, 64, 128, 176)
    if variant in ("local7", "local12"):  # as they were simulated and run
        s.batch_sizes = (8, 16, 32, 64, 128, 176)
    s.lr_multipliers = (0.5, 1.0, 2.0)  # x2 spacing, extended past a winning edge
    s.max_lr_extensions = 4  # until the best rate is interior or diverging runs bound it
    s.seeds = (0, 1)  # the rate is chosen by the median over two tuning seeds
    s.confirm_seeds = (2, 3, 4)  # five seeds per cell at the chosen rate
    if variant == "local_replicate":
        s.seeds, s.confirm_seeds = (100, 101), (102, 103, 104)
    if variant == "local_momentum":
        _momentum(config)
    if variant == "mnist7" or variant in FASHION_VARIANTS:
        _mnist7(config)
        if variant != "mnist7":
            _fashion7(config, variant.replace("fashion14", "fashion7"))
        if variant.startswith("fashion14"):
            _fashion14(config)
        return
    config.train.target_value = 0.97
    # The same runs judged at two more targets (each analysed; the report shows whether the
    # verdict holds at all three). A run stops once it has met all of them.
    config.train.extra_targets = ("train_accuracy:0.95", "train_accuracy:0.99")
    config.train.max_epochs = 30.0
    # A step floor: 30 epochs at B = 128 are only 338 steps.
    config.train.min_steps = 400
    # A tenth of an epoch: epochs-to-target resolved to 0.1 epochs at every batch size.
    config.train.eval_every_examples = 144
    # Evaluation batches of 256: 1,536 padded rows per pass over the 1,438 digits (1,024: 2,048),
    # and a bounded pass (engine/evaluation.py) checks whether it can stop every 256 examples.
    config.train.eval_batch = 256
    config.train.gradient_at_init = True
    # The exact noise scale B_simple on all 1,438 digits every 0.2 epochs: read at each run's
    # target crossing, it is the report's prediction of the critical batch (docs/prediction.md).
    config.train.gradient_every_examples = 288


def _momentum(config):
    """Heavy-ball momentum 0.9 at the plain-SGD rate's effective size: lr / (1 - momentum) is what
    a step moves once the ~10-step ramp has passed, so the grid starts where SGD's did."""
    config.optim.name = "momentum"
    config.optim.momentum = 0.9
    config.optim.base_lr = round(config.optim.base_lr * (1.0 - 0.9), 12)


def _sgd(config):
    """Plain SGD at momentum's effective rate lr / (1 - momentum)."""
    config.optim.base_lr = round(config.optim.base_lr / (1.0 - config.optim.momentum), 12)
    config.optim.name = "sgd"
    config.optim.momentum = 0.0


def _mnist7(config):
    """The confirmatory study (frozen before its first run; docs/results/mnist7_mlp.md): the
    local protocol on the embedded MNIST digits pooled to 7x7, depths 1-8, batches 8 to n / 8 =
    500, 95% training accuracy, every run stopped there."""
    s, t = config.sweep, config.train
    config.data.name = "mnist_embedded"
    config.data.pool = 4  # 28x28 -> 7x7: widths 833 (depth 1) to 80 (depth 8)
    s.family.depths = [1, 2, 3, 4, 5, 6, 7, 8]  # depth 12 does not reach 97% in 30 epochs
    # The pilot: the one-layer member's epochs double between batches 128 and 500,
    # so its B_crit is of order 250; 500 = n / 8 keeps (n - B) / (n - 1) = 0.88 of the noise.
    s.batch_sizes = [8, 16, 32, 64, 128, 256, 500]
    t.target_value = 0.95
    t.extra_targets = []  # the primary target only: a run stops when it is met
    t.max_epochs = 30.0
    t.min_steps = 600  # 30 epochs at B = 500 are only 240 steps
    t.eval_every_examples = 400  # a tenth of an epoch
    t.eval_batch = 1000  # four passes' batches over the 4,000 digits
    # The gradient probe (the noise-scale prediction) is left off: it is not this study's
    # question, and its per-example gradients over 4,000 digits would cost more than the runs.
    t.gradient_at_init = False
    t.gradient_every_examples = 0


def _fashion7(config, variant="fashion7"):
    """The mnist7 protocol and family on Fashion-MNIST pooled to 7x7 (frozen before its first
    run; its pilot and design simulation: docs/results/fashion7_mlp.md), and the answer
    suite's other families and momentum on the same data (each simulated before it ran)."""
    s, t = config.sweep, config.train
    config.data.name = "fashion_mnist_idx"
    config.data.num_train = 16_000  # n / 8 = 2,000: batches into the thousands
    s.batch_sizes = [16, 32, 64, 128, 256, 512, 1024, 2000]
    # The pilot at 80%: the widest member needs 88 steps at batch 128 and 43 at 2,000 (B_crit
    # about 150), depth 8 205 steps at 1,024; at 85% the deep members need 8-14 epochs at 128.
    t.target_value = 0.80
    t.eval_every_examples = 1600  # a tenth of an epoch
    t.eval_batch = 2000
    if variant == "fashion7_replicate":
        s.seeds, s.confirm_seeds = (100, 101), (102, 103, 104)
    elif variant == "fashion7_width":  # the digits' width-only family (16x at depth 2)
        s.family.kind, s.family.depth = "width", 2
        s.family.widths = [32, 56, 90, 160, 288, 512]
    elif variant == "fashion7_depth":  # width 128; depth 12 stalls at large batches here
        s.family.kind, s.family.width = "depth", 128.0
        s.family.depths = [1, 2, 3, 4, 6, 8]
    elif variant == "fashion7_momentum":
        _momentum(config)


def _fashion14(config):
    """fashion7 on 14x14 images at 100k parameters: 196 inputs at 50k leave depths 1-8 a 3.5x
    width span; 100k gives 4.7x (docs/results/designs.md). The batches, seeds, target and rule are
    fashion7's; evaluations stay a tenth of an epoch."""
    config.data.pool = 2  # 28x28 -> 14x14
    config.sweep.family.budget = 1.0e5
