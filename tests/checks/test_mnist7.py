"""configs/mlp.py:mnist7, the confirmatory study frozen before its first run: the design the
design simulation was run on (docs/results/) must be the design the study runs."""

from wide_tf.analysis import simulate
from wide_tf.checks import loader, validate


def _assert_plain_sgd_stopping_at(config, target):
    """The frozen protocol both studies share: plain SGD at 0.1, runs stopped at one training
    accuracy target."""
    t = config.train
    assert (t.target_metric, t.target_value, list(t.extra_targets), t.stop_at_target) == (
        "train_accuracy",
        target,
        [],
        True,
    )
    assert (config.optim.name, config.optim.momentum, config.optim.base_lr) == ("sgd", 0.0, 0.1)


def test_the_frozen_design_is_the_simulated_one():
    config = loader.load_config("configs/mlp.py:mnist7")
    validate.check_config(config)
    assert (config.data.name, config.data.pool) == ("mnist_embedded", 4)
    assert validate.dataset_facts(config)[:3] == (4000, 10, (7, 7, 1))
    d = simulate.design_from_config("configs/mlp.py:mnist7")
    assert d.widths == (80.0, 86.0, 94.0, 104.0, 119.0, 143.0, 195.0, 833.0)
    assert d.depths == (8, 7, 6, 5, 4, 3, 2, 1)
    assert d.batch_sizes == (8, 16, 32, 64, 128, 256, 500) and max(d.batch_sizes) == 4000 // 8
    assert (d.tuning_seeds, d.confirm_seeds, d.lr_multipliers) == ((0, 1), (2, 3, 4), (0.5, 1, 2))
    assert (d.max_lr_extensions, d.max_epochs, d.min_steps, d.eval_every_examples) == (
        4,
        30.0,
        600,
        400,
    )
    _assert_plain_sgd_stopping_at(config, 0.95)


def test_the_frozen_fashion_design_is_the_simulated_one():
    """configs/mlp.py:fashion7 (frozen before its first run): the design line the simulation
    printed (8 members, widths 80-833, batches 16-2,000, 5 seeds, n = 16,000) and the 80% target."""
    config = loader.load_config("configs/mlp.py:fashion7")
    validate.check_config(config)
    assert (config.data.name, config.data.pool, config.data.num_train) == (
        "fashion_mnist_idx",
        4,
        16000,
    )
    assert validate.dataset_facts(config)[:3] == (16000, 10, (7, 7, 1))
    d = simulate.design_from_config("configs/mlp.py:fashion7")
    assert d.widths == (80.0, 86.0, 94.0, 104.0, 119.0, 143.0, 195.0, 833.0)
    assert d.batch_sizes == (16, 32, 64, 128, 256, 512, 1024, 2000) and d.num_train == 16000
    assert max(d.batch_sizes) == 16000 // 8
    assert (d.tuning_seeds, d.confirm_seeds, d.lr_multipliers) == ((0, 1), (2, 3, 4), (0.5, 1, 2))
    assert (d.max_epochs, d.min_steps, d.eval_every_examples) == (30.0, 600, 1600)
    _assert_plain_sgd_stopping_at(config, 0.80)


def test_the_frozen_wrn_fashion_design_is_the_simulated_one():
    """configs/wrn.py:fashion7 (frozen before its first run): the design line the simulation
    printed (6 WRNs, k 0.25-0.79, batches 32-1,000, 4 seeds per cell, n = 8,000) and the 80%
    target, with mnist7's protocol (batch-norm statistics recomputed before each evaluation)."""
    config = loader.load_config("configs/wrn.py:fashion7")
    validate.check_config(config)
    assert (config.data.name, config.data.pool, config.data.num_train) == (
        "fashion_mnist_idx",
        4,
        8000,
    )
    d = simulate.design_from_config("configs/wrn.py:fashion7")
    assert d.widths == (0.25, 0.29, 0.36, 0.42, 0.53, 0.79)
    assert d.depths == (52, 40, 28, 22, 16, 10)
    assert d.batch_sizes == (32, 128, 512, 1000) and max(d.batch_sizes) == 8000 // 8
    assert (d.tuning_seeds, d.confirm_seeds, d.lr_multipliers) == ((0, 1), (2, 3), (0.5, 1, 2))
    assert (d.max_lr_extensions, d.max_epochs, d.min_steps, d.eval_every_examples) == (
        4,
        20.0,
        600,
        800,
    )
    assert (config.model.ghost_batch_size, config.train.target_bn) == (8, "recompute")
    _assert_plain_sgd_stopping_at(config, 0.80)


def test_the_wrn_fashion_replicate_is_the_study_on_other_seeds():
    """configs/wrn.py:fashion7_replicate (frozen before its first run): fashion7 with tuning seeds
    100-101 and confirmation seeds 102-103, every other field the same (the image subset too:
    data.subset_seed draws it), so the pair reads as one design on twice the seeds."""
    study = loader.load_config("configs/wrn.py:fashion7").to_dict()
    replicate = loader.load_config("configs/wrn.py:fashion7_replicate").to_dict()
    assert (replicate["sweep"].pop("seeds"), replicate["sweep"].pop("confirm_seeds")) == (
        (100, 101),
        (102, 103),
    )
    assert set(study["sweep"].pop("seeds")) | set(study["sweep"].pop("confirm_seeds")) == {
        0,
        1,
        2,
        3,
    }
    assert replicate == study
