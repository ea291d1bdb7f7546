"""Bad input on the command lines of the families table and the study simulator: each is one line
`error: <problem>; <fix>` on stderr, exit status 2, nothing printed on stdout."""

import pytest

from wide_tf.analysis import simulate
from wide_tf.schema import families

FAMILY = ["--arch=mlp", "--depths=1,2", "--input_shape=28,28,1"]
# (flags, a piece of the one line)
FAMILY_BAD = [
    (["--budget=1e6", "--tolerance=nan"], "--tolerance: 'nan' is out of range"),
    (["--budget=1e6", "--tolerance=-1"], "--tolerance: '-1' is out of range"),
    (["--budget=1e300"], "--budget: '1e300' is out of range"),
    (["--budget=nan"], "--budget: 'nan' is out of range"),
    (["--budget=-5"], "--budget: '-5' is out of range"),
    (["--budget=abc"], "--budget: expected a number"),
    (["--width=nan"], "--width: 'nan' is out of range"),
    (["--width=1e300"], "--width: '1e300' is out of range"),
    (["--widths=nan", "--depths=4"], "--widths: expected comma-separated finite numbers > 0"),
    (["--widths=,", "--depths=4"], "--widths: expected at least one number"),
    (["--widths=1e11", "--depths=4"], "parameters is above the 1e+12"),
    (["--width=64", "--depths=,"], "--depths: expected at least one integer"),
    (["--budget=1e6", "--num_classes=abc"], "--num_classes: expected an integer >= 1"),
    (["--budget=1e6", "--num_classes=0"], "--num_classes: '0' is out of range"),
    (["--budget=1e6", "--input_shape=0,0,0"], "--input_shape: expected comma-separated integers"),
    (["--budget=1e6", "stray"], "unexpected argument 'stray'; this command takes flags only"),
    (["--budget=1e6", "--tol=0.1"], "unknown flag --tol; did you mean --tolerance?"),
    (["--budget"], "--budget: missing its value; give it as --budget=VALUE"),
    ([], "exactly one of --budget, --width, --widths"),
]
SIMULATE_BAD = [
    (["--alpha=nan"], "--alpha: 'nan' is out of range: use a finite number"),
    (["--alpha=inf"], "--alpha: 'inf' is out of range"),
    (["--noise=nan"], "--noise: 'nan' is out of range: use a finite number >= 0"),
    (["--noise=-1"], "--noise: '-1' is out of range"),
    (["--generators=,"], "--generators=,: names no generator; use some of fitted"),
    (["--generators=fitted,no_such"], "unknown no_such"),
    (["--studies=0"], "--studies must be >= 1"),
    (["--bootstrap=5"], "--bootstrap >= 20"),
    (["--seed=-1"], "--seed: '-1' is out of range: use an integer >= 0"),
    (["--seed=1.5"], "--seed: expected an integer >= 0"),
    (["stray"], "unexpected argument 'stray'"),
    (["--alph=1"], "unknown flag --alph; did you mean --alpha?"),
    # Tracebacks (or unbounded runs) before.
    (["--noise=1e308"], "--noise: '1e308' is out of range: use a finite number >= 0 and <= 5"),
    (["--bootstrap=100000000000"], "each at most 100000"),
    (["--studies=100000000000"], "each at most 100000"),
    (["--batches=0"], "--batches: '0': use at least two distinct batch sizes"),
    (["--batches=32"], "--batches: '32': use at least two distinct batch sizes"),
    (["--batches=a,b"], "--batches: expected comma-separated integers"),
    (["--extra_seeds=-1"], "--extra_seeds: '-1' is out of range: use an integer >= 0 and <= 1000"),
    (["--extra_seeds=100000000"], "--extra_seeds: '100000000' is out of range"),
    (["--replicates=100000000"], "--replicates: '100000000' is out of range"),
]


def _one_line(capsys, run, argv) -> str:
    try:
        rc = run(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (argv, rc, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "; " in lines[0], err
    return lines[0]


@pytest.mark.parametrize("argv,piece", FAMILY_BAD, ids=[" ".join(a) for a, _ in FAMILY_BAD])
def test_families_bad_input_is_one_line(capsys, argv, piece):
    given = {a.split("=")[0] for a in argv}  # a flag is given once: argv's replaces FAMILY's
    base = [f for f in FAMILY if f.split("=")[0] not in given]
    assert piece in _one_line(capsys, families.main, base + argv)


@pytest.mark.parametrize("argv,piece", SIMULATE_BAD, ids=[" ".join(a) for a, _ in SIMULATE_BAD])
def test_simulate_bad_input_is_one_line(capsys, argv, piece):
    assert piece in _one_line(capsys, simulate.main, argv)


def test_families_good_input_still_prints_the_table(capsys):
    assert families.main(FAMILY + ["--budget=1e6", "--tolerance=0.05"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["name", "depth", "width", "params", "rel_error"]
