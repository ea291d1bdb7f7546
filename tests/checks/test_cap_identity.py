"""train.max_device_batch is operational where micro-batching is exact (ghost batch norm, no norm):
a workdir started without a cap resumes with one, with the same trial ids; under plain batch norm
it stays part of the study and the refusal says why."""

import pytest

from wide_tf.checks import loader, preflight
from wide_tf.schema import families, identity
from wide_tf.schema.problems import UsageError
from wide_tf.study import trials


def _config(norm, cap=0):
    config = loader.load_config("configs/mlp.py:smoke")
    config.model.norm = norm
    config.model.ghost_batch_size = 4
    config.train.max_device_batch = cap
    return config


def _started(tmp_path, config, name="study"):
    wd = tmp_path / name
    wd.mkdir()
    (wd / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
    return str(wd)


@pytest.mark.parametrize("norm", ["ghost", "none"])
def test_a_study_started_without_a_cap_resumes_with_one(tmp_path, norm):
    wd = _started(tmp_path, _config(norm))
    assert preflight.check_same_study(_config(norm, cap=8), wd)
    assert identity.differing_fields(_config(norm), _config(norm, cap=8)) == []


def test_plain_batch_norm_refuses_the_cap_and_says_why(tmp_path):
    wd = _started(tmp_path, _config("batch"))
    with pytest.raises(UsageError) as e:
        preflight.check_same_study(_config("batch", cap=8), wd)
    line = str(e.value)
    assert "\n" not in line
    assert "train.max_device_batch stays part of the study under model.norm='batch'" in line
    assert "normalised with its own statistics" in line and "new --workdir" in line


def test_the_study_opens_its_workdir_through_the_same_check(tmp_path):
    wd = _started(tmp_path, _config("ghost"))
    trials.check_workdir(_config("ghost", cap=8), wd)  # no error
    wd_bn = _started(tmp_path, _config("batch"), name="bn")
    with pytest.raises(UsageError, match="stays part of the study under model.norm='batch'"):
        trials.check_workdir(_config("batch", cap=8), wd_bn)


def test_trial_ids_do_not_move_with_an_operational_cap_and_do_under_batch_norm():
    member = families.Member(arch="mlp", depth=1, width=8, params=0)

    def tid(config):
        return trials.trial_id(member, 16, 1.0, 0, config)

    assert tid(_config("ghost")) == tid(_config("ghost", cap=8))
    assert tid(_config("none")) == tid(_config("none", cap=8))
    assert tid(_config("batch")) != tid(_config("batch", cap=8))
    # The operational cap enters as 0: a study without a cap keeps the ids it always had.
    assert identity.study_part(_config("ghost", cap=8))["train"]["max_device_batch"] == 0
    assert identity.study_part(_config("batch", cap=8))["train"]["max_device_batch"] == 8
