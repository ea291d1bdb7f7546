"""Bad input: every one ends in one line on stderr that names the problem and the fix, with exit
status 2 (usage) or 1 (runtime), no traceback, no TensorFlow start-up noise, and the workdir's
files as they were. Most are caught before TensorFlow is imported: those cases run `wide_tf.main`
in this process (the `cli` fixture) with TensorFlow's start replaced by a failure, which proves
that no TensorFlow work was done; a few run it as a subprocess, with a fake `tensorflow` package
first on the path that fails on import, to pin the command's own contract (exit status, one line
on stderr, no traceback)."""

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from wide_tf.checks import loader, validate

SMOKE = "--config=configs/mlp.py:smoke"
SINGLE = "--config=configs/mlp.py:single"

# (id, arguments ({wd}: a workdir holding a study of SMOKE), exit status, words the line must hold)
CASES = [
    ("no_config", ["--workdir={wd}"], 2, ["--config is required"]),
    (
        "config_file_missing",
        ["--config=configs/no_such_file.py", "--workdir={wd}"],
        2,
        ["not found", "configs/mlp.py"],
    ),
    (
        "config_file_misspelt",
        ["--config=configs/mpl.py", "--workdir={wd}"],
        2,
        ["did you mean 'configs/mlp.py'"],
    ),
    ("config_not_python", ["--config=README.md", "--workdir={wd}"], 2, ["not a Python file"]),
    (
        "variant_unknown",
        ["--config=configs/mlp.py:no_such_variant", "--workdir={wd}"],
        2,
        [
            "no variant 'no_such_variant'",
            "local, local7, local12, local_replicate, local_width, local_depth, local_momentum",
        ],
    ),
    (
        "variant_misspelt",
        ["--config=configs/wrn.py:lcoal", "--workdir={wd}"],
        2,
        ["did you mean 'local'"],
    ),
    (
        "field_typo",
        [SMOKE, "--config.optim.learning_rate=-1", "--workdir={wd}"],
        2,
        ["no field 'learning_rate'", "did you mean 'optim.base_lr'", "base_lr"],
    ),
    (
        "field_misspelt",
        [SINGLE, "--config.train.global_bach=3", "--workdir={wd}"],
        2,
        ["global_bach", "did you mean 'global_batch'"],
    ),
    (
        "field_in_wrong_section",
        [SMOKE, "--config.train.base_lr=0.1", "--workdir={wd}"],
        2,
        ["did you mean 'optim.base_lr'"],
    ),
    (
        "section_typo",
        [SMOKE, "--config.optimizer.name=sgd", "--workdir={wd}"],
        2,
        ["did you mean 'optim'"],
    ),
    (
        "value_wrong_type",
        [SINGLE, "--config.train.global_batch=abc", "--workdir={wd}"],
        2,
        ["abc", "takes an integer"],
    ),
    (
        "value_not_a_bool",
        [SINGLE, "--config.train.stop_at_target=maybe", "--workdir={wd}"],
        2,
        ["takes True or False"],
    ),
    (
        "list_entry_out_of_range",
        [SMOKE, "--config.sweep.batch_sizes=(16,0)", "--workdir={wd}"],
        2,
        ["sweep.batch_sizes=0 is out of range", "(a,b,...)"],
    ),
    ("unknown_flag", [SMOKE, "--workdri=x"], 2, ["workdri", "workdir"]),
    ("positional_argument", [SMOKE, "--workdir={wd}", "extra"], 2, ["unexpected arguments"]),
    ("no_workdir", [SMOKE], 2, ["--workdir is required"]),
    (
        "sweep_sets_depth",
        ["--config=configs/wrn.py:smoke", "--config.model.depth=27", "--workdir={wd}"],
        2,
        ["cannot apply", "sweep.family.depths"],
    ),
    (
        "sweep_sets_batch",
        [SMOKE, "--config.train.global_batch=64", "--workdir={wd}"],
        2,
        ["cannot apply", "sweep.batch_sizes"],
    ),
    ("sweep_sets_width", [SMOKE, "--config.model.width=0", "--workdir={wd}"], 2, ["cannot apply"]),
    (
        "data_unknown",
        [SMOKE, "--config.data.name=no_such_dataset", "--workdir={wd}"],
        2,
        ["data.name='no_such_dataset'", "mnist_embedded"],
    ),
    (
        "data_misspelt",
        [SMOKE, "--config.data.name=cifar_10", "--workdir={wd}"],
        2,
        ["did you mean 'cifar10'"],
    ),
    (
        "data_not_prepared",
        [
            SINGLE,
            "--config.data.name=cifar10",
            "--config.data.data_dir={tmp}/none",
            "--workdir={wd}",
        ],
        1,
        ["not prepared", "data_dir", "download=True", "mnist_embedded"],
    ),
    (
        "optimizer_unknown",
        [SMOKE, "--config.optim.name=adamx", "--workdir={wd}"],
        2,
        ["did you mean 'adam'"],
    ),
    (
        "adam_weight_decay",
        [SINGLE, "--config.optim.name=adam", "--config.optim.weight_decay=0.1", "--workdir={wd}"],
        2,
        ["adamw"],
    ),
    (
        "lr_negative",
        [SMOKE, "--config.optim.base_lr=-1", "--workdir={wd}"],
        2,
        ["optim.base_lr=-1.0", "> 0"],
    ),
    ("lr_zero", [SMOKE, "--config.optim.base_lr=0", "--workdir={wd}"], 2, ["optim.base_lr=0.0"]),
    ("lr_nan", [SMOKE, "--config.optim.base_lr=nan", "--workdir={wd}"], 2, ["optim.base_lr=nan"]),
    (
        "lr_multiplier_negative",
        [SINGLE, "--config.optim.lr_multiplier=-2", "--workdir={wd}"],
        2,
        ["optim.lr_multiplier"],
    ),
    (
        "momentum_out_of_range",
        [SINGLE, "--config.optim.momentum=1.5", "--workdir={wd}"],
        2,
        ["< 1"],
    ),
    (
        "lars_epsilon_negative",
        [SINGLE, "--config.optim.lars_epsilon=-1e-9", "--workdir={wd}"],
        2,
        ["optim.lars_epsilon"],
    ),
    (
        "schedule_misspelt",
        [SINGLE, "--config.optim.schedule=cosin", "--workdir={wd}"],
        2,
        ["did you mean 'cosine'"],
    ),
    (
        "width_zero",
        [SINGLE, "--config.model.width=0", "--workdir={wd}"],
        2,
        ["width must be a positive integer"],
    ),
    ("depth_negative", [SINGLE, "--config.model.depth=-1", "--workdir={wd}"], 2, ["depth"]),
    (
        "wrn_depth_not_6n4",
        ["--config=configs/wrn.py:single", "--config.model.depth=27", "--workdir={wd}"],
        2,
        ["6n+4"],
    ),
    (
        "norm_misspelt",
        [SINGLE, "--config.model.norm=gost", "--workdir={wd}"],
        2,
        ["did you mean 'ghost'"],
    ),
    (
        "budget_too_small",
        [SMOKE, "--config.sweep.family.budget=10", "--workdir={wd}"],
        2,
        ["budget"],
    ),
    ("batch_zero", [SINGLE, "--config.train.global_batch=0", "--workdir={wd}"], 2, [">= 1"]),
    (
        "batch_above_training_set",
        [SINGLE, "--config.train.global_batch=5000", "--workdir={wd}"],
        2,
        ["larger than the training set", "4000"],
    ),
    (
        "ghost_does_not_divide",
        [
            "--config=configs/wrn.py:single",
            "--config.train.global_batch=48",
            "--config.model.ghost_batch_size=32",
            "--workdir={wd}",
        ],
        2,
        ["does not divide"],
    ),
    (
        "target_accuracy_above_1",
        [SINGLE, "--config.train.target_value=1.5", "--workdir={wd}"],
        2,
        ["never be met"],
    ),
    (
        "target_loss_zero",
        [
            SINGLE,
            "--config.train.target_metric=train_loss",
            "--config.train.target_value=0",
            "--workdir={wd}",
        ],
        2,
        ["never 0"],
    ),
    (
        "target_metric_misspelt",
        [SMOKE, "--config.train.target_metric=train_acc", "--workdir={wd}"],
        2,
        ["did you mean 'train_accuracy'"],
    ),
    (
        "no_budget",
        [SINGLE, "--config.train.max_epochs=0", "--workdir={wd}"],
        2,
        ["no training budget"],
    ),
    (
        "budget_negative",
        [SINGLE, "--config.train.max_epochs=-3", "--workdir={wd}"],
        2,
        ["train.max_epochs"],
    ),
    ("eps_zero", [SMOKE, "--config.sweep.eps=0", "--workdir={wd}"], 2, ["sweep.eps"]),
    (
        "diverge_loss_negative",
        [SINGLE, "--config.train.diverge_loss=-1", "--workdir={wd}"],
        2,
        ["train.diverge_loss"],
    ),
    ("shard_malformed", [SMOKE, "--shard=a", "--workdir={wd}"], 2, ["i/n"]),
    ("shard_out_of_range", [SMOKE, "--shard=2/2", "--workdir={wd}"], 2, ["0 <= i < n"]),
    (
        "kind_misspelt",
        [SMOKE, "--config.kind=tehory", "--workdir={wd}"],
        2,
        ["did you mean 'theory'"],
    ),
    (
        "theory_draws",
        ["--config=configs/theory.py:smoke", "--config.theory.n_inits=0", "--workdir={wd}"],
        2,
        ["theory.n_inits"],
    ),
    (
        "strategy_misspelt",
        [SMOKE, "--config.runtime.strategy=gpx", "--workdir={wd}"],
        2,
        ["did you mean 'gpu'"],
    ),
    (
        "gpu_absent",
        [SMOKE, "--config.runtime.strategy=gpu", "--workdir={wd}"],
        1,
        ["no GPU", "strategy=cpu"],
    ),
    ("tpu_absent", [SMOKE, "--config.runtime.strategy=tpu", "--workdir={wd}"], 1, ["not a TPU VM"]),
    (
        "multi_worker_without_tf_config",
        [SMOKE, "--config.runtime.strategy=multi_worker", "--workdir={wd}"],
        1,
        ["TF_CONFIG"],
    ),
    (
        "workdir_other_study",
        [SMOKE, "--config.train.max_epochs=5", "--workdir={wd}"],
        2,
        ["different study", "train.max_epochs", "new --workdir"],
    ),
    ("workdir_holds_study_not_run", [SINGLE, "--workdir={wd}"], 2, ["holds a study"]),
    ("workdir_is_a_file", [SMOKE, "--workdir={wd}/config.json"], 2, ["is a file"]),
    ("workdir_under_a_file", [SMOKE, "--workdir={wd}/config.json/sub"], 2, ["is a file"]),
    (
        "workdir_unwritable",
        [SMOKE, "--workdir=/proc/wide_tf_test/wd"],
        1,
        ["cannot write in /proc"],
    ),
    ("workdir_empty_checkpoint", [SMOKE, "--workdir={empty_ckpt}"], 1, ["checkpoint", "truncated"]),
    # The bad input: each one line, before TensorFlow, the workdir untouched.
    ("config_json_null", [SMOKE, "--workdir={null_json}"], 1, ["holds NoneType", "move it aside"]),
    ("config_json_list", [SMOKE, "--workdir={list_json}"], 1, ["holds list", "a JSON object"]),
    ("workdir_s3", [SMOKE, "--workdir=s3://bucket/x"], 2, ["s3:// is not supported", "gs://"]),
    (
        "config_twice",
        [SMOKE, "--config=configs/wrn.py:local", "--workdir={wd}"],
        2,
        ["--config is given 2 times", "give it once"],
    ),
    (
        "budget_huge",
        [SMOKE, "--config.sweep.family.budget=1e30", "--workdir={tmp}/b"],
        2,
        ["1e+30 parameters", "smaller width, depth or budget"],
    ),
    (
        "depth_huge",
        [SINGLE, "--config.model.depth=10000", "--workdir={tmp}/d"],
        2,
        ["depth 10000 is more than the 500 layers", "smaller depth"],
    ),
    (
        "width_huge_dry_run",
        [SINGLE, "--config.model.width=1e9", "--workdir={tmp}/w", "--dry_run"],
        2,
        ["1e+18 parameters", "smaller width"],
    ),
    ("dry_run_workers", [SMOKE, "--workers=abc", "--dry_run"], 2, ["--workers='abc'"]),
    (
        "dry_run_workers_and_trial",
        [SMOKE, "--workers=2", "--trial=0", "--dry_run"],
        2,
        ["drop --workers=2 or --trial"],
    ),
    ("dry_run_trial_index", [SMOKE, "--trial=99", "--dry_run"], 2, ["has 4 trials (0 to 3)"]),
    ("trial_unknown", [SMOKE, "--trial=nosuch", "--workdir={wd}"], 2, ["matches no trial"]),
    (
        "target_bn_misspelt",
        [SINGLE, "--config.train.target_bn=recompue", "--workdir={wd}"],
        2,
        ["train.target_bn='recompue'", "did you mean 'recompute'"],
    ),
    (
        "target_bn_batch_over_its_subset",
        [
            SINGLE,
            "--config.train.target_bn=recompute",
            "--config.train.target_bn_examples=100",
            "--workdir={wd}",
        ],
        2,
        ["train.target_bn_batch=256", "at most 100"],
    ),
    (
        "momentum_warmup_without_momentum",
        [
            SINGLE,
            "--config.optim.name=adam",
            "--config.optim.momentum_warmup_steps=50",
            "--workdir={wd}",
        ],
        2,
        ["optim.momentum_warmup_steps=50", "momentum, nesterov or lars"],
    ),
    # --dry_run --replicas=N: the check launch_tpu.sh runs on the workstation before a VM exists.
    (
        "dry_run_too_many_replicas",
        ["--config=configs/wrn.py", "--dry_run", "--replicas=32"],
        2,
        ["batch of 8 on 32 replicas (--replicas)", "ghost_batch_size=16", "at least 512"],
    ),
    (
        "dry_run_batch_does_not_divide",
        [SMOKE, "--dry_run", "--replicas=3"],
        2,
        ["does not divide over 3 replicas (--replicas)"],
    ),
    ("dry_run_zero_replicas", [SMOKE, "--dry_run", "--replicas=0"], 2, ["--replicas=0"]),
    # Numbers that passed every check and then never ended or crashed after TensorFlow started:
    # each field's bound in schema/fields.py refuses them at --dry_run.
    *[
        (f"runaway_{flag.split('=')[0]}", [cfg, f"--config.{flag}", "--dry_run"], 2, words)
        for cfg, flag, words in (
            (SMOKE, "train.min_steps=" + "1" + "0" * 20, ["train.min_steps=", "<= 1000000000"]),
            (SMOKE, "train.max_epochs=1e308", ["train.max_epochs=1e+308", "<= 1e+06"]),
            (SINGLE, "train.seed=" + "1" + "0" * 20, ["train.seed=", "<= 2147483647"]),
            (SMOKE, "train.steps_per_loop=" + "9" * 15, ["train.steps_per_loop="]),
            (SMOKE, "train.eval_batch=" + "9" * 15, ["train.eval_batch=", "<= 16777216"]),
            (SMOKE, "data.shuffle_buffer=" + "9" * 20, ["data.shuffle_buffer="]),
            (SMOKE, "optim.warmup_epochs=1e300", ["optim.warmup_epochs="]),
        )
    ],
    (
        "replicas_without_dry_run",
        [SMOKE, "--replicas=4", "--workdir={wd}"],
        2,
        ["--replicas is for --dry_run"],
    ),
]


def _env(fake_tf: bool, tmp_path) -> dict:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env["CUDA_VISIBLE_DEVICES"] = ""
    path = [str(REPO)]
    if fake_tf:
        fake = tmp_path / "fake_tf"
        (fake / "tensorflow").mkdir(parents=True, exist_ok=True)
        (fake / "tensorflow" / "__init__.py").write_text(
            "raise ImportError('TensorFlow was imported before validation finished')\n"
        )
        path.insert(0, str(fake))
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    return env


def _main(args, env, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "wide_tf.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _snapshot(folder):
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.stat(p)
            out[os.path.relpath(p, folder)] = (
                st.st_mtime_ns,
                Path(p).read_bytes() if os.path.isfile(p) else None,
            )
    return out


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    config = loader.load_config("configs/mlp.py:smoke")
    wd = tmp / "study"
    (wd / "trials" / "t0").mkdir(parents=True)
    (wd / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
    (wd / "trials" / "t0" / "result.json").write_text(json.dumps({"trial_id": "t0"}))
    broken = tmp / "broken"
    (broken / "trials" / "t1").mkdir(parents=True)
    (broken / "config.json").write_text((wd / "config.json").read_text())
    (broken / "trials" / "t1" / "result.json").write_text('{"trial_id": "t1", "sta')
    empty = tmp / "empty_ckpt"
    (empty / "trials" / "t2" / "checkpoints").mkdir(parents=True)
    (empty / "config.json").write_text((wd / "config.json").read_text())
    (empty / "trials" / "t2" / "checkpoints" / "ckpt-40.index").write_bytes(b"")
    # The CheckpointManager's state file names it: a save that finished, emptied afterwards.
    (empty / "trials" / "t2" / "checkpoints" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-40"\nall_model_checkpoint_paths: "ckpt-40"\n'
    )
    null_json, list_json = tmp / "null_json", tmp / "list_json"
    for folder, text in ((null_json, "null\n"), (list_json, "[]\n")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    return {
        "wd": str(wd),
        "broken": str(broken),
        "empty_ckpt": str(empty),
        "null_json": str(null_json),
        "list_json": str(list_json),
        "tmp": str(tmp),
    }


@pytest.fixture
def cli(monkeypatch, capsys):
    """`python -m wide_tf.main ARGS` in this process: run(args) -> (exit status, stdout, stderr),
    with the flags parsed as the command parses them (`main._parse_flags`). Unless
    `tensorflow=True`, TensorFlow's start (and the workers') fails the test: a case that passes
    was decided before either."""
    from absl import flags

    from wide_tf import main, tf_start
    from wide_tf.engine import preemption
    from wide_tf.study import workers

    monkeypatch.chdir(REPO)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(preemption, "install", lambda: False)  # the test process keeps SIGTERM

    def started(*args, **kwargs):
        raise AssertionError("TensorFlow (or a worker) was started before validation finished")

    def run(args, tensorflow=False):
        if not tensorflow:
            monkeypatch.setattr(tf_start, "import_tensorflow", started)
            monkeypatch.setattr(workers, "start", started)
        argv = ["wide_tf.main", *args]
        monkeypatch.setattr(sys, "argv", argv)
        code = 0
        try:
            main.main(main._parse_flags(argv))
        except SystemExit as e:
            code = e.code
        finally:
            flags.FLAGS.unparse_flags()
            # ml_collections defines a flag per override (--config.a.b) as it parses one; a
            # process parses its flags once, so the next case must not find them defined.
            for flag in [f for f in flags.FLAGS if f.startswith(f"{main._CONFIG.name}.")]:
                delattr(flags.FLAGS, flag)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.mark.parametrize("name,args,code,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_tensorflow(name, args, code, words, workdirs, cli):
    args = [a.format(**workdirs) for a in args]
    before = {k: _snapshot(v) for k, v in workdirs.items() if k != "tmp"}
    status, out, err = cli(args)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert status == code, (status, lines[0])
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert out == ""
    assert {k: _snapshot(v) for k, v in workdirs.items() if k != "tmp"} == before


# A usage error found before absl parses the flags, one of ml_collections' (an override's value),
# one of validate's (the workdir), and a runtime error (exit 1): the command's own contract.
SUBPROCESS_CASES = ["no_config", "value_wrong_type", "workdir_other_study", "data_not_prepared"]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_is_one_line_on_stderr_of_the_command(name, workdirs, tmp_path):
    _, args, code, words = next(c for c in CASES if c[0] == name)
    args = [a.format(**workdirs) for a in args]
    proc = _main(args, _env(fake_tf=True, tmp_path=tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert proc.returncode == code, (proc.returncode, lines[0])
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_every_kind_of_error_after_the_checks_has_its_line_and_status():
    """errors.error_line, the one mapping from an exception to (line, exit status)."""
    from wide_tf import errors
    from wide_tf.study import trials, workers

    config = _config()
    assert errors.error_line(KeyboardInterrupt(), config) == (
        "interrupted; run the same command again to resume where it stopped",
        130,
    )
    assert errors.error_line(trials.StudyError("bad\n  study"), config) == ("bad study", 2)
    assert errors.error_line(validate.UsageError("use x"), config) == ("use x", 2)
    assert errors.error_line(workers.WorkerFailed("worker 0 exited"), config) == (
        "worker 0 exited",
        1,
    )
    line, code = errors.error_line(FileNotFoundError("no /x"), config)
    assert code == 1 and line == (
        "no /x; check the path and its permissions (--workdir, data.data_dir)"
    )
    line, code = errors.error_line(ZeroDivisionError("boom"), config)
    assert code == 1 and line.startswith("ZeroDivisionError: boom (unexpected: run the same")


def test_verbose_shows_the_traceback(tmp_path):
    proc = _main(
        [SMOKE, "--config.optim.name=adamx", "--workdir=x", "--verbose"], _env(True, tmp_path)
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "adamx" in proc.stderr


def test_truncated_checkpoint_is_one_line_and_no_tensorflow_noise(tmp_path):
    """After TensorFlow starts: damaged checkpoints are exit 1 with the path to delete; the C++
    start-up lines (oneDNN, cudart stub, cuInit) stay out, the package's own log lines stay in."""
    wd = tmp_path / "run"
    args = [
        SINGLE,
        "--config.data.name=digits_embedded",
        "--config.train.max_steps=20",
        "--config.train.checkpoint_every_steps=10",
        "--config.train.steps_per_loop=10",
        "--config.runtime.strategy=cpu",
        f"--workdir={wd}",
    ]
    env = _env(fake_tf=False, tmp_path=tmp_path)
    first = _main(args, env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    for noise in ("port.cc", "cudart_stub", "cuInit", "absl::InitializeLog", "cpu_feature_guard"):
        assert noise not in first.stderr, noise
    assert "train.py" in first.stderr  # absl logging of the package itself still shows
    (wd / "result.json").unlink()  # as if the run had been killed after its last checkpoint
    # Every checkpoint cut short (with an older one whole, the run resumes from it instead:
    # tests/engine/test_checkpoint_fallback.py).
    for data in (wd / "checkpoints").glob("ckpt-*.data-*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    before = _snapshot(wd)
    proc = _main(args, env, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("error: checkpoint "), proc.stderr[-3000:]
    assert "damaged" in last and str(wd / "checkpoints") in last and "Traceback" not in proc.stderr
    assert _snapshot(wd) == before


# ------------------------------------------------------------------------------------------------
# In-process checks of validate.py (no subprocess needed)


def _config(spec="configs/mlp.py:single"):
    return loader.load_config(spec)


def test_batch_must_divide_over_cpu_replicas():
    config = _config()
    config.runtime.strategy, config.runtime.devices = "cpu", ["/cpu:0", "/cpu:1"]
    config.train.global_batch = 63
    with pytest.raises(validate.UsageError, match="does not divide over 2 replicas"):
        validate.check_config(config)
    config.train.global_batch = 64
    validate.check_config(config)
    config.runtime.strategy = "auto"
    with pytest.raises(validate.UsageError, match="strategy=cpu"):
        validate.check_config(config)


def test_sweep_lists_are_checked():
    for field, value, words in [
        ("batch_sizes", [32, 0], ">= 1"),
        ("batch_sizes", [32, 99999], "larger than the training set"),
        ("lr_multipliers", [1.0, float("nan")], "sweep.lr_multipliers"),
        ("lr_multipliers", [0.0], "0 or negative"),
        ("seeds", [0, 0], "repeats"),
    ]:
        config = _config("configs/mlp.py:smoke")
        setattr(config.sweep, field, value)
        with pytest.raises(validate.UsageError, match=words):
            validate.check_config(config)
    config = _config("configs/wrn.py:smoke")
    config.sweep.family.depths = [10, 27]
    with pytest.raises(validate.UsageError, match="6n\\+4"):
        validate.check_config(config)


def test_a_config_has_exactly_the_fields_of_defaults():
    """A config file written by hand that lacks a field, or holds one the code never reads, is
    one line naming it (the code reads every field with no fallback: defaults.py has them all)."""
    config = _config("configs/mlp.py:smoke")
    validate.check_config(config)
    del config.optim["momentum"]
    with pytest.raises(validate.UsageError, match="optim.momentum is missing.*base_config"):
        validate.check_config(config)
    config = _config("configs/mlp.py:smoke")
    config.train.max_epoch = 3  # a typo in a config file (overrides are checked separately)
    with pytest.raises(
        validate.UsageError, match="train.max_epoch is not a config field.*max_epochs"
    ):
        validate.check_config(config)
    config = _config("configs/mlp.py:smoke")
    config.sweep.family.budgte = 1.0
    with pytest.raises(validate.UsageError, match="sweep.family.budgte.*budget"):
        validate.check_config(config)
    config = _config("configs/mlp.py:smoke")
    del config["runtime"]
    with pytest.raises(validate.UsageError, match="no runtime section"):
        validate.check_config(config)
    validate.check_config(_config("configs/mlp.py:single"))  # sweep None: one run


def test_a_batch_smaller_than_the_ghost_size_is_refused_before_tensorflow():
    config = _config("configs/wrn.py:single")
    config.model.norm, config.model.ghost_batch_size = "ghost", 32
    config.train.global_batch = 64
    validate.check_config(config)
    config.train.global_batch = 16  # would need a virtual batch of 16: never shrunk
    with pytest.raises(validate.UsageError, match="ghost_batch_size=32, which does not divide"):
        validate.check_config(config)


def test_new_fields_confirm_seeds_and_min_steps_are_checked_when_present():
    config = _config("configs/mlp.py:smoke")
    config.sweep.confirm_seeds = [1, 2]
    config.train.min_steps = 0
    validate.check_config(config)
    config.sweep.confirm_seeds = [1, -2]
    with pytest.raises(validate.UsageError, match="sweep.confirm_seeds"):
        validate.check_config(config)
    config.sweep.confirm_seeds = []
    config.train.max_steps, config.train.min_steps = 10, 20
    with pytest.raises(validate.UsageError, match="min_steps"):
        validate.check_config(config)


def test_a_torn_result_file_is_a_warning_and_nothing_changes(tmp_path):
    config = _config("configs/mlp.py:smoke")
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "b.json").write_text('{"trial_id": "b", "st')
    before = _snapshot(tmp_path)
    warnings = validate.check_workdir(config, str(tmp_path))
    assert len(warnings) == 1 and "b.json" in warnings[0] and "runs" in warnings[0]
    assert _snapshot(tmp_path) == before


def test_batches_above_a_quarter_of_the_data_are_a_warning():
    config = _config("configs/mlp.py:smoke")
    assert validate.design_warnings(config) == []  # 256 of 1,438 digits: below n / 4
    config.sweep.batch_sizes = [32, 1024]
    (w,) = validate.design_warnings(config)
    assert "1024, 71% of the 1438" in w and "(n - B) / (n - 1) = 0.29" in w and "n / 8" in w
    for spec in ("configs/mlp.py:local", "configs/wrn.py:local"):  # the shipped designs: none
        assert validate.design_warnings(_config(spec)) == []


def test_unwritable_workdir(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere; the 'is a file' cases cover the path through main")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(validate.RuntimeProblem, match="cannot write"):
            validate.check_workdir(_config("configs/mlp.py:smoke"), str(ro / "wd"))
    finally:
        ro.chmod(0o700)


def test_the_engine_reads_the_spec_registries():
    """The names and data sets have one home, the schema (which validate.py reads): the TensorFlow
    modules hold those objects, not copies (the registries themselves:
    tests/schema/test_registries.py); and the study's identity is the one the workdir check uses."""
    from wide_tf.engine import optim
    from wide_tf.engine.tf import data, strategy
    from wide_tf.schema import datasets, fields, optimizers

    assert tuple(optim.OPTIMIZERS) == optimizers.NAMES
    assert strategy.STRATEGIES is fields.STRATEGIES
    assert data.DATASETS is datasets.DATASETS


def test_every_shipped_config_passes(tmp_path):
    for spec in [
        "configs/mlp.py:local",
        "configs/mlp.py:single",
        "configs/mlp.py:smoke",
        "configs/wrn.py:local",
        "configs/wrn.py:single",
        "configs/wrn.py:smoke",
        "configs/theory.py",
        "configs/theory.py:smoke",
    ]:
        validate.check_config(_config(spec))
    for spec, name in [("configs/mlp.py:paper", "mnist"), ("configs/wrn.py", "cifar10")]:
        # TFDS data: a folder that looks prepared to the check (which opens no file and never
        # downloads), so that every other check of these configs runs.
        info = tmp_path / name / "3.0.0" / "dataset_info.json"
        info.parent.mkdir(parents=True)
        info.write_text("{}")
        config = _config(spec)
        config.data.data_dir = str(tmp_path)
        validate.check_config(config)


def test_errors_found_after_tensorflow_starts_are_one_line_too(tmp_path, cli):
    """--trial that matches no trial (now found before TensorFlow starts): one line,
    exit 2, nothing written."""
    wd = tmp_path / "study"
    status, _, err = cli([SMOKE, "--trial=no_such_trial", f"--workdir={wd}"], tensorflow=True)
    assert status == 2, err[-3000:]
    assert err.strip().splitlines() == [
        "error: --trial='no_such_trial' matches no trial of this study; --list_trials shows "
        "them (give an index or an id)"
    ]
    assert not wd.exists()


def test_a_named_tpu_that_cannot_be_reached_is_one_line(tmp_path):
    proc = _main(
        [
            SINGLE,
            "--config.runtime.strategy=tpu",
            "--config.runtime.tpu=no-such-tpu",
            f"--workdir={tmp_path / 'run'}",
        ],
        _env(False, tmp_path),
        timeout=300,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("error: cannot reach the TPU"), proc.stderr[
        -3000:
    ]
    assert "--config.runtime.tpu" in last and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "entries,words",
    [
        (
            ["train_accuracy"],
            ["train.extra_targets[0]='train_accuracy' is not a target", "metric:value"],
        ),
        (
            ["train_loss:0.1", "test_acuracy:0.9"],
            ["train.extra_targets[1]", "did you mean 'test_accuracy'"],
        ),
        (["train_accuracy:1.5"], ["train.extra_targets[0]=1.5", "an accuracy above 1"]),
        (["train_accuracy:0"], ["train.extra_targets[0]=0.0", "> 0"]),
        (["train_loss:-1"], ["train.extra_targets[0]=-1.0", "never 0 or below"]),
        (["train_loss:abc"], ["train.extra_targets[0]='train_loss:abc'", "no number"]),
    ],
)
def test_extra_targets_are_checked(entries, words):
    config = _config()
    config.train.extra_targets = entries
    with pytest.raises(validate.UsageError) as bad:
        validate.check_config(config)
    line = str(bad.value)
    assert "\n" not in line and "; " in line and bad.value.exit_code == 2
    for w in words:
        assert w in line, (w, line)
    config.train.extra_targets = ["train_loss:0.1", "test_accuracy:0.9", " train_accuracy : 1 "]
    validate.check_config(config)


def test_a_malformed_extra_target_in_a_config_file_is_one_line_exit_2(tmp_path, cli):
    path = tmp_path / "targets.py"
    path.write_text(
        "from wide_tf.schema import defaults\n"
        "def get_config(arg=None):\n"
        "    c = defaults.base_config('mlp', 'digits_embedded')\n"
        "    c.sweep = None\n"
        "    c.train.extra_targets = ['train_loss:0.1', 'train_accuracy']\n"
        "    return c\n"
    )
    status, _, err = cli([f"--config={path}", f"--workdir={tmp_path / 'wd'}"])
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: train.extra_targets[1]='train_accuracy'"), lines[0]
    assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize("replicas", [1, 4, 8, 16])
def test_the_paper_wrn_config_fits_every_listed_slice(replicas, tmp_path, cli):
    """configs/wrn.py on 1 to 16 replicas (v4-8: 4; v2-8, v3-8, v4-16, v5litepod-8, v6e-8: 8;
    v4-32: 16), checked without TensorFlow and without the data (it is on the target)."""
    status, out, err = cli(
        ["--config=configs/wrn.py", "--dry_run", f"--replicas={replicas}", "--shard=1/4"]
    )
    assert status == 0, err
    assert out.startswith(f"dry run: the config fits {replicas} replica(s): batches [256,")
    assert "ghost batch 16" in out and not list(tmp_path.glob("*/config.json"))


def test_the_workdir_checks_never_advise_deleting_resumable_work(workdirs):
    """A trial's result.json that is not JSON is a warning saying what the study does (moves it
    aside, runs the trial again); an empty checkpoint file is refused with advice that keeps
    the files (restore, or move the folder aside), never 'delete'."""
    config = loader.load_config("configs/mlp.py:smoke")
    warnings = validate.check_workdir(config, workdirs["broken"])
    assert any(
        "result.json is not a whole result" in w and "the study moves it aside" in w
        for w in warnings
    ), warnings
    with pytest.raises(validate.RuntimeProblem) as e:
        validate.check_workdir(config, workdirs["empty_ckpt"])
    assert "restore the file, or move" in str(e.value) and "delete" not in str(e.value)
    assert all("delete" not in w for w in warnings)
    # Without the state file naming it, the empty file is a save cut short (a kill mid-write):
    # the run sets it aside and starts afresh, so the check warns instead of refusing.
    unfinished = os.path.join(workdirs["tmp"], "unfinished_ckpt")
    shutil.copytree(workdirs["empty_ckpt"], unfinished)
    os.remove(os.path.join(unfinished, "trials", "t2", "checkpoints", "checkpoint"))
    warnings = validate.check_workdir(config, unfinished)
    assert any("left by a save that never finished" in w for w in warnings), warnings


def test_a_dangling_symlink_and_an_over_long_workdir_are_named_before_any_folder(tmp_path, cli):
    """A dangling symlink as --workdir was blamed on "something removed it" after
    TensorFlow started, and an over-long --workdir passed the checks and failed after creating
    folders."""
    link = tmp_path / "link"
    os.symlink(tmp_path / "gone", link)
    too_long_name = tmp_path / "a" / ("x" * 300)
    too_deep = tmp_path / "b" / "/".join(["y" * 200] * 20)
    for workdir, words in (
        (link, ["is a symbolic link to", "gone, which does not exist"]),
        (too_long_name, ["a folder name of 300 bytes is longer than the 255"]),
        (too_deep, ["leaves no room under this file system's 4096"]),
    ):
        code, out, err = cli([SMOKE, f"--workdir={workdir}"])
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
        assert all(w in lines[0] for w in words), lines[0]
    assert sorted(os.listdir(tmp_path)) == ["link"]  # nothing created


# Exceptions that are signals between the package's own parts, never shown as an error line:
# SIGTERM's checkpoint-and-exit (exit 143, main; a worker's between trials), a group taken
# over by another worker, and a cohort's run ended where it waits because another run raised
# (engine/cohort.py: the other run's exception is the one raised).
# Exceptions that are not errors: signals that end a run on purpose, the launcher's outcomes
# (it answers in its own lines), and the unreadable-file case, an OSError its readers catch.
SIGNALS = {
    "wide_tf/engine/preemption.py:Preempted",
    "wide_tf/study/scheduler.py:WorkerStopped",
    "wide_tf/store/claims.py:LostClaim",
    "wide_tf/launch/command.py:Terminated",
    "wide_tf/launch/options.py:Stop",
    "wide_tf/store/workdir.py:NotARegularFile",
    "wide_tf/engine/cohort.py:_Abandoned",
}
_BASES = {"Problem", "UsageError", "RuntimeProblem"}


def exceptions_without_a_base(root: Path) -> list[str]:
    """'path:class' of every exception class under root/wide_tf whose bases, followed through
    the package's own classes, never reach schema/problems.py's Problem (read with `ast`)."""
    bases = {}
    for path in sorted((root / "wide_tf").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                names = [
                    b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                    for b in node.bases
                ]
                bases[(path.relative_to(root).as_posix(), node.name)] = names
    by_name = {name: b for (_, name), b in bases.items()}

    def reaches(names, seen=()) -> bool | None:
        """True: a base reaches Problem; False: an exception that does not; None: not one."""
        out = None
        for n in names:
            if n in _BASES:
                return True
            if n in by_name and n not in seen:
                got = reaches(by_name[n], (*seen, n))
                out = got if got is not None else out
            elif n.endswith(("Error", "Exception")) or n in ("Exception", "BaseException"):
                out = False if out is None else out
        return out

    return sorted(
        f"{p}:{name}"
        for (p, name), b in bases.items()
        if name not in _BASES and reaches(b) is False
    )


def test_every_error_of_the_package_subclasses_a_usage_or_runtime_base():
    assert set(exceptions_without_a_base(REPO)) == SIGNALS


def test_an_error_on_a_builtin_base_is_caught(tmp_path):
    (tmp_path / "wide_tf" / "engine").mkdir(parents=True)
    (tmp_path / "wide_tf" / "engine" / "x.py").write_text(
        "class Fine(RuntimeProblem):\n    pass\n\n\nclass Bad(ValueError):\n    pass\n\n\n"
        "class AlsoBad(Bad):\n    pass\n\n\nclass NotAnError:\n    pass\n"
    )
    assert exceptions_without_a_base(tmp_path) == [
        "wide_tf/engine/x.py:AlsoBad",
        "wide_tf/engine/x.py:Bad",
    ]
