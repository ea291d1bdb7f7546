"""The comparison of two studies' records (tools.bench.compare_records): trials matched by name
across config hashes, a changed target found, a study missing trials, bad input."""

from tools.bench import compare_records
from wide_tf.store import workdir as workdir_lib
from wide_tf.study.trials import trial_name


def _record(trial_id, steps=40, interp=37.5, status="reached", time_s=None):
    rec = {
        "trial_id": trial_id,
        "status": status,
        "steps": steps,
        "targets": [
            {
                "metric": "train_accuracy",
                "value": 0.97,
                "status": status,
                "steps_to_target": steps,
                "steps_to_target_interp": interp,
            }
        ],
    }
    if time_s is not None:
        rec["time_s"] = time_s
    return rec


def test_trial_name_drops_only_the_config_hash():
    assert trial_name("mlp-d1-w667_b8_lr1_s0_cc483cdc") == "mlp-d1-w667_b8_lr1_s0"
    assert trial_name("mlp-d1-w667_b8_lr1_s0") == "mlp-d1-w667_b8_lr1_s0"
    assert trial_name("run_lr0.5_s12") == "run_lr0.5_s12"


def test_matches_across_hashes_and_finds_a_changed_crossing(tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for rec in (_record("m_b8_lr1_s0_0d2e77a2"), _record("m_b8_lr1_s1_3e11f2bc", steps=50)):
        workdir_lib.record_result(a, rec)
    workdir_lib.record_result(a, _record("m_b8_lr2_s0_11111111"))  # only in a
    seconds = {"train": 3.0, "eval": 1.0}
    workdir_lib.record_result(b, _record("m_b8_lr1_s0_88d60428", time_s=seconds))
    workdir_lib.record_result(b, _record("m_b8_lr1_s1_d497158e", steps=50, interp=48.0))
    out = compare_records.compare(a, b)
    assert (out["a"], out["b"], out["common"], out["identical"]) == (3, 2, 2, 1)
    assert out["differ"] == ["m_b8_lr1_s1"]  # the interpolated crossing moved
    assert out["only_a"] == ["m_b8_lr2_s0"] and out["only_b"] == []
    assert out["time_a"] is None and out["time_b"]["train"] == 3.0
    assert compare_records.main([a, b]) == 1  # a difference: not a clean exit
    text = capsys.readouterr().out
    assert "identical records" in text and "1/2" in text and "differs: m_b8_lr1_s1" in text
    assert "no seconds by kind" in text


def test_identical_studies_exit_zero_and_no_common_trial_is_bad_input(tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    workdir_lib.record_result(a, _record("m_b8_lr1_s0_0d2e77a2"))
    workdir_lib.record_result(b, _record("m_b8_lr1_s0_88d60428"))
    assert compare_records.main([a, b]) == 0
    assert compare_records.main([a, str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give two workdirs of the same study" in err
