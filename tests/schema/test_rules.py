"""wide_tf.schema.rules: the cross-field rules, one function that the config checks and the trainer
both run, and the batch split that BatchPlan is computed with. TensorFlow-free."""

import pytest

from wide_tf.schema import defaults, rules


def _single(**train):
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep = None
    config.model.depth, config.model.width = 1, 64
    config.optim.name = "momentum"
    for k, v in train.items():
        setattr(config.train, k, v)
    return config


def test_micro_batches_are_the_smallest_equal_split_that_fits():
    assert rules.micro_batches(64) == 1 and rules.micro_batches(64, 64) == 1
    assert rules.micro_batches(64, 32) == 2
    assert rules.micro_batches(60, 16) == 4  # 15 each: 60 / 16 rounds up to 4, which divides 60
    assert rules.micro_batches(56, 16) == 4
    assert rules.micro_batches(52, 16) == 4 and rules.micro_batches(50, 16) == 5


def test_a_valid_config_passes_and_each_rule_is_one_line():
    rules.check(_single(), 1438)
    cases = [
        (dict(global_batch=2000), "batch 2000 is larger than the training set of digits_embedded"),
        (dict(max_epochs=0.0, max_steps=0), "no training budget"),
        (dict(max_steps=10, min_steps=20), "min_steps=20 is above the budget"),
        (dict(target_bn="recompute", target_bn_batch=2000), "larger than the subset"),
        (dict(target_metric="accuracy"), "train.target_metric='accuracy' is not valid"),
        (dict(target_value=1.5), "an accuracy above 1 can never be met"),
        (dict(extra_targets=["train_los:0.1"]), "did you mean 'train_loss'"),
    ]
    for train, words in cases:
        with pytest.raises(rules.RuleError, match=words):
            rules.check(_single(**train), 1438)


def test_optimizer_runtime_and_model_rules():
    config = _single()
    config.optim.name, config.optim.momentum_warmup_steps = "sgd", 5
    with pytest.raises(rules.RuleError, match="use momentum, nesterov or lars"):
        rules.check(config, 1438)
    config = _single()
    config.optim.name, config.optim.weight_decay = "adam", 1e-4
    with pytest.raises(rules.RuleError, match="optim.name='adam' with optim.weight_decay > 0"):
        rules.check(config, 1438)
    config = _single()
    config.runtime.devices = ["/cpu:0", "/cpu:1"]
    with pytest.raises(rules.RuleError, match="cpu strategy only"):
        rules.check(config, 1438)
    config = _single()
    config.model.arch, config.model.depth = "wrn", 5
    with pytest.raises(rules.RuleError, match="model.depth=5"):
        rules.check(config, 1438)


def test_the_batch_split_over_replicas_and_ghost_batches():
    config = _single(global_batch=96)
    rules.check(config, 1438, replicas=2, source="--replicas")
    with pytest.raises(rules.RuleError, match=r"does not divide over 5 replicas \(--replicas\)"):
        rules.check(config, 1438, replicas=5, source="--replicas")
    config.model.norm, config.model.ghost_batch_size = "ghost", 32
    with pytest.raises(rules.RuleError, match="micro-.*batch of 48 on 2 replicas"):
        rules.check(config, 1438, replicas=2, source="--replicas")
    rules.check(config, 1438, replicas=None)  # the split is the trainer's, once it sees them
    config.train.global_batch, config.train.max_device_batch = 128, 24
    with pytest.raises(rules.RuleError, match="batch of 16"):  # 64 per replica in 4 of 16
        rules.check(config, 1438, replicas=2, source="--replicas")


def test_a_sweep_checks_every_batch_and_its_family():
    config = defaults.base_config("mlp", "digits_embedded")
    config.sweep.batch_sizes = [32, 4096]
    config.sweep.family.kind, config.sweep.family.depth = "width", 2
    config.sweep.family.widths = [16, 32]
    with pytest.raises(rules.RuleError, match="sweep.batch_sizes: batch 4096 is larger"):
        rules.check(config, 1438)
    config.sweep.batch_sizes = [32]
    rules.check(config, 1438)
    config.sweep.family.depth = 0
    with pytest.raises(rules.RuleError, match="sweep.family \\(kind='width'.*no hidden layer"):
        rules.check(config, 1438)
    assert rules.has_sweep(config) and not rules.has_sweep(_single())


def test_parse_target():
    assert rules.parse_target("x", "train_loss: 0.25") == ("train_loss", 0.25)
    with pytest.raises(rules.RuleError, match="has no number after the colon"):
        rules.parse_target("x", "train_loss:low")
    with pytest.raises(rules.RuleError, match="is not a target"):
        rules.parse_target("x", 0.5)
