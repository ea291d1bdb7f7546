"""runtime.cohort is part of a study above 1 (a run in a cohort may round its update otherwise in
the last bits, schema/identity.py): a workdir started one run at a time refuses cohorts and the
line names the field; a study at cohort 1 keeps the identity it had before the field existed; the
trial ids do not move with it."""

import pytest

from wide_tf.checks import loader, preflight
from wide_tf.schema import families, identity
from wide_tf.schema.problems import UsageError
from wide_tf.study import trials


def _config(cohort=1):
    config = loader.load_config("configs/mlp.py:smoke")
    config.runtime.backend = "jax"
    config.runtime.cohort = cohort
    return config


def test_a_study_run_one_at_a_time_refuses_cohorts_and_names_the_field(tmp_path):
    wd = tmp_path / "study"
    wd.mkdir()
    (wd / "config.json").write_text(_config().to_json_best_effort(indent=2, sort_keys=True))
    assert identity.differing_fields(_config(), _config(4)) == ["cohort"]
    with pytest.raises(UsageError, match="cohort") as e:
        preflight.check_same_study(_config(4), str(wd))
    assert "\n" not in str(e.value)


def test_cohort_one_is_the_study_without_the_field_and_trial_ids_never_move():
    before = _config().to_dict()
    del before["runtime"]["cohort"]
    assert identity.study_part(before) == identity.study_part(_config())
    member = families.Member(arch="mlp", depth=1, width=8, params=0)
    ids = {trials.trial_id(member, 16, 1.0, 0, _config(k)) for k in (1, 4)}
    assert len(ids) == 1
