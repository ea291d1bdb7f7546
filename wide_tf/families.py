"""Closed-form parameter counts and fixed-budget model families (MLP, WRN); pure Python, no TensorFlow.

Config files import this module to lay out a study's sweep, so it must stay importable without
TensorFlow (and fast): the counts here are closed forms of the architectures that
`wide_tf.models` builds, and a test checks them against the built Keras models.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import math
import sys
from collections.abc import Iterable, Sequence

ARCHS = ("mlp", "wrn")
NORMS = ("none", "batch", "ghost")

# Defaults that make `family('wrn', ...)` mean the WRN paper's CIFAR-10 setting and
# `family('mlp', ...)` MNIST, when a caller does not say.
DEFAULT_INPUT_SHAPE = {"wrn": (32, 32, 3), "mlp": (28, 28, 1)}

# The WRN stem is a 3x3 conv to 16 channels whatever k is (Zagoruyko & Komodakis 2016, Table 1).
WRN_STEM_CHANNELS = 16
WRN_GROUP_BASE = (16, 32, 64)
WRN_GROUP_STRIDES = (1, 2, 2)

# The WRN solver searches k on this grid. With k = j/100 the channel counts 16k, 32k, 64k are never
# exactly half-way between integers (their fractional parts are multiples of 1/25), so rounding is
# unambiguous in floating point, a two-decimal name ('wrn-16-2.53') rebuilds exactly the same
# network, and the grid is finer than one channel of the widest group (64/100 = 0.64 channels).
WRN_K_GRID = 100


class FamilyError(ValueError):
    """A family member cannot be built to the requested budget; the message names member and fix."""


def _round_half_up(x: float) -> int:
    # Python's round() is banker's rounding (round(2.5) == 2); channel counts should not depend on
    # the parity of the integer below, so round half up.
    return int(math.floor(x + 0.5))


def wrn_channels(width: float) -> tuple[int, int, int]:
    """Channels of the three WRN groups for width multiplier k: round(16k), round(32k), round(64k)."""
    k = float(width)
    if not math.isfinite(k) or k <= 0:
        raise ValueError(f"WRN width multiplier k must be a positive number, got {width!r}")
    channels = tuple(_round_half_up(base * k) for base in WRN_GROUP_BASE)
    if channels[0] < 1:
        raise ValueError(
            f"WRN width multiplier k={width!r} gives {channels[0]} channels in the first group; "
            f"use k >= 1/32"
        )
    return channels  # type: ignore[return-value]


def wrn_blocks_per_group(depth: int) -> int:
    """n for a WRN of depth 6n+4 (n >= 1); ValueError otherwise."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise ValueError(
            f"WRN depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 34, 40, ...), got {depth!r}"
        )
    return (depth - 4) // 6


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def _input_shape(arch: str, input_shape: Sequence[int] | None) -> tuple[int, ...]:
    shape = tuple(DEFAULT_INPUT_SHAPE[arch] if input_shape is None else input_shape)
    if not shape or any(isinstance(d, bool) or int(d) != d or d < 1 for d in shape):
        raise ValueError(f"input_shape must be positive integers, got {input_shape!r}")
    if arch == "wrn" and len(shape) != 3:
        raise ValueError(f"WRN input_shape must be (height, width, channels), got {input_shape!r}")
    return tuple(int(d) for d in shape)


def mlp_param_count(
    depth: int, width: int, num_classes: int, input_shape: Sequence[int], norm: str = "batch"
) -> int:
    """Trainable parameters of `build_mlp`: `depth` hidden Dense(width) layers, then the logits.

    With a normalisation layer the hidden Dense layers have no bias (the norm's mean subtraction
    cancels it; its beta takes the bias's place) and the norm adds gamma and beta.
    """
    _check_norm(norm)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"MLP depth must be an integer >= 0, got {depth!r}")
    d_in = math.prod(input_shape)
    if depth == 0:  # multinomial logistic regression; width plays no part
        return d_in * num_classes + num_classes
    if isinstance(width, bool) or int(width) != width or width < 1:
        raise ValueError(f"MLP width must be a positive integer, got {width!r}")
    width = int(width)
    per_unit = 1 if norm == "none" else 2  # bias, or gamma + beta
    first = d_in * width + per_unit * width
    rest = (depth - 1) * (width * width + per_unit * width)
    return first + rest + width * num_classes + num_classes


def wrn_param_count(
    depth: int, width: float, num_classes: int, input_shape: Sequence[int], norm: str = "batch"
) -> int:
    """Trainable parameters of `build_wrn` (WRN-depth-k, convolutions without bias)."""
    _check_norm(norm)
    n = wrn_blocks_per_group(depth)
    bn = 0 if norm == "none" else 2  # gamma + beta per channel
    total = 9 * input_shape[-1] * WRN_STEM_CHANNELS
    prev = WRN_STEM_CHANNELS
    for c, stride in zip(wrn_channels(width), WRN_GROUP_STRIDES):
        for b in range(n):
            s = stride if b == 0 else 1
            total += bn * prev + 9 * prev * c + bn * c + 9 * c * c
            if prev != c or s != 1:  # 1x1 projection shortcut where the shape changes
                total += prev * c
            prev = c
    return total + bn * prev + prev * num_classes + num_classes


def param_count(
    arch: str,
    depth: int,
    width: float,
    num_classes: int = 10,
    input_shape: Sequence[int] | None = None,
    norm: str = "batch",
) -> int:
    """Exact trainable-parameter count of `wide_tf.models.build_model(arch, depth, width, ...)`."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    shape = _input_shape(arch, input_shape)
    if arch == "mlp":
        return mlp_param_count(depth, width, num_classes, shape, norm)
    return wrn_param_count(depth, width, num_classes, shape, norm)


def format_width(arch: str, width: float) -> str:
    """Width as it appears in member names: '512' for an MLP, '2.50' for a WRN."""
    if arch == "mlp":
        return str(int(width))
    text = f"{float(width):.2f}"
    # A k off the two-decimal grid keeps enough digits that the name is still unambiguous.
    return text if float(text) == float(width) else f"{float(width):.6g}"


@dataclasses.dataclass(frozen=True)
class Member:
    """One network of a family: exact parameter count, and its distance from the budget (if any)."""

    arch: str
    depth: int
    width: float  # int units for 'mlp', multiplier k for 'wrn'
    params: int
    budget: float | None = None
    rel_error: float | None = None  # (params - budget) / budget

    @property
    def name(self) -> str:
        if self.arch == "mlp":
            return f"mlp-d{self.depth}-w{format_width('mlp', self.width)}"
        return f"wrn-{self.depth}-{format_width('wrn', self.width)}"

    @property
    def channels(self) -> tuple[int, int, int] | None:
        """WRN group channels; None for an MLP."""
        return wrn_channels(self.width) if self.arch == "wrn" else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["name"] = self.name
        d["channels"] = list(self.channels) if self.channels else None
        return d


def _member(arch, depth, width, params, budget=None) -> Member:
    width = int(width) if arch == "mlp" else float(width)
    rel = None if budget is None else (params - budget) / budget
    return Member(
        arch=arch,
        depth=int(depth),
        width=width,
        params=int(params),
        budget=None if budget is None else float(budget),
        rel_error=rel,
    )


def _closest_width(arch, depth, budget, count) -> float:
    """Width on the arch's grid whose count is closest to budget (count is non-decreasing in it)."""
    if arch == "mlp":

        def at(i):
            return i

        lo = 1
    else:

        def at(j):
            return j / WRN_K_GRID

        lo = math.ceil(WRN_K_GRID / 32)  # the smallest k with at least one channel per group
    # Exponential then binary search for the first grid index whose count reaches the budget.
    hi = max(lo, 1)
    while count(at(hi)) < budget:
        hi *= 2
    idx = lo + bisect.bisect_left(range(lo, hi + 1), budget, key=lambda i: count(at(i)))
    candidates = [i for i in (idx - 1, idx) if i >= lo]
    best = min(candidates, key=lambda i: (abs(count(at(i)) - budget), i))
    return at(best)


def family(
    arch: str,
    budget: float,
    depths: Iterable[int],
    *,
    num_classes: int = 10,
    input_shape: Sequence[int] | None = None,
    norm: str = "batch",
    tolerance: float = 0.05,
) -> list[Member]:
    """For each depth, the width whose parameter count is closest to `budget`.

    Raises FamilyError when a depth cannot get within `tolerance` (relative) of the budget, e.g. a
    depth too large for the budget, or an MLP of depth 0 (its count does not depend on width).
    """
    if arch not in ARCHS:
        raise FamilyError(f"arch must be one of {ARCHS}, got {arch!r}")
    if (
        not isinstance(budget, (int, float))
        or isinstance(budget, bool)
        or not budget > 0
        or not math.isfinite(budget)
    ):
        raise FamilyError(f"budget must be a positive number of parameters, got {budget!r}")
    depths = list(depths)
    if not depths:
        raise FamilyError("depths is empty; give at least one depth")
    shape = _input_shape(arch, input_shape)
    members = []
    for depth in depths:
        label = f"{arch} depth {depth}"
        if arch == "mlp" and depth == 0:
            raise FamilyError(
                f"{label}: an MLP with no hidden layer has no width to solve for "
                f"({param_count('mlp', 0, 1, num_classes, shape, norm)} parameters whatever the "
                f"budget); drop depth 0 from the family or use depth_sweep"
            )
        try:

            def count(w, depth=depth):
                return param_count(arch, depth, w, num_classes, shape, norm)

            width = _closest_width(arch, depth, budget, count)
        except ValueError as e:
            raise FamilyError(f"{label}: {e}") from None
        m = _member(arch, depth, width, count(width), budget)
        if abs(m.rel_error) > tolerance:
            narrowest = 1 if arch == "mlp" else math.ceil(WRN_K_GRID / 32) / WRN_K_GRID
            if m.params > budget and width == narrowest:
                fix = (
                    "the narrowest network is already over budget: use a smaller depth or a "
                    "larger budget"
                )
            else:  # integer units/channels make the count jump across the budget
                fix = (
                    "the count jumps over the budget between neighbouring widths: raise the "
                    "tolerance or change the budget or depth"
                )
            raise FamilyError(
                f"member {m.name}: {m.params} parameters is {m.rel_error:+.1%} from the budget "
                f"{budget:.4g} (tolerance {tolerance:.1%}); {fix}"
            )
        members.append(m)
    return members


def width_sweep(
    arch: str,
    depth: int,
    widths: Iterable[float],
    *,
    num_classes: int = 10,
    input_shape: Sequence[int] | None = None,
    norm: str = "batch",
) -> list[Member]:
    """Members at a fixed depth and the given widths (no budget)."""
    if arch == "mlp" and depth == 0:
        raise FamilyError("mlp depth 0 has no width to sweep; use a depth >= 1")
    return [
        _member(arch, depth, w, param_count(arch, depth, w, num_classes, input_shape, norm))
        for w in widths
    ]


def depth_sweep(
    arch: str,
    width: float,
    depths: Iterable[int],
    *,
    num_classes: int = 10,
    input_shape: Sequence[int] | None = None,
    norm: str = "batch",
) -> list[Member]:
    """Members at a fixed width and the given depths (no budget)."""
    return [
        _member(arch, d, width, param_count(arch, d, width, num_classes, input_shape, norm))
        for d in depths
    ]


def format_table(members: Sequence[Member]) -> str:
    """An aligned text table of a family (name, depth, width, channels for WRN, params, rel. error)."""
    wrn = any(m.arch == "wrn" for m in members)
    header = ["name", "depth", "width"] + (["channels"] if wrn else []) + ["params", "rel_error"]
    rows = []
    for m in members:
        row = [m.name, str(m.depth), format_width(m.arch, m.width)]
        if wrn:
            row.append("/".join(map(str, m.channels)) if m.channels else "-")
        row += [f"{m.params:,}", "-" if m.rel_error is None else f"{m.rel_error:+.2%}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    left = {0, 3} if wrn else {0}  # text columns left-aligned, numbers right-aligned
    lines = [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in [header] + rows
    ]
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def _float_list(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print a family (--budget), a width sweep (--widths, one depth) or a depth sweep (--width)."""
    p = argparse.ArgumentParser(
        prog="python -m wide_tf.families",
        description="Parameter-matched families of MLPs and wide ResNets.",
    )
    p.add_argument("--arch", choices=ARCHS, required=True)
    p.add_argument("--depths", type=_int_list, required=True, help="e.g. 10,16,22,28,40")
    p.add_argument("--budget", type=float, help="parameter budget: solve width per depth")
    p.add_argument("--width", type=float, help="fixed width: a depth sweep")
    p.add_argument("--widths", type=_float_list, help="widths at one depth: a width sweep")
    p.add_argument("--num_classes", type=int, default=10)
    p.add_argument(
        "--input_shape",
        type=_int_list,
        default=None,
        help="e.g. 28,28,1 (default: 32,32,3 for wrn, 28,28,1 for mlp)",
    )
    p.add_argument("--norm", choices=NORMS, default="batch")
    p.add_argument("--tolerance", type=float, default=0.05)
    args = p.parse_args(argv)
    kw = dict(num_classes=args.num_classes, input_shape=args.input_shape, norm=args.norm)
    try:
        if sum(x is not None for x in (args.budget, args.width, args.widths)) != 1:
            raise FamilyError("give exactly one of --budget, --width, --widths")
        if args.budget is not None:
            members = family(args.arch, args.budget, args.depths, tolerance=args.tolerance, **kw)
        elif args.width is not None:
            members = depth_sweep(args.arch, args.width, args.depths, **kw)
        else:
            if len(args.depths) != 1:
                raise FamilyError("--widths needs exactly one depth in --depths")
            members = width_sweep(args.arch, args.depths[0], args.widths, **kw)
    except ValueError as e:  # FamilyError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
