"""Tests for wide_tf.schema.families: closed-form counts, the budget solver, sweeps, names and the
CLI."""

import io
import json
import math
import subprocess
import sys
import time
from contextlib import redirect_stdout

import pytest

from wide_tf.schema import architectures as A
from wide_tf.schema import families as F


def _wrn_count_by_hand(depth, k):
    """Independent count of WRN-depth-k on CIFAR-10, written from the WRN paper's Table 1 layout."""
    n = (depth - 4) // 6
    c1, c2, c3 = 16 * k, 32 * k, 64 * k  # integer k only
    bn = lambda c: 2 * c  # noqa: E731
    conv = lambda i, o, s=3: s * s * i * o  # noqa: E731
    total = conv(3, 16)
    for i, o in ((16, c1), (c1, c2), (c2, c3)):
        first = (
            bn(i) + conv(i, o) + bn(o) + conv(o, o) + (conv(i, o, 1) if (i != o or o != c1) else 0)
        )
        total += first + (n - 1) * (bn(o) + conv(o, o) + bn(o) + conv(o, o))
    return total + bn(c3) + 10 * c3 + 10


def test_does_not_import_tensorflow():
    code = (
        "import sys, wide_tf.schema.families, wide_tf.checks.validate; "
        "assert 'tensorflow' not in sys.modules, 'tf imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mlp_counts_by_hand():
    # The spec's example: mlp-d2-w512 on MNIST has 669,706 parameters.
    assert (
        F.param_count("mlp", 2, 512, 10, (28, 28, 1), norm="none")
        == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
        == 669706
    )
    # With norm the hidden bias is replaced by gamma and beta (one more parameter per unit).
    assert F.param_count("mlp", 2, 512, 10, (28, 28, 1), norm="batch") == 669706 + 2 * 512
    assert F.param_count("mlp", 2, 512, 10, (28, 28, 1), norm="ghost") == 669706 + 2 * 512
    assert F.param_count("mlp", 0, 999, 10, (8, 8, 1), norm="batch") == 64 * 10 + 10


@pytest.mark.parametrize("depth,k", [(16, 1), (16, 8), (28, 10), (40, 4), (10, 2)])
def test_wrn_counts_by_hand(depth, k):
    assert F.param_count("wrn", depth, k, 10, (32, 32, 3)) == _wrn_count_by_hand(depth, k)


def test_wrn_count_without_norm_drops_exactly_the_bn_parameters():
    with_bn = F.param_count("wrn", 16, 2, 10, (32, 32, 3), norm="batch")
    without = F.param_count("wrn", 16, 2, 10, (32, 32, 3), norm="none")
    # BN layers: per block 2 (pre + mid), 3 groups x 2 blocks, plus final; 2 params per channel.
    bn_channels = (16 + 32) + (32 + 32) + (32 + 64) + (64 + 64) + (64 + 128) + (128 + 128) + 128
    assert with_bn - without == 2 * bn_channels


def test_wrn_channels_rounding():
    assert A.WRN_SPEC.channels(1) == (16, 32, 64)
    assert A.WRN_SPEC.channels(2.5) == (40, 80, 160)
    assert A.WRN_SPEC.channels(1 / 32) == (1, 1, 2)  # half-up, not banker's rounding
    assert A.WRN_SPEC.channels(0.53) == (8, 17, 34)  # 8.48, 16.96, 33.92
    with pytest.raises(ValueError, match="k >= 1/32"):
        A.WRN_SPEC.channels(0.02)
    with pytest.raises(ValueError, match="positive"):
        A.WRN_SPEC.channels(-1)


@pytest.mark.parametrize("depth", [4, 11, 0, 12.0])
def test_wrn_bad_depth(depth):
    with pytest.raises(ValueError, match="6n\\+4"):
        F.param_count("wrn", depth, 1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="arch"):
        F.param_count("cnn", 2, 2)
    with pytest.raises(ValueError, match="norm"):
        F.param_count("mlp", 2, 2, norm="layer")
    with pytest.raises(ValueError, match="width"):
        F.param_count("mlp", 2, 2.5)
    with pytest.raises(ValueError, match="input_shape"):
        F.param_count("wrn", 10, 1, input_shape=(32, 32))


@pytest.mark.parametrize(
    "arch,budget,depths,shape,norm",
    [
        ("wrn", 1.5e6, [10, 16, 22, 28, 40], (32, 32, 3), "batch"),
        ("wrn", 2e5, [10, 16, 22], (28, 28, 1), "ghost"),
        ("wrn", 3.65e7, [10, 28], (32, 32, 3), "none"),
        ("mlp", 1e6, [1, 2, 4, 8], (28, 28, 1), "none"),
        ("mlp", 5e4, [1, 2, 3, 6], (8, 8, 1), "batch"),
    ],
)
def test_family_is_closest_and_within_tolerance(arch, budget, depths, shape, norm):
    t0 = time.perf_counter()
    members = F.family(arch, budget, depths, num_classes=10, input_shape=shape, norm=norm)
    assert (time.perf_counter() - t0) / len(depths) < 0.05  # < 50 ms per member
    assert [m.depth for m in members] == depths
    step = 1 if arch == "mlp" else 0.01
    for m in members:
        assert m.params == F.param_count(arch, m.depth, m.width, 10, shape, norm)
        assert m.rel_error == pytest.approx((m.params - budget) / budget)
        assert abs(m.rel_error) <= 0.05
        # Brute force over neighbouring grid widths: none is closer to the budget.
        for w in [m.width + i * step for i in range(-30, 31) if m.width + i * step >= step * 4]:
            w = int(w) if arch == "mlp" else round(w, 2)
            assert abs(F.param_count(arch, m.depth, w, 10, shape, norm) - budget) >= abs(
                m.params - budget
            )
    if (
        arch == "wrn" and budget >= 1e6
    ):  # the solver's fine grid gets far closer than the 5% tolerance
        assert all(abs(m.rel_error) < 0.01 for m in members)
    widths = [m.width for m in members]
    assert widths == sorted(widths, reverse=True)  # deeper members are narrower


def test_family_errors_name_member_and_fix():
    with pytest.raises(F.FamilyError, match=r"wrn-100-0\.04.*smaller depth or a larger budget"):
        F.family("wrn", 3e3, [100])
    # Tiny networks: one more channel per group moves the count by more than the tolerance.
    with pytest.raises(F.FamilyError, match=r"wrn-100-0\.11: .*jumps over the budget"):
        F.family("wrn", 2e4, [10, 100])
    with pytest.raises(F.FamilyError, match=r"mlp depth 0.*drop depth 0"):
        F.family("mlp", 1e5, [0, 1], input_shape=(28, 28, 1))
    with pytest.raises(F.FamilyError, match=r"wrn depth 12.*6n\+4"):
        F.family("wrn", 1e6, [10, 12])
    with pytest.raises(F.FamilyError, match="budget"):
        F.family("wrn", -5, [10])
    with pytest.raises(F.FamilyError, match="depths is empty"):
        F.family("wrn", 1e6, [])
    with pytest.raises(F.FamilyError, match="tolerance"):
        # An MLP with 8 hidden layers of width 1 on 784 inputs already has ~800 params.
        F.family("mlp", 500, [8], input_shape=(28, 28, 1), norm="none")


def test_sweeps():
    ws = F.width_sweep("wrn", 16, [1, 2.5, 8])
    assert [m.name for m in ws] == ["wrn-16-1.00", "wrn-16-2.50", "wrn-16-8.00"]
    assert [m.params for m in ws] == [F.param_count("wrn", 16, w) for w in (1, 2.5, 8)]
    assert all(m.budget is None and m.rel_error is None for m in ws)
    ds = F.depth_sweep("mlp", 64, [0, 1, 3], input_shape=(8, 8, 1), norm="none")
    assert [m.name for m in ds] == ["mlp-d0-w64", "mlp-d1-w64", "mlp-d3-w64"]
    assert [m.params for m in ds] == [650, 64 * 64 + 64 + 650, 64 * 64 + 64 + 2 * 4160 + 650]
    with pytest.raises(F.FamilyError, match="depth 0"):
        F.width_sweep("mlp", 0, [1, 2])


def test_member_names_and_json():
    m = F.family("wrn", 1.5e6, [16])[0]
    d = json.loads(json.dumps(m.to_dict()))
    assert d["name"] == m.name == f"wrn-16-{m.width:.2f}"
    assert d["channels"] == list(A.WRN_SPEC.channels(m.width))
    assert F.Member(**{k: v for k, v in d.items() if k not in ("name", "channels")}) == m
    # A two-decimal name rebuilds exactly the same network.
    assert A.WRN_SPEC.channels(float(m.name.split("-")[-1])) == m.channels
    assert F.Member("mlp", 2, 512, 669706).name == "mlp-d2-w512"
    assert F.Member("mlp", 2, 512, 669706).channels is None
    assert F.Member("wrn", 16, 2.555, 1).name == "wrn-16-2.555"  # off the grid: not rounded away


def test_k_grid_is_never_on_a_rounding_tie():
    for j in range(4, 2001):
        for base in A.WRN_SPEC.group_base:
            frac = (base * j / 100) % 1
            assert abs(frac - 0.5) > 0.01


def test_cli_family_table():
    out = io.StringIO()
    with redirect_stdout(out):
        rc = F.main(["--arch=wrn", "--budget=1.5e6", "--depths=10,16,22,28,40"])
    assert rc == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["name", "depth", "width", "channels", "params", "rel_error"]
    members = F.family("wrn", 1.5e6, [10, 16, 22, 28, 40])
    assert len(lines) == 1 + len(members)
    for line, m in zip(lines[1:], members):
        cells = line.split()
        assert cells[0] == m.name and int(cells[1]) == m.depth
        assert cells[3] == "/".join(map(str, m.channels))
        assert int(cells[4].replace(",", "")) == m.params
    # Aligned: the params column ends at the same place on every line.
    ends = {line.index(c) + len(c) for line, c in zip(lines, [ln.split()[4] for ln in lines])}
    assert len(ends) == 1


def test_cli_mlp_and_errors():
    out = io.StringIO()
    with redirect_stdout(out):
        rc = F.main(
            [
                "--arch=mlp",
                "--input_shape=28,28,1",
                "--num_classes=10",
                "--depths=1,2,4,8",
                "--budget=1e6",
                "--norm=none",
            ]
        )
    assert rc == 0
    assert [ln.split()[0] for ln in out.getvalue().splitlines()[1:]] == [
        m.name for m in F.family("mlp", 1e6, [1, 2, 4, 8], input_shape=(28, 28, 1), norm="none")
    ]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "wide_tf.schema.families",
            "--arch=wrn",
            "--budget=2e4",
            "--depths=10,100",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: member wrn-100")
    r = subprocess.run(
        [sys.executable, "-m", "wide_tf.schema.families", "--arch=wrn", "--depths=10"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "exactly one of --budget" in r.stderr


def test_published_counts_closed_form():
    # Zagoruyko & Komodakis 2016, Table 1 (CIFAR-10), in millions, rounded as published.
    published = {(40, 1): 0.6, (40, 4): 8.9, (16, 8): 11.0, (22, 8): 17.2, (28, 10): 36.5}
    for (depth, k), millions in published.items():
        count = F.param_count("wrn", depth, k, 10, (32, 32, 3))
        assert round(count / 1e6, 1) == millions  # agrees at the published precision
        if millions >= 1:  # three significant digits: within 1%
            assert abs(count / 1e6 - millions) <= 0.01 * millions
    # Reference implementations' exact counts (e.g. WRN-28-10: 36,479,194).
    assert F.param_count("wrn", 28, 10) == 36479194
    assert F.param_count("wrn", 40, 1) == 563930
    assert math.isclose(F.param_count("wrn", 40, 1) / 1e6, 0.6, rel_tol=0.07)


def test_a_new_architecture_is_one_spec(monkeypatch):
    class Square(A.Architecture):
        """A toy: `depth` layers of width x width weights, integer widths from 1."""

        name = "square"
        default_input_shape = (4,)
        min_width_index = 1

        def param_count(self, depth, width, num_classes, input_shape, norm="batch"):
            return self.check_depth(depth) * int(width) ** 2

        def width_at(self, index):
            return index

        def format_width(self, width):
            return str(int(width))

    monkeypatch.setitem(A.ARCHITECTURES, "square", Square())
    members = F.family("square", 100, [1, 4])
    assert [(m.name, m.params) for m in members] == [("square-1-10", 100), ("square-4-5", 100)]
    assert "square" in F.format_table(members)
