"""Test-session set-up: quiet TensorFlow, two logical CPU devices for multi-replica tests, both
set the moment TensorFlow is first imported, so that tests that never import it (the launcher's,
the schema's) do not pay for its import."""

import contextlib
import fcntl
import importlib.abc
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the tests are CPU tests, also on a GPU box


def _configure_tensorflow(tf) -> None:
    # Logical devices must be configured before TensorFlow initialises its runtime, so this runs
    # as its import ends: every test sees CPU:0 and CPU:1 (the default strategy still uses one
    # device; MirroredStrategy tests ask for both).
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    except RuntimeError:  # already initialised by a plugin; multi-replica tests will skip
        pass

    class _TestMirroredStrategy(tf.distribute.MirroredStrategy):
        """MirroredStrategy that reduces through one device unless told otherwise.

        Many tests in one process each create a MirroredStrategy over the two logical CPUs. With
        the default collective all-reduce, their collective instance keys collide ("Shape mismatch
        in the collective instance 100 ... expected shape [6] but another member ... [932]"), a
        test-only artefact: a real run creates one strategy per process. Plain reductions avoid
        it."""

        def __init__(self, devices=None, cross_device_ops=None):
            super().__init__(devices, cross_device_ops or tf.distribute.ReductionToOneDevice())

    tf.distribute.MirroredStrategy = _TestMirroredStrategy


class _ConfigureTensorFlowOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the first import of tensorflow (a test module's, or Keras's) it
    lets the usual finders find it and configures the module as soon as it has run, before any
    test can use it; then it leaves sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _configure_tensorflow(module)

        spec.loader.exec_module = exec_module
        return spec


if "tensorflow" in sys.modules:  # a plugin imported it before this file
    _configure_tensorflow(sys.modules["tensorflow"])
else:
    sys.meta_path.insert(0, _ConfigureTensorFlowOnImport())


def shared_folder(tmp_path_factory) -> Path:
    """The session's folder that every test process sees: under pytest-xdist, the parent of the
    worker's own basetemp (the pattern pytest-xdist documents for a fixture built once per
    session); in one process, the basetemp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def once_per_session(tmp_path_factory, name: str, build):
    """`build(folder)` run once in the whole test session, whichever process asks first (the
    others wait for it under a file lock, then read what it left): (folder, the JSON value
    `build` returned). A build that raised leaves nothing, so the next process to ask runs it
    again and fails with its own error."""
    root = shared_folder(tmp_path_factory)
    folder, done = root / f"once-{name}", root / f"once-{name}.json"
    with _locked(root / f"once-{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            value = build(folder)
            tmp = root / f"once-{name}.json.tmp"
            tmp.write_text(json.dumps(value))
            tmp.rename(done)
    return folder, json.loads(done.read_text())


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory):
    """A finished `configs/mlp.py:smoke` study run by one process (`--workers=1`), report included,
    and that command's stderr: the one reference that resumed, sharded and multi-worker runs of the
    same study are compared with. Run once per test session (once_per_session: both xdist workers
    read the same study, instead of each running it). Tests read it and never write into it."""
    from helpers import run_main

    def build(folder):
        proc = run_main(
            "--config=configs/mlp.py:smoke", f"--workdir={folder / 'study'}", "--workers=1"
        )
        return proc.stderr

    folder, stderr = once_per_session(tmp_path_factory, "smoke_study", build)
    return folder / "study", stderr


# ------------------------------------------------------------------------------------------------
# Scheduling under pytest-xdist (`-n 2`). Every test is a unit of its own, handed to whichever
# worker is free next, except the tests that share a module-scoped fixture costing seconds to build
# (a study, a child process, a bench run, a report with its figures), which go to one worker as one
# unit: the fixture is built once, not once per worker. The slowest units go first, so that the
# run does not end with one long test alone. pytest-xdist's `--dist loadgroup` would group them, but
# on pytest 9.2 its `xdist_group` marks silently stop grouping (it renames item._nodeid, which
# pytest 9.2 no longer reads: the tests of a group spread over the workers), so the units are named
# here, from the test ids alone, for both the controller and the workers.

# Modules whose tests form one unit (those that share its module-scoped fixture named beside it);
# a test of them listed in SLOWEST (one that does not use the fixture) is still a unit of its own.
ONE_UNIT = {
    "tests/tools/test_bench.py": "rows",
    "tests/engine/test_jax_backend.py": "checks",
    "tests/engine/test_targets.py": "with_extras",
    "tests/study/test_workers.py": "slow_reference",
    "tests/report/test_report.py": "full_report",
    "tests/report/test_report_writers.py": "finished",
}
# Modules whose parametrized module fixture is one build per param: one unit per param.
ONE_UNIT_PER_PARAM = {"tests/engine/test_checkpoint_fallback.py": "finished"}

# The slowest tests and units, slowest first (measured on the 2-core machine, docs/testing.md):
# these start first; every other test keeps its place in the collection.
SLOWEST = (
    "tests/study/test_interruptions.py::test_killed_at_five_points_completes_once_with_the_same_results",
    "tests/study/test_suite.py::test_a_suite_stopped_by_sigterm_resumes_then_writes_its_table",
    "tests/engine/test_jax_backend.py",
    "tests/tools/test_bench.py",
    "tests/engine/test_checkpoint_fallback.py[tensorflow]",
    "tests/engine/test_preemption.py::test_sigterm_checkpoints_exits_143_and_the_rerun_resumes",
    "tests/engine/test_checkpoint_fallback.py[jax]",
    "tests/study/test_workers.py",
    "tests/report/test_report_writers.py::test_two_writers_at_once_leave_one_whole_report",
    "tests/tools/test_bench.py::test_workers_part_times_one_study_with_one_and_two_workers",
    "tests/study/test_study.py::test_killed_study_resumes_and_records_every_trial_once",
    "tests/engine/test_keras_ops_backends.py::test_tensorflow_and_jax_backends_compute_the_same_model_optimizer_and_schedule",
    "tests/engine/test_micro_batch.py::test_ghost_batch_norm_micro_batches_on_a_wide_resnet_under_two_replicas",
    "tests/engine/test_run.py::test_killed_run_resumes_to_the_same_result",
    "tests/study/test_claims.py::test_a_forward_clock_step_frees_no_live_claim",
    "tests/engine/test_micro_batch.py::test_ghost_batch_norm_every_variable_is_the_same_for_1_2_4_micro_batches",
    "tests/study/test_claims.py::test_a_worker_stopped_past_its_lease_writes_nothing_more",
    "tests/engine/test_multiworker.py::test_main_runs_under_multi_worker",
    "tests/engine/test_determinism.py::test_same_config_and_seed_give_an_identical_result",
    "tests/study/test_workers.py::test_two_workers_run_every_trial_once_and_report_as_one_process",
    "tests/study/test_study.py::test_two_shards_on_one_workdir_run_every_trial_exactly_once",
    "tests/engine/test_seeding.py::test_no_traced_function_of_the_engine_reads_tensorflows_global_seed",
    "tests/engine/test_preemption_hosts.py::test_without_the_agreement_the_other_host_runs_on",
    "tests/schema/test_own_model.py::test_a_study_runs_an_outside_model",
    "tests/checks/test_errors.py::test_truncated_checkpoint_is_one_line_and_no_tensorflow_noise",
    "tests/report/test_report_writers.py::test_a_rerun_replaces_the_report_whole_and_keeps_the_theory_files",
    "tests/study/test_study.py::test_every_trial_of_a_mixed_bfloat16_study_computes_in_bfloat16",
    "tests/engine/test_multiworker.py::test_two_workers_match_one_process",
    "tests/analysis/test_stats.py::test_b_crit_interval_coverage",
    "tests/analysis/test_frozen.py::test_main_refuses_another_config_and_stamps_every_record",
    "tests/engine/test_span.py::test_a_run_in_spans_records_what_it_records_one_interval_at_a_time",
    "tests/engine/test_engine.py::test_xla_step_gives_the_same_weights_as_the_plain_step",
    "tests/engine/test_targets.py::test_recompute_is_recorded_and_the_run_still_trains_to_the_target",
    "tests/engine/test_infeed.py::test_training_and_evaluation_give_the_numbers_of_the_float32_path",
    "tests/launch/test_vm_jax_check.py::test_two_jax_processes_see_every_device_and_meet_in_one_psum",
    "tests/analysis/test_predict.py::test_report_has_the_prediction_section_and_plot",
    "tests/analysis/test_verdict_rule.py::test_a_study_and_its_replicate_read_together",
    "tests/engine/test_divergence.py::test_a_grid_with_a_diverging_rate_completes_and_reports_it",
    "tests/engine/test_fused.py::test_a_fused_run_follows_the_executors",
    "tests/report/test_report.py::test_bad_workdir_errors",
    "tests/report/test_suite_data_sets.py::test_two_data_sets_are_read_apart",
    "tests/report/test_report.py::test_report_only_failed_trials_and_grid_edges",
    "tests/report/test_links_never_followed.py::test_the_report_clean_up_unlinks_planted_links_and_keeps_their_targets",
    "tests/engine/test_run.py::test_probe_on_two_replicas_matches_one",
    "tests/engine/test_evaluation_economy.py::test_every_run_of_the_smoke_study_is_recorded_as_with_whole_passes",
    "tests/engine/test_span.py::test_a_run_stopped_between_spans_resumes_to_the_same_record",
)
_RANK = {name: i for i, name in enumerate(SLOWEST)}


def unit_of(nodeid: str) -> str:
    """The unit a test is scheduled in: a module, a module's param, or the test itself."""
    test = nodeid.split("[")[0]
    module = test.split("::")[0]
    if module in ONE_UNIT_PER_PARAM and nodeid.endswith("]"):
        return module + nodeid[len(test) :].split("-")[0].rstrip("]") + "]"
    if module in ONE_UNIT and test not in _RANK:
        return module
    return nodeid


def _rank(nodeid: str) -> int:
    unit = unit_of(nodeid)
    return _RANK.get(unit, _RANK.get(unit.split("[")[0], len(SLOWEST)))


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by parametrized fixture
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: every other test keeps its place


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, where it is installed
def pytest_xdist_make_scheduler(config, log):
    """`-n N` (pytest-xdist's default `--dist load`): each unit of unit_of to one worker, in the
    order of the collection (pytest_collection_modifyitems above). Another --dist is left alone."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # the collection's order (pytest-xdist 3.8; earlier
    # versions put the units with the most tests first)
    return Units(config, log)
