"""The registries drive the record: the protocol block of result.json and the
report's protocol table read the chosen optimizer's and schedule's declared fields; nothing names
an optimizer or a schedule in code."""

import pytest

from wide_tf.engine.result import describe_protocol
from wide_tf.report import protocol
from wide_tf.schema import defaults, fields, lr_schedules, optimizers


def _config(opt: str, sched: str):
    config = defaults.base_config("mlp", "digits_embedded")
    config.optim.name, config.optim.schedule = opt, sched
    return config


@pytest.mark.parametrize("sched", lr_schedules.NAMES)
def test_the_protocol_records_exactly_the_schedules_declared_fields(sched):
    entry = lr_schedules.SCHEDULES[sched]
    assert all(f"optim.{f}" in fields.FIELDS for f in entry.hyper)
    config = _config("sgd", sched)
    p = describe_protocol(config)
    assert list(p["schedule_settings"]) == list(entry.hyper)
    text = dict(protocol.trial_settings_rows([{"protocol": p}]))["Schedule"]
    assert text.startswith(sched)
    for f in entry.hyper:  # every declared value is shown
        assert str(config.optim[f]) in text


@pytest.mark.parametrize("opt", optimizers.NAMES)
def test_the_protocol_records_the_optimizers_declared_fields(opt):
    config = _config(opt, "constant")
    config.optim.weight_decay, config.optim.momentum_warmup_steps = 5e-4, 7
    p = describe_protocol(config)
    own = optimizers.own_hyper(opt)
    for f in optimizers.SHARED_HYPER:
        assert p[f] == config.optim[f]
    for (
        name
    ) in optimizers.NAMES:  # a block per optimizer with fields of its own, None unless chosen
        if optimizers.own_hyper(name):
            assert (p[name] is not None) == (name == opt)
    if own:
        assert {f"{opt}_{k}" for k in p[opt]} == set(own)
    row = dict(protocol.trial_settings_rows([{"protocol": p}]))["Optimizer"]
    declared = optimizers.OPTIMIZERS[opt].hyper
    assert ("weight decay 0.0005" in row) == ("weight_decay" in declared)
    assert ("over the first 7 steps" in row) == ("momentum_warmup_steps" in declared)
    # Every field of the protocol is shown by a named row of the table.
    rows = dict(protocol.trial_settings_rows([{"protocol": p}]))
    assert not set(p) & set(rows), set(p) & set(rows)


def test_every_hyper_parameter_has_its_words_and_its_field():
    declared = {f for o in optimizers.OPTIMIZERS.values() for f in o.hyper}
    assert declared == set(optimizers.HYPER_TEXT)
    assert all(f"optim.{f}" in fields.FIELDS for f in declared)
