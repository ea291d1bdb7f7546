"""Wide ResNets at a fixed parameter budget on CIFAR-10: are the wide, shallow members trainable
with larger batches than the deep, narrow ones? (Chen et al. 2018, residual-network experiments.)

  python -m wide_tf.main --config=configs/wrn.py --workdir=gs://BUCKET/wrn        # on a TPU VM
  ./launch_tpu.sh --name=wide-v4 --config=configs/wrn.py --workdir=gs://BUCKET/wrn

Variants (after the colon):
  (none)  the full study for an accelerator: CIFAR-10 (TFDS; prepare it: docs/tpu.md), WRN-10,
          -16, -22, -28 and -40 at 1.5M parameters, batches 256 to 16,384, LARS with a 5-epoch
          warm-up (held fixed in epochs) and polynomial decay, ghost batch norm with a virtual
          batch of 16 (runs on 1 to 16 replicas), target 99% training accuracy within
          max(100 epochs, 1,000 steps), the chosen rate confirmed on two more seeds. Its verdict
          is the slope of log B_crit against log width, with its interval.
  local   small WRNs on the embedded 8x8 digits (1,438 training images), WRN-10/16/22/28/40/52 at
          50k parameters (widths 0.79 to 0.25, 3.2x: a WRN's width falls like 1/sqrt(blocks), so
          4x would need WRN-100), batches 8 to 176 (at most n / 8), plain SGD on 2 tuning seeds
          with up to 4 learning-rate extensions, the chosen rate confirmed on 2 more seeds: the
          same protocol at CPU scale (a rehearsal of the pipeline; 8x8 digits are not CIFAR).
          See the README for what it costs.
  local4  `local` cut to fit 45 minutes on 2 cores (docs/results/wrn_local4.md): WRN-10,
          -16, -28 and -52 (widths 0.79 to 0.25), batches 8, 16, 32, 64 and 176, the same
          protocol, rule and targets.
  single  one run of WRN-16 on the embedded digits, batch 64 (about a minute).
  fashion_check  the GPU check's ResNet study (docs/gpu.md): `local`'s protocol on real images,
          Fashion-MNIST from Debian's idx files (`data.data_dir` where they are), pooled to 14x14,
          a fixed 16,000-image subset, WRN-10, -16 and -28 at 50k parameters, batches 32 to
          2,048 (n / 8), target 90% training accuracy, two seeds. A check of the JAX path on a
          GPU at batches in the thousands, not a designed study: its power was not simulated.
  mnist7  the ResNet study on real images: `local`'s six members (WRN-10, -16,
          -22, -28, -40, -52 at 50k parameters, k 0.79 to 0.25) on the 5,000 embedded MNIST
          digits (4,000 for training) average-pooled to 7x7, batches 32 to 496 (the multiple of
          the ghost batch 8 nearest n / 8 = 500), 95% training accuracy, runs stopped there;
          plain SGD, the x2 grid on 2 tuning seeds with up to 4 extensions, 2 confirmation seeds,
          batch-norm statistics recomputed before each evaluation; the MLPs' rule. Its design,
          target and batches come from a pilot and the design simulation, committed before it
          ran (docs/results/wrn_mnist7.md): 26% power at B_crit ~
          width^0.5, 67.5% at width^1. 7x7 rather than 14x14 or 28x28 for time: on 2 CPU cores a
          study at 4x or 16x the pixels does not fit an evening.
  fashion7  mnist7's family and protocol on Fashion-MNIST pooled to 7x7 (Debian's
          dataset-fashion-mnist), a fixed 8,000-image subset, batches 32, 128, 512 and 1,000
          (n / 8), 80% training accuracy (the MLP fashion7 study's target): the ResNet study on
          Fashion-MNIST cut to about an hour on 2 cores (50 minutes idle). Frozen before its
          first run after a pilot and the design simulation (docs/results/wrn_fashion7.md):
          30-32% power at B_crit ~ width^0.5, 86% at width^1, every
          generator's null <= 7%; at its own scale 41% and 90%.
  fashion7_replicate  fashion7 on seeds 100-103 (the same 8,000 images), read together with it
          (`configs/answer.py:wrn_fashion7` runs the pair and pools it): the seed replicate a
          ResNet verdict must survive. Frozen before its first run; the pair's power in
          docs/results/wrn_fashion7.md.
  fashion_confirm  the confirmatory ResNet study on Fashion-MNIST, frozen
          (configs/frozen/wrn_fashion_confirm.json) and not yet run: eight WRNs at 50k parameters
          (WRN-10 to WRN-52 in steps of six layers, k 0.79 to 0.25), 7x7 images, 16,000 training
          images so that batches reach 2,000 (n / 8), past every member's B_x2 (333-430 at 80% in
          fashion7), batches 32, 128, 512, 1,000 and 2,000, 80% training accuracy primary and
          85% secondary, read with its seed replicate `fashion_confirm_replicate` (seeds
          100-103). Its design simulation, margin and estimated cost: docs/results/designs.md.
  smoke   seconds; for the tests.
  check   the smoke study at batches 256 and 512 (ghost batch 8), one seed and no confirmation
          runs (4 trials): whole virtual batches on every
          replica count up to 32, so it runs on every slice launch_tpu.sh lists; `launch_tpu.sh
          --check` runs it on the VM before the study (tests/test_launch.py checks every slice).
  predict the paper study's members at its smallest batch, three seeds (grid on one), B_simple
          measured at every evaluation: B_crit per member predicted from the noise scale, for
          a fraction of the sweep's cost (`python -m wide_tf.analysis.predict_study
          --config=configs/wrn.py` prints both; docs/prediction.md).
  predict_local  the same for the local study (its smallest batch).
"""

from wide_tf.analysis import predict_study
from wide_tf.checks import loader
from wide_tf.schema import defaults


@loader.takes_args  # k=v arguments after the variant, e.g. :local:seeds=3,epochs=20
def get_config(arg=None):
    variant = arg or "paper"
    if variant == "predict":
        # The CIFAR-10 study at its smallest batch on three seeds, B_simple measured at every
        # evaluation (wide_tf/analysis/predict_study.py, docs/prediction.md).
        return predict_study.as_predict_config(get_config("paper"))
    if variant == "predict_local":
        return predict_study.as_predict_config(get_config("local"))
    if variant not in (
        "paper",
        "local",
        "local4",
        "mnist7",
        "fashion7",
        "fashion7_replicate",
        "fashion_confirm",
        "fashion_confirm_replicate",
        "single",
        "smoke",
        "check",
        "fashion_check",
    ):
        raise ValueError(
            f"unknown variant {variant!r} of configs/wrn.py: paper (default), local, local4, "
            "mnist7, fashion7, fashion7_replicate, fashion_confirm, fashion_confirm_replicate, "
            "single, fashion_check, predict, predict_local, "
            "smoke or check"
        )
    config = _common()
    if variant == "paper":
        _paper(config)
    else:
        _local(config, variant)
    return config


def _common():
    """What every variant shares: ghost batch norm, LARS with a warm-up, the 99% target."""
    config = defaults.base_config("wrn", "cifar10")
    config.model.norm = "ghost"
    # The virtual batch is never shrunk, so every replica's (micro-)batch must be a multiple of it.
    # The paper variant sets its own below so that it runs unchanged on up to 16 replicas.
    config.model.ghost_batch_size = 32
    config.data.augment = False  # the outcome is convergence on the training set (docs/science.md)
    config.optim.name = "lars"
    config.optim.base_lr = 2.0  # LARS global lr at batch 256 with eta = 0.001
    config.optim.lars_eta = 0.001
    config.optim.weight_decay = 5e-4
    config.optim.scaling = "sqrt"
    config.optim.schedule = "polynomial"
    config.optim.poly_power = 2.0
    config.optim.warmup_epochs = 5.0
    config.optim.warmup_fixed = "epochs"
    config.train.target_metric = "train_accuracy"
    config.train.target_value = 0.99
    config.sweep.family.kind = "budget"
    return config


def _paper(config):
    s = config.sweep
    s.family.budget = 1.5e6
    s.family.depths = (10, 16, 22, 28, 40)
    # One config for every slice in docs/tpu.md, up to 16 replicas (v4-32; v2-8, v3-8,
    # v4-16, v5litepod-8, v6e-8 and 8-GPU boxes have 8): the smallest batch, 256, leaves 16
    # examples per replica there, one virtual batch of 16. With 32 and batch 128 (before) it
    # ran on at most 4 replicas. The same ghost size everywhere keeps the results independent
    # of the slice. `python -m wide_tf.main --config=configs/wrn.py --dry_run --replicas=N`
    # checks another N.
    config.model.ghost_batch_size = 16
    s.batch_sizes = (256, 512, 2048, 4096, 8192, 16384)
    s.lr_multipliers = (0.5, 1.0, 2.0)
    s.confirm_seeds = (1, 2)
    config.train.max_epochs = 100.0
    config.train.min_steps = 1000  # 100 epochs at B = 16,384 are only 306 steps
    config.train.eval_every_examples = 25_000
    # Training accuracy on a fixed 10k subset: cheap, the same for all.
    config.train.eval_train_limit = 10_000
    config.train.steps_per_loop = 50
    config.train.gradient_every_examples = 500_000
    config.train.probe_size = 1024


def _local(config, variant):
    """local, single, smoke and check: small WRNs on the embedded digits, plain SGD."""
    s = config.sweep
    config.data.name = "digits_embedded"
    config.model.ghost_batch_size = 8  # divides every batch from 8 up
    # Plain SGD: no momentum ramp inside the steps to target.
    config.optim.name = "sgd"
    config.optim.momentum = 0.0
    config.optim.base_lr = 0.1
    config.optim.reference_batch = 32
    config.optim.weight_decay = 0.0
    config.optim.schedule = "constant"
    config.optim.warmup_epochs = 0.0
    config.train.eval_every_examples = 144
    s.family.budget = 5.0e4
    # At a fixed budget a WRN's width falls like 1/sqrt(blocks): WRN-10 to WRN-52 give k =
    # 0.79 to 0.25, a 3.2x range.
    s.family.depths = (10, 16, 22, 28, 40, 52)
    s.batch_sizes = (8, 16, 32, 64, 128, 176)  # at most n / 8 of the training digits
    s.lr_multipliers = (0.5, 1.0, 2.0)
    s.max_lr_extensions = 4
    s.seeds = (0, 1)
    s.confirm_seeds = (2, 3)
    config.train.target_value = 0.97
    config.train.extra_targets = ("train_accuracy:0.95", "train_accuracy:0.99")
    # Batch-norm statistics recomputed on training data before each evaluation: moving
    # averages of momentum 0.9 lag the weights by ~10 steps, which would enter every
    # steps-to-target as a fixed overhead.
    config.train.target_bn = "recompute"
    config.train.max_epochs = 30.0
    config.train.min_steps = 400
    config.train.gradient_at_init = True
    config.train.eval_batch = 256  # 6 batches a pass: a pass can stop early (docs/evaluation.md)
    if variant == "local4":
        s.family.depths = (10, 16, 28, 52)  # every other member, both ends kept
        s.batch_sizes = (8, 16, 32, 64, 176)
    if variant == "mnist7":
        _mnist7(config)
    if variant in ("fashion7", "fashion7_replicate"):
        _mnist7(config)
        _fashion7(config)
    if variant in ("fashion_confirm", "fashion_confirm_replicate"):
        _mnist7(config)
        _fashion7(config)
        _fashion_confirm(config, variant)
    if variant == "fashion7_replicate":
        # Other seeds, everything else the same (the subset of images is fixed by data.subset_seed,
        # not by these): as configs/mlp.py:fashion7_replicate to configs/mlp.py:fashion7.
        s.seeds, s.confirm_seeds = (100, 101), (102, 103)
    if variant == "fashion_check":
        config.data.name = "fashion_mnist_idx"
        config.data.pool = 2  # 28x28 -> 14x14
        config.data.num_train = 16_000
        s.family.depths = (10, 16, 28)
        s.batch_sizes = (32, 128, 512, 2048)
        s.seeds, s.confirm_seeds = (0, 1), ()
        s.max_lr_extensions = 2
        config.train.target_value = 0.90
        config.train.extra_targets = ()
        config.train.max_epochs = 20.0
        config.train.eval_every_examples = 4_000
        config.train.eval_batch = 2_048
    if variant == "single":
        config.sweep = None
        config.model.depth, config.model.width = 16, 0.53
        config.train.global_batch = 64
    elif variant in ("smoke", "check"):
        s.family.budget = 1.0e4
        s.family.depths = (10, 16)
        s.batch_sizes = (32, 128)
        s.lr_multipliers = (1.0,)
        s.extend_lr_grid = False
        config.train.max_epochs = 2.0
        config.train.target_value = 0.5
        if variant == "check":
            # Multiples of 32 replicas x ghost batch 8 (smoke's 32 and 128 leave 4 or 2
            # examples per replica on 8 or 16 replicas, less than one virtual batch).
            s.batch_sizes = (256, 512)
            # One seed, no confirmation runs: 4 trials, a check of the machinery, not a study.
            s.seeds, s.confirm_seeds = (0,), ()


def _mnist7(config):
    """The ResNet study on real images: local4's members on the embedded MNIST pooled to 7x7."""
    s, t = config.sweep, config.train
    config.data.name = "mnist_embedded"
    config.data.pool = 4  # 28x28 -> 7x7: the cost of an 8x8 digit, 2.8x the training images
    # Six members, not local4's four: the design simulation gives 4 members 0.5% power at
    # B_crit ~ width^0.5 (2 df) and 6 members 31% (86% at width^1); more seeds do not help.
    s.family.depths = (10, 16, 22, 28, 40, 52)
    # The pilot (docs/results/wrn_mnist7.md): WRN-10 needs 3.0 epochs to 95% at batch 32 and 9.1
    # at 496, so B_crit ~ 200 there; the largest multiple of the ghost batch 8 below n / 8 = 500
    # is 496.
    # From 32, not 16: the first frozen design (from 16, evaluations every 400 examples) ran at
    # about 4 hours on 2 cores; its batch-16 runs of the deep members cost the most.
    s.batch_sizes = (32, 64, 128, 256, 496)
    t.target_value = 0.95  # WRN-52 reaches 97% only after 12 epochs at batch 32 (pilot)
    t.extra_targets = ()  # the primary target only: a run stops when it is met
    t.max_epochs = 30.0
    t.min_steps = 600  # 30 epochs at B = 496 are only 242 steps
    t.eval_every_examples = 800  # a fifth of an epoch: evaluations were 40% of a run at 400
    t.eval_batch = 1000
    # The probe (noise-scale prediction) is off, as in the MLP mnist7 study: not this question.
    t.gradient_at_init = False
    t.gradient_every_examples = 0


def _fashion7(config):
    """mnist7's family and protocol on Fashion-MNIST pooled to 7x7: the ResNet study's cut
    version on 2 cores (its pilot, design simulation and cost: docs/results/wrn_fashion7.md)."""
    s, t = config.sweep, config.train
    config.data.name = "fashion_mnist_idx"
    # 8,000 images, not the MLP study's 16,000: n / 8 = 1,000 still reaches past every member's
    # B_crit (pilot: WRN-10 about 210 at 80%), and an evaluation pass costs half.
    config.data.num_train = 8_000
    # The pilot at 80%: WRN-10 needs 225 steps at batch 32 and 36 at 1,000; WRN-52 775 at 32.
    # 85% costs WRN-52 2,175 steps at 32, three times 80%'s, which does not fit.
    t.target_value = 0.80
    # Four batches, x4 apart to n / 8: the design simulation gives them 30-32% power at B_crit ~
    # width^0.5 (86% at width^1), the six of mnist7's ladder (x2 apart) 22-25% at 1.3-1.9x the
    # examples; the members, not the batches, set the interval.
    s.batch_sizes = (32, 128, 512, 1000)
    t.max_epochs = 20.0  # 5,000 steps at 32: 6x WRN-52's steps to target there
    t.min_steps = 600  # 20 epochs at 1,000 are 160 steps
    t.eval_every_examples = 800  # a tenth of an epoch
    t.eval_batch = 1000


def _fashion_confirm(config, variant):
    """The confirmatory ResNet study on Fashion-MNIST (docs/results/designs.md): fashion7's
    protocol with eight members, 16,000 images, batches past every member's B_x2, and the 85%
    target beside the 80% one."""
    s, t = config.sweep, config.train
    # WRN-10 to WRN-52 in steps of six layers (a WRN's depth is 6n + 4): 8 members, k 0.79-0.25.
    s.family.depths = (10, 16, 22, 28, 34, 40, 46, 52)
    config.data.num_train = 16_000  # n / 8 = 2,000: 4.6x past the largest B_x2 measured (430)
    s.batch_sizes = (32, 128, 512, 1000, 2000)
    t.extra_targets = ("train_accuracy:0.85",)  # secondary: runs go on to 85%
    t.max_epochs = 20.0
    t.eval_every_examples = 1600  # a tenth of an epoch
    t.eval_batch = 2000
    if variant == "fashion_confirm_replicate":
        s.seeds, s.confirm_seeds = (100, 101), (102, 103)
