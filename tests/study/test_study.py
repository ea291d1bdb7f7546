"""Studies: sweep expansion and trial ids, LR-grid extension, refusing a foreign workdir, exact
resume after SIGKILL, and two shards sharing one workdir."""

import json

import pytest
from helpers import comparable, kill_when, run_main, start_main

from wide_tf.checks.loader import load_config
from wide_tf.schema.problems import UsageError
from wide_tf.store import workdir as wd
from wide_tf.study import progress
from wide_tf.study import scheduler as study
from wide_tf.study import trials as trials_lib


def _smoke(**sweep):
    config = load_config("configs/mlp.py:smoke")
    for k, v in sweep.items():
        setattr(config.sweep, k, v)
    return config


def test_expansion_and_trial_ids_are_stable_and_distinct():
    config = _smoke(lr_multipliers=[0.5, 1.0], seeds=[0, 1])
    trials = trials_lib.expand(config, 10, (8, 8, 1))
    assert len(trials) == 2 * 2 * 2 * 2
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == len(ids)
    again = trials_lib.expand(_smoke(lr_multipliers=[0.5, 1.0], seeds=[0, 1]), 10, (8, 8, 1))
    assert ids == [t.trial_id for t in again]
    # Another protocol, same (member, batch, lr, seed): another id.
    other = _smoke(lr_multipliers=[0.5, 1.0], seeds=[0, 1])
    other.train.target_value = 0.6
    assert set(ids).isdisjoint(t.trial_id for t in trials_lib.expand(other, 10, (8, 8, 1)))
    t = trials[0]
    assert t.config.train.global_batch == t.batch_size and t.config.model.depth == t.member.depth
    assert t.config.optim.lr_multiplier == t.lr_multiplier and "sweep" not in t.config


def _result(t, status, steps=None):
    return {
        "trial_id": t.trial_id,
        "member": t.member.name,
        "batch_size": t.batch_size,
        "seed": t.seed,
        "lr_multiplier": t.lr_multiplier,
        "learning_rate": 0.1 * t.lr_multiplier,
        "num_train": 1438,
        "status": status,
        "steps_to_target": steps,
        "steps": steps or 100,
        "role": t.role,
    }


def test_next_trials_extend_the_grid_then_confirm_the_chosen_rate():
    config = _smoke(lr_multipliers=[0.5, 1.0, 2.0], batch_sizes=[32], extend_lr_grid=True)
    config.sweep.family.depths = [1]
    config.sweep.confirm_seeds = [1, 2]
    trials = trials_lib.expand(config, 10, (8, 8, 1))
    assert {t.seed for t in trials} == {0}  # the grid runs on the tuning seed only
    by_lr = {t.lr_multiplier: t for t in trials}
    # Largest learning rate wins: extend upwards, keeping the grid's ratio.
    results = {
        t.trial_id: _result(t, "reached", {0.5: 90, 1.0: 60, 2.0: 40}[lr])
        for lr, t in by_lr.items()
    }
    new = trials_lib.next_trials(config, trials, results)
    assert [(t.lr_multiplier, t.seed, t.role) for t in new] == [(4.0, 0, "tune")]
    # An interior winner: the grid is final, so the chosen rate runs on the confirmation seeds,
    # as ordinary trials with their own ids.
    results = {
        t.trial_id: _result(t, "reached", {0.5: 90, 1.0: 30, 2.0: 40}[lr])
        for lr, t in by_lr.items()
    }
    new = trials_lib.next_trials(config, trials, results)
    assert [(t.lr_multiplier, t.seed, t.role) for t in new] == [
        (1.0, 1, "confirm"),
        (1.0, 2, "confirm"),
    ]
    assert len({t.trial_id for t in new} | set(results)) == len(new) + len(results)
    assert all(t.meta()["role"] == "confirm" for t in new)
    # Once confirmed, the cell is complete.
    done = dict(results, **{t.trial_id: _result(t, "reached", 33) for t in new})
    assert trials_lib.next_trials(config, trials + new, done) == []
    # Nothing reached because every rate diverged: go down.
    results = {t.trial_id: _result(t, "diverged") for lr, t in by_lr.items()}
    assert [t.lr_multiplier for t in trials_lib.next_trials(config, trials, results)] == [0.25]
    # Nothing reached because the budget ran out (no divergence): go up, where runs are faster.
    results = {t.trial_id: _result(t, "not_reached") for lr, t in by_lr.items()}
    assert [t.lr_multiplier for t in trials_lib.next_trials(config, trials, results)] == [4.0]
    # Too slow at small rates and diverging at large ones: no extension, nothing to confirm.
    results = {
        t.trial_id: _result(t, "diverged" if lr == 2.0 else "not_reached")
        for lr, t in by_lr.items()
    }
    assert trials_lib.next_trials(config, trials, results) == []
    # Unfinished groups wait; the extension budget is respected.
    assert trials_lib.next_trials(config, trials, {}) == []
    config.sweep.max_lr_extensions = 0
    results = {
        t.trial_id: _result(t, "reached", {0.5: 90, 1.0: 60, 2.0: 40}[lr])
        for lr, t in by_lr.items()
    }
    assert [t.role for t in trials_lib.next_trials(config, trials, results)] == [
        "confirm",
        "confirm",
    ]


def test_shard_parsing():
    assert trials_lib.parse_shard("1/3") == (1, 3)
    assert trials_lib.parse_shard(None) == (0, 1)
    with pytest.raises(trials_lib.StudyError, match="i/n"):
        trials_lib.parse_shard("2")
    with pytest.raises(trials_lib.StudyError, match="0 <= i < n"):
        trials_lib.parse_shard("3/3")


def test_a_different_study_on_the_same_workdir_is_refused(tmp_path):
    config = _smoke()
    trials_lib.check_workdir(config, str(tmp_path))
    trials_lib.check_workdir(config, str(tmp_path))  # the same study: fine
    config.runtime.strategy = "cpu"  # the runtime may differ between machines
    trials_lib.check_workdir(config, str(tmp_path))
    other = _smoke(batch_sizes=[16, 32])
    with pytest.raises(UsageError, match="different study.*sweep.batch_sizes"):
        trials_lib.check_workdir(other, str(tmp_path))


SMOKE = [
    "--config=configs/mlp.py:smoke",
    "--config.train.checkpoint_every_steps=5",
    "--config.train.steps_per_loop=5",
    "--no_report",
]


def _records(path):
    return {r["trial_id"]: r for r in wd.read_results(str(path))}


def _recorded_files(path):
    return sorted(p.name for p in (path / "results").glob("*.json"))


@pytest.mark.parametrize("store", ["local", "ram"])
def test_two_shards_recording_together_lose_no_result(tmp_path, store):
    """Two writers (threads standing in for two shard processes) record at the same time. On a
    store without locks (ram://, like gs://) a shared file's read-modify-write would lose
    records."""
    import threading

    root = str(tmp_path) if store == "local" else f"ram://{tmp_path.name}"

    def shard(k):
        for i in range(40):
            wd.record_result(
                root, {"trial_id": f"t{k}_{i:02d}", "member": "m", "batch_size": 8, "seed": k}
            )

    threads = [threading.Thread(target=shard, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records, bad = wd.read_results_counted(root)
    assert bad == 0 and len(records) == 80
    assert {r["trial_id"] for r in records} == {
        f"t{k}_{i:02d}" for k in range(2) for i in range(40)
    }


def test_every_trial_of_a_mixed_bfloat16_study_computes_in_bfloat16(tmp_path):
    """clear_session() between trials resets Keras's global dtype policy; trial 2 used to run in
    float32 while its result said mixed_bfloat16."""
    import keras

    # Two members: the second is a new build after clear_session() (the same member at another
    # batch keeps its build, engine/tf/reuse.py).
    config = _smoke(batch_sizes=[32])
    config.sweep.family.depths = [1, 2]
    config.train.max_epochs = 1.0
    config.runtime.strategy = "cpu"
    config.runtime.mixed_precision = "mixed_bfloat16"
    built = []
    from wide_tf.engine import train as train_lib

    real_build = train_lib.build_model

    def spy(*args, **kwargs):
        model = real_build(*args, **kwargs)
        built.append(model)
        return model

    try:
        train_lib.build_model = spy
        records = study.run_study(config, str(tmp_path))
    finally:
        train_lib.build_model = real_build
        keras.mixed_precision.set_global_policy("float32")
    assert len(records) == 2 and len(built) == 2
    for model in built:
        assert model.get_layer("dense_1").compute_dtype == "bfloat16"
    assert all(r["dtype_policy"] == "mixed_bfloat16" for r in records)


def test_read_results_skips_partial_files(tmp_path):
    wd.record_result(str(tmp_path), {"trial_id": "a", "status": "reached"})
    (tmp_path / "results" / "torn.json").write_text('{"trial_id": "torn", "sta')  # a crash mid-copy
    (tmp_path / "results" / "b.json.tmp-1234abcd").write_text("{")  # a writer's temporary file
    records, bad = wd.read_results_counted(str(tmp_path))
    assert [r["trial_id"] for r in records] == ["a"]
    assert bad == 1  # the torn file; the temporary file is not a result
    assert wd.read_results(str(tmp_path / "nowhere")) == []


def test_killed_study_resumes_and_records_every_trial_once(tmp_path, smoke_study):
    ref, _ = smoke_study
    killed = tmp_path / "killed"
    proc = start_main(*SMOKE, f"--workdir={killed}")
    # Kill once the first trial is recorded, most likely in the middle of the second.
    assert kill_when(proc, lambda: len(_records(killed)) >= 1)
    assert 1 <= len(_records(killed)) < 4
    run_main(*SMOKE, f"--workdir={killed}")
    files = _recorded_files(killed)
    a, b = _records(ref), _records(killed)
    assert len(files) == len(b) == len(a) == 4
    assert {k: comparable(v) for k, v in a.items()} == {k: comparable(v) for k, v in b.items()}


def test_two_shards_on_one_workdir_run_every_trial_exactly_once(tmp_path):
    shared = tmp_path / "shared"
    procs = [start_main(*SMOKE, f"--workdir={shared}", f"--shard={i}/2") for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    lines = [
        json.loads((shared / "results" / name).read_text()) for name in _recorded_files(shared)
    ]
    ids = [r["trial_id"] for r in lines]
    assert len(ids) == len(set(ids)) == 4
    expected = {
        t.trial_id for t in trials_lib.expand(load_config("configs/mlp.py:smoke"), 10, (8, 8, 1))
    }
    assert set(ids) == expected


def test_progress_expects_every_round_of_every_group():
    """The whole study's expected trials: before any group finishes, grid + one extension round +
    confirmations per group; then the size of the finished groups; a group in its confirmation
    round knows its own size."""
    config = _smoke(lr_multipliers=[0.5, 1.0, 2.0], batch_sizes=[32, 256], extend_lr_grid=True)
    config.sweep.family.depths = [1]
    config.sweep.confirm_seeds = [1, 2]
    trials = trials_lib.expand(config, 10, (8, 8, 1))
    initial = trials_lib.group_trials(trials)
    assert len(initial) == 2
    p = progress.estimate_progress(config, initial, {})
    assert (p.done, p.expected, p.groups_done, p.groups_total) == (0, 2 * (3 + 1 + 2), 0, 2)
    assert p.describe() == "0/12 trials (expected), 0/2 groups done"
    # Group 1: an interior winner, confirmed on two seeds: 5 trials in all, finished.
    g1, g2 = initial.values()
    results = {
        t.trial_id: _result(t, "reached", {0.5: 90, 1.0: 30, 2.0: 40}[t.lr_multiplier]) for t in g1
    }
    known, pending = trials_lib.expand_group(config, g1, results)
    assert [t.role for t in pending] == ["confirm", "confirm"] and len(known) == 5
    p = progress.estimate_progress(config, initial, results)
    assert (p.done, p.expected) == (3, 5 + 6)  # group 1 is confirming: 5; group 2: the prior
    results.update({t.trial_id: _result(t, "reached", 33) for t in pending})
    assert trials_lib.expand_group(config, g1, results)[1] == []
    p = progress.estimate_progress(config, initial, results)
    assert (p.done, p.expected, p.groups_done) == (5, 5 + 5, 1)  # group 2 as large as group 1
