"""The dry run's cohort plan (checks/cohort_plan.py) and the arithmetic it reads
(schema/arithmetic.py): multiply-adds against the Keras models themselves, the packing against
the memory model, the lines a user reads."""

import math

import pytest

from wide_tf.checks import cohort_plan, dry_run, hardware_fit, loader
from wide_tf.schema import arithmetic, memory, plan


def _keras_multiply_adds(model) -> int:
    """Multiply-adds of a built model's Dense and Conv2D layers, from their own shapes."""
    import keras

    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense):
            total += math.prod(layer.kernel.shape)
        elif isinstance(layer, keras.layers.Conv2D):
            _, h, w, _ = layer.output.shape
            total += h * w * math.prod(layer.kernel.shape)
    return total


@pytest.mark.parametrize(
    "arch, depth, width, shape",
    [("mlp", 3, 40, (8, 8, 1)), ("wrn", 10, 0.5, (7, 7, 1)), ("wrn", 16, 1.0, (32, 32, 3))],
)
def test_multiply_adds_are_the_models_own(arch, depth, width, shape):
    from wide_tf.engine.models import build_model

    model = build_model(arch, depth, width, 10, shape, norm="batch")
    assert arithmetic.forward_multiply_adds(arch, depth, width, 10, shape) == _keras_multiply_adds(
        model
    )
    assert arithmetic.training_flop(1000) == 6000


def test_wrn_28_10_on_cifar_is_the_published_count():
    # Zagoruyko & Komodakis's WRN-28-10 is quoted at 5.25 G multiply-adds per 32x32 image.
    assert arithmetic.forward_multiply_adds("wrn", 28, 10, 10, (32, 32, 3)) / 1e9 == pytest.approx(
        5.24, abs=0.02
    )


def test_the_plan_packs_by_the_memory_model():
    config = loader.load_config("configs/mlp.py:local")
    p = cohort_plan.plan_for(config, 1, "h100-80gb")
    rows = hardware_fit.check(config, 1, "h100-80gb").rows
    assert [(c.member, c.batch, c.run_bytes) for c in p.cells] == [
        (r.member, r.batch, r.bytes) for r in rows
    ]
    usable = memory.device("h100-80gb").usable
    assert all(c.fits == usable // c.run_bytes for c in p.cells)
    s = config.sweep
    assert p.ready == len(s.lr_multipliers) * len(s.seeds)
    assert p.most_runs == (len(s.lr_multipliers) + s.max_lr_extensions) * len(s.seeds) + len(
        s.confirm_seeds
    )
    c = p.cells[0]
    steps = plan.budget_steps(
        max_steps=config.train.max_steps,
        max_epochs=config.train.max_epochs,
        min_steps=config.train.min_steps,
        num_train=1438,
        batch=c.batch,
    )
    depth, width = (int(x[1:]) for x in c.member.split("-")[1:])
    flop = arithmetic.training_flop(
        arithmetic.forward_multiply_adds("mlp", depth, width, 10, (8, 8, 1))
    )
    assert c.flop_per_run == flop * steps * c.batch


def test_the_lines_say_what_fits_and_the_arithmetic_at_peak():
    config = loader.load_config("configs/wrn.py")
    lines = []
    assert dry_run.run(config, 4, "v4-8", lines.append) == 0
    assert lines[2].startswith("cohorts: on 4 x v4 a cell's first round is ")
    assert "batch 256 puts 64 examples on each replica" in lines[2]
    assert (
        lines[3].startswith("arithmetic: the protocol's largest extent")
        and "275 TFLOPs" in lines[3]
    )
    # A device without a recorded peak rate says so; a cell where one run does not fit says so.
    p = cohort_plan.plan_for(config, 1, "t4")
    assert p.tightest.fits == 0 and "not even one run" in p.lines()[0]
    assert "no peak rate recorded for t4" in p.lines()[1]


def test_a_single_run_has_no_cohort_plan():
    config = loader.load_config("configs/wrn.py:single")
    assert cohort_plan.plan_for(config, 1, "v4") is None
