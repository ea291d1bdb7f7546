"""wide_tf.schema: the facts every layer reads (target directions, the run plan); no TensorFlow."""

import json

import pytest

from wide_tf.schema import plan, targets


def test_each_metric_has_one_direction_losses_lower_accuracies_higher():
    assert targets.lower_is_better("train_loss") and targets.lower_is_better("test_loss")
    assert not targets.lower_is_better("train_accuracy")
    assert not targets.lower_is_better("test_accuracy")
    assert targets.comparison("train_loss") == "<=" and targets.comparison("test_accuracy") == ">="
    assert targets.met("train_accuracy", 0.97, 0.97) and not targets.met("train_loss", 0.1, 0.2)


def test_an_unknown_metric_is_refused_rather_than_guessed_from_its_name():
    # A new `*_error` metric must be declared with its direction, never read off a suffix.
    with pytest.raises(KeyError, match="train_error"):
        targets.lower_is_better("train_error")


def test_only_accuracies_are_bounded_by_one():
    bounded = {m.name for m in targets.TARGET_METRICS_SPEC.values() if m.bounded_by_one}
    assert bounded == {"train_accuracy", "test_accuracy"}


def test_the_budget_is_max_steps_else_epochs_with_a_floor():
    kw = dict(max_steps=0, max_epochs=2, min_steps=20, num_train=4000)
    assert plan.budget_steps(**kw, batch=1000) == 20  # the floor wins at a large batch
    assert plan.budget_steps(**kw, batch=16) == 500  # and not at a small one
    assert plan.budget_steps(**{**kw, "max_steps": 5}, batch=1000) == 5


def test_evaluations_fall_on_the_same_examples_for_every_batch_and_end_at_the_budget():
    assert plan.eval_steps(64, 1000, 100) == [16, 32, 47, 63, 79, 94, 100]
    assert plan.eval_steps(4000, 1000, 5) == [1, 2, 3, 4, 5]
    for batch in (8, 24, 176):
        steps = plan.eval_steps(batch, 144, 300)
        assert steps[-1] == 300 and steps == sorted(set(steps))
        # a brute-force reference: the first step at or past each multiple of 144 examples
        ref = sorted({min(-(-k * 144 // batch), 300) for k in range(1, 300 * batch // 144 + 2)})
        assert steps == ref


def test_the_study_identity_ignores_operational_settings_and_names_what_differs():
    from wide_tf.schema import defaults, identity

    mine = defaults.base_config()
    theirs = json.loads(mine.to_json_best_effort())
    theirs["runtime"]["strategy"] = "cpu"  # operational: the same study
    theirs["train"]["steps_per_loop"] = 7
    assert identity.differing_fields(theirs, mine) == []
    assert "runtime" not in identity.study_part(mine)
    theirs["train"]["seed"] = 3
    theirs["sweep"]["family"]["budget"] = 1.0
    assert identity.differing_fields(theirs, mine) == ["sweep.family.budget", "train.seed"]
    del theirs["train"]["seed"]  # a field one side lacks: a difference even if the other is None
    mine.train.seed = None
    assert identity.differing_fields(theirs, mine) == ["sweep.family.budget", "train.seed"]
    assert identity.describe(list("abcdefg")) == "a, b, c, d, e, f ..."
    assert identity.describe(["x"]) == "x"


def test_every_field_is_declared_once_with_a_doc_and_its_default_in_its_domain():
    from wide_tf.schema import defaults, fields

    config = defaults.base_config()
    paths = [f.path for section in fields.SECTIONS.values() for f in section]
    assert len(paths) == len(set(paths)) == len(fields.FIELDS)
    for f in fields.FIELDS.values():
        assert f.doc and f.section in ("model", "data", "optim", "train", "runtime", "sweep")
        node = config
        for part in f.path.split("."):
            node = node[part]
        assert node == f.default
        if isinstance(f.domain, fields.Choice):
            assert f.default in f.domain.choices(), f.path

    # and every field of a built config is declared
    def walk(node, prefix):
        for k in node.keys():
            if hasattr(node[k], "keys"):
                yield from walk(node[k], f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    built = [p for s in fields.SECTIONS for p in walk(config[s], f"{s}.")]
    assert sorted(built) == sorted(paths)
    assert defaults.model_config("wrn", 10, 2.0).width == 2.0
    with pytest.raises(TypeError, match="no field 'widht'"):
        defaults.section("model", widht=2.0)
