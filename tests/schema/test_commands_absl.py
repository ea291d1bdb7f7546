"""The secondary commands take absl flags as wide_tf.main does (schema/cli.py): --name=value or
--name value, --[no]name, --flagfile; --help written for users; a flag given twice, an unknown
flag or a stray argument is one `error:` line and exit status 2 before anything runs; and their
flags live in a FlagValues of their own, so importing them beside wide_tf.main (the configs import
predict_study, the workers families) defines nothing twice."""

import subprocess
import sys

import pytest
from helpers import REPO, env

from wide_tf.analysis import calibration, frozen, predict_study, rule_power, simulate
from wide_tf.report import __main__ as report
from wide_tf.report import agreement, claims_table
from wide_tf.schema import families
from wide_tf.tools import options_table

# Each command, one of its flags given twice, and what its --help must name.
COMMANDS = {
    "families": (families.main, ["--arch=mlp", "--depths=1", "--budget=1e5", "--budget=2e5"]),
    "simulate": (simulate.main, ["--studies=3", "--studies=4"]),
    "predict_study": (predict_study.main, ["--config=configs/mlp.py:local", "--config=x"]),
    "report": (report.main, ["--workdir=a", "--eps=1", "--workdir=b"]),
    "claims": (claims_table.main, ["--out=a.md", "--out=b.md", "runs/x"]),
    "agreement": (agreement.main, ["--workdir=a", "--workdir", "b"]),
    "calibration": (calibration.main, ["--studies=3", "runs/x", "--studies=4"]),
    "rule_power": (rule_power.main, ["--b_crit_ref=20", "--s_min=40", "--seed=1", "--seed=2"]),
    "frozen": (frozen.main, ["--b_crit_ref=20", "--s_min=40", "--out=a", "--out=b"]),
    "options_table": (options_table.main, ["--check", "--nocheck"]),
}


def _one_error_line(capsys, run, argv) -> str:
    rc = run(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, (argv, rc, out, err)
    assert lines[0].startswith("error: ") and "; " in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_flag_given_twice_is_refused_naming_both_values(name, capsys):
    run, argv = COMMANDS[name]
    line = _one_error_line(capsys, run, argv)
    assert "is given 2 times (" in line and line.endswith("give it once"), line


@pytest.mark.parametrize("name", COMMANDS)
def test_help_is_for_users_and_lists_every_flag(name, capsys):
    run, _ = COMMANDS[name]
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    assert not out.startswith("Owns") and "python -m wide_tf." in out, out[:200]
    lines = out.split("\nFlags (--name=value", 1)[1].splitlines()
    for line, under in zip(lines, lines[1:] + [""]):
        if line.startswith("  --"):  # each flag says what it does on the line under it
            assert under.startswith("      ") and under.strip(), line
    assert run(["-h"]) == 0 and capsys.readouterr().out == out


@pytest.mark.parametrize(
    "argv,piece",
    [
        (["--studies=2", "stray"], "unexpected argument 'stray'; this command takes flags only"),
        (["--studys=2"], "unknown flag --studys; did you mean --studies?"),
        (["--seed"], "--seed: missing its value; give it as --seed=VALUE"),
        (["--heaviest_level=0.2"], "--heaviest_level: '0.2' is out of range"),
    ],
)
def test_bad_flags_are_named(capsys, argv, piece):
    assert piece in _one_error_line(capsys, simulate.main, argv)


def test_absl_forms_a_space_a_negated_switch_and_a_flagfile(tmp_path, capsys):
    fam = ["--arch", "mlp", "--depths", "1,2", "--input_shape", "28,28,1"]
    assert families.main([*fam, "--budget", "1e5"]) == 0
    table = capsys.readouterr().out
    (tmp_path / "flags.txt").write_text("--arch=mlp\n--depths=1,2\n--input_shape=28,28,1\n")
    assert families.main([f"--flagfile={tmp_path / 'flags.txt'}", "--budget=1e5"]) == 0
    assert capsys.readouterr().out == table
    assert options_table.main(["--nocheck", "--help"]) == 0  # --[no]check: a switch
    assert "--[no]check" in capsys.readouterr().out


def test_each_call_starts_from_the_defaults(capsys):
    """One FlagValues serves every call in a process: a value given once does not stay."""
    argv = ["--arch=mlp", "--depths=1", "--input_shape=28,28,1", "--budget=1e4"]
    assert families.main([*argv, "--norm=none"]) == 0
    assert families.main(argv) == 0
    assert families._FLAGS.norm == "batch"
    capsys.readouterr()


def test_the_commands_define_nothing_in_absl_global_flags():
    """wide_tf.main's flags, a config (which imports predict_study) and every command module in
    one process: no DuplicateFlagError, and absl's global FLAGS holds main's flags alone."""
    code = (
        "from absl import flags\n"
        "import wide_tf.main\n"
        "from wide_tf.checks import loader\n"
        "before = set(flags.FLAGS)\n"
        "loader.load_config('configs/mlp.py:local')\n"
        "import wide_tf.analysis.simulate, wide_tf.analysis.predict_study\n"
        "import wide_tf.analysis.calibration, wide_tf.analysis.rule_power\n"
        "import wide_tf.report.__main__, wide_tf.report.agreement, wide_tf.report.claims_table\n"
        "import wide_tf.schema.families, wide_tf.tools.options_table\n"
        "wide_tf.analysis.frozen._flags()\n"
        "assert set(flags.FLAGS) == before, sorted(set(flags.FLAGS) - before)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-2000:]


def test_python_dash_m_runs_the_command_under_absl(tmp_path):
    """The real entry (`python -m`, absl's app.run): the exit status and the one line."""
    cmd = [sys.executable, "-m", "wide_tf.analysis.predict_study"]
    p = subprocess.run(
        [*cmd, "--config=configs/mlp.py:local", "--config=configs/mlp.py:smoke"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "error: --config is given 2 times (configs/mlp.py:local, configs/mlp.py:smoke); give it "
        "once"
    ]
    p = subprocess.run(
        [*cmd, "--config", "configs/mlp.py:local"], cwd=REPO, env=env(), capture_output=True
    )
    assert p.returncode == 0 and b"its predict study" in p.stdout, p.stderr[-2000:]


def test_the_freeze_takes_its_replicate_as_config_comma_out(capsys):
    """--replicate=CONFIG,OUT (absl has no two-value flag): split at the last comma, since a
    config's variant arguments may hold commas."""
    assert frozen._replicate("configs/mlp.py:local:seeds=3,lr=2,out/r.json") == (
        "configs/mlp.py:local:seeds=3,lr=2",
        "out/r.json",
    )
    argv = ["--b_crit_ref=20", "--s_min=40", "--out=a.json", "--replicate=configs/mlp.py:smoke"]
    assert "--replicate: expected CONFIG,OUT" in _one_error_line(capsys, frozen.main, argv)
