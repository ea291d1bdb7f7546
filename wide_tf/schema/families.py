"""Model families of the width study: at a fixed parameter budget (the width solved per depth),
at a fixed depth (a width sweep) or at a fixed width (a depth sweep); pure Python, no TensorFlow.

Config files import this module to lay out a study's sweep, so it must stay importable without
TensorFlow (and fast). What depth and width mean, and the exact parameter counts, come from the
architecture specs in `wide_tf.schema.architectures`; nothing here names an architecture.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
from collections.abc import Iterable, Sequence

from absl import flags

from wide_tf.schema import architectures, cli
from wide_tf.schema.architectures import NORMS, Architecture
from wide_tf.schema.cli import integer, number
from wide_tf.schema.problems import UsageError


class FamilyError(UsageError):
    """A family member cannot be built to the requested budget; the message names member and fix."""


def _input_shape(spec: Architecture, input_shape: Sequence[int] | None) -> tuple[int, ...]:
    shape = tuple(spec.default_input_shape if input_shape is None else input_shape)
    if not shape or any(isinstance(d, bool) or int(d) != d or d < 1 for d in shape):
        raise ValueError(f"input_shape must be positive integers, got {input_shape!r}")
    spec.check_input_shape(shape)
    return tuple(int(d) for d in shape)


def param_count(
    arch: str,
    depth: int,
    width: float,
    num_classes: int = 10,
    input_shape: Sequence[int] | None = None,
    norm: str = "batch",
) -> int:
    """Exact trainable-parameter count of `wide_tf.engine.models.build_model(arch, depth, width,
    ...)`."""
    spec = architectures.ensure(arch)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    return spec.param_count(depth, width, num_classes, _input_shape(spec, input_shape), norm)


@dataclasses.dataclass(frozen=True)
class Member:
    """One network of a family: exact parameter count, and its distance from the budget (if any)."""

    arch: str
    depth: int
    width: float  # int units for 'mlp', multiplier k for 'wrn' (see wide_tf.schema.architectures)
    params: int
    budget: float | None = None
    rel_error: float | None = None  # (params - budget) / budget

    @property
    def name(self) -> str:
        """'mlp-d2-w189', 'wrn-16-0.53': the architecture's own naming."""
        return architectures.ensure(self.arch).member_name(self.depth, self.width)

    @property
    def channels(self) -> tuple[int, ...] | None:
        """Channels per stage (WRN groups); None for an architecture without channels (MLP)."""
        return architectures.ensure(self.arch).channels(self.width)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["name"] = self.name
        d["channels"] = list(self.channels) if self.channels else None
        return d


def _member(spec: Architecture, depth, width, params, budget=None) -> Member:
    rel = None if budget is None else (params - budget) / budget
    return Member(
        arch=spec.name,
        depth=int(depth),
        width=spec.canonical_width(width),
        params=int(params),
        budget=None if budget is None else float(budget),
        rel_error=rel,
    )


def _closest_width(spec: Architecture, budget: float, count) -> float:
    """Width on the spec's grid whose count is closest to budget (count is non-decreasing in it)."""
    at, lo = spec.width_at, spec.min_width_index
    # Exponential then binary search for the first grid index whose count reaches the budget.
    hi = max(lo, 1)
    while count(at(hi)) < budget:
        hi *= 2
    idx = lo + bisect.bisect_left(range(lo, hi + 1), budget, key=lambda i: count(at(i)))
    candidates = [i for i in (idx - 1, idx) if i >= lo]
    best = min(candidates, key=lambda i: (abs(count(at(i)) - budget), i))
    return at(best)


def _check_budget(budget) -> None:
    if (
        not isinstance(budget, (int, float))
        or isinstance(budget, bool)
        or not budget > 0
        or not math.isfinite(budget)
    ):
        raise FamilyError(f"budget must be a positive number of parameters, got {budget!r}")


def _off_budget(m: Member, spec: Architecture, budget: float, tolerance: float) -> FamilyError:
    """The error for a member whose closest width is still more than `tolerance` from the budget."""
    if m.params > budget and m.width == spec.width_at(spec.min_width_index):
        fix = "the narrowest network is already over budget: use a smaller depth or a larger budget"
    else:  # integer units/channels make the count jump across the budget
        fix = (
            "the count jumps over the budget between neighbouring widths: raise the "
            "tolerance or change the budget or depth"
        )
    return FamilyError(
        f"member {m.name}: {m.params} parameters is {m.rel_error:+.1%} from the budget "
        f"{budget:.4g} (tolerance {tolerance:.1%}); {fix}"
    )


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
    try:
        spec = architectures.ensure(arch)
    except ValueError as e:
        raise FamilyError(str(e)) from None
    _check_budget(budget)
    depths = list(depths)
    if not depths:
        raise FamilyError("depths is empty; give at least one depth")
    shape = _input_shape(spec, input_shape)
    members = []
    for depth in depths:
        label = f"{arch} depth {depth}"

        def count(w, depth=depth):
            return param_count(arch, depth, w, num_classes, shape, norm)

        widthless = spec.widthless(depth)
        if widthless:
            raise FamilyError(
                f"{label}: {widthless} has no width to solve for ({count(1)} parameters whatever "
                f"the budget); drop depth {depth} from the family or use depth_sweep"
            )
        try:
            width = _closest_width(spec, budget, count)
        except ValueError as e:
            raise FamilyError(f"{label}: {e}") from None
        m = _member(spec, depth, width, count(width), budget)
        if abs(m.rel_error) > tolerance:
            raise _off_budget(m, spec, budget, tolerance)
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
    spec = architectures.ensure(arch)
    widthless = spec.widthless(depth)
    if widthless:
        raise FamilyError(f"{arch} depth {depth}: {widthless} has no width to sweep; use another")
    return [
        _member(spec, depth, w, param_count(arch, depth, w, num_classes, input_shape, norm))
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
    spec = architectures.ensure(arch)
    return [
        _member(spec, d, width, param_count(arch, d, width, num_classes, input_shape, norm))
        for d in depths
    ]


KINDS = ("budget", "width", "depth")


def from_config(
    arch: str, f, *, num_classes: int, input_shape: Sequence[int], norm: str
) -> list[Member]:
    """The members of a config's `sweep.family` section `f`, by its kind (one of KINDS)."""
    common = dict(num_classes=num_classes, input_shape=tuple(input_shape), norm=norm)
    if f.kind == "budget":
        return family(arch, f.budget, list(f.depths), tolerance=f.tolerance, **common)
    if f.kind == "width":
        return width_sweep(arch, f.depth, list(f.widths), **common)
    if f.kind == "depth":
        return depth_sweep(arch, f.width, list(f.depths), **common)
    raise FamilyError(f"sweep.family.kind={f.kind!r}: choose one of {', '.join(KINDS)}")


def format_table(members: Sequence[Member]) -> str:
    """An aligned text table of a family: name, depth, width, channels (where an architecture has
    them), params, rel. error."""
    with_channels = any(m.channels is not None for m in members)
    header = ["name", "depth", "width"]
    header += ["channels"] if with_channels else []
    header += ["params", "rel_error"]
    rows = []
    for m in members:
        row = [m.name, str(m.depth), architectures.ensure(m.arch).format_width(m.width)]
        if with_channels:
            row.append("/".join(map(str, m.channels)) if m.channels else "-")
        row += [f"{m.params:,}", "-" if m.rel_error is None else f"{m.rel_error:+.2%}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    left = {0, 3} if with_channels else {0}  # text columns left-aligned, numbers right-aligned
    lines = [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in [header] + rows
    ]
    return "\n".join(lines)


# The command line's bound on a parameter count (a budget, or a member of a sweep): a trillion
# parameters is above any network this study trains, and far larger counts only overflow the
# width solver (1e300 raised OverflowError) or print widths of hundreds of digits.
CLI_MAX_PARAMS = 1e12


def _int_list(text) -> list[int]:
    try:
        values = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"expected at least one integer, got {text!r}")
    return values


def _shape(text) -> list[int]:
    values = _int_list(text)
    if min(values) < 1:
        raise ValueError(f"expected comma-separated integers >= 1 (e.g. 28,28,1), got {text!r}")
    return values


_param_count = number(0.0, low_open=True, high=CLI_MAX_PARAMS)


def _float_list(text) -> list[float]:
    try:
        values = [_param_count.parse(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated finite numbers > 0, got {text!r}") from None
    if not values:
        raise ValueError(f"expected at least one number, got {text!r}")
    return values


PROG = "python -m wide_tf.schema.families"
HELP = f"""\
Prints a family of MLPs or wide ResNets: each member's depth, width and exact parameter count. One
of --budget (the width solved per depth at that many parameters), --width (a depth sweep at that
width) or --widths (a width sweep at one depth).

  {PROG} --arch=wrn --budget=1.5e6 --depths=10,16,22,28,40
  {PROG} --arch=mlp --budget=1e5 --depths=1,2,4 --input_shape=28,28,1 --norm=none
  {PROG} --arch=mlp --depths=2 --widths=64,128,256

Bad input is one `error:` line on stderr and exit status 2."""
# The command's own flags (schema/cli.py): the package imports this module for its functions.
_FLAGS = cli.flag_values()
flags.DEFINE_enum("arch", None, architectures.names(), "the architecture", flag_values=_FLAGS)
flags.DEFINE(
    cli.Typed(_int_list, "comma-separated integers"),
    "depths",
    None,
    "the depths, comma-separated, e.g. 10,16,22,28,40",
    flag_values=_FLAGS,
)
flags.DEFINE(_param_count, "budget", None, "parameter budget: solve width per depth", _FLAGS)
flags.DEFINE(_param_count, "width", None, "fixed width: a depth sweep", _FLAGS)
flags.DEFINE(
    cli.Typed(_float_list, "comma-separated numbers > 0"),
    "widths",
    None,
    "widths at one depth: a width sweep",
    flag_values=_FLAGS,
)
flags.DEFINE(integer(1), "num_classes", 10, "classes of the output layer", _FLAGS)
flags.DEFINE(
    cli.Typed(_shape, "comma-separated integers >= 1"),
    "input_shape",
    None,
    "e.g. 28,28,1 (default: "
    + ", ".join(
        f"{','.join(map(str, spec.default_input_shape))} for {name}"
        for name, spec in architectures.ARCHITECTURES.items()
    )
    + ")",
    flag_values=_FLAGS,
)
flags.DEFINE_enum("norm", "batch", NORMS, "the normalisation layers", flag_values=_FLAGS)
flags.DEFINE(number(0.0), "tolerance", 0.05, "relative, e.g. 0.05", _FLAGS)


def _members(args) -> list[Member]:
    kw = dict(num_classes=args.num_classes, input_shape=args.input_shape, norm=args.norm)
    if sum(x is not None for x in (args.budget, args.width, args.widths)) != 1:
        raise FamilyError(
            "give exactly one of --budget, --width, --widths; e.g. --budget=1.5e6 (a family), "
            "--width=4 (a depth sweep) or --widths=2,4,8 with one depth (a width sweep)"
        )
    if args.budget is not None:
        return family(args.arch, args.budget, args.depths, tolerance=args.tolerance, **kw)
    if args.width is not None:
        members = depth_sweep(args.arch, args.width, args.depths, **kw)
    else:
        if len(args.depths) != 1:
            raise FamilyError("--widths needs exactly one depth in --depths")
        members = width_sweep(args.arch, args.depths[0], args.widths, **kw)
    big = [m for m in members if m.params > CLI_MAX_PARAMS]
    if big:
        raise FamilyError(
            f"member {big[0].name}: {big[0].params:.3g} parameters is above the "
            f"{CLI_MAX_PARAMS:.0e} this command lays out; use a smaller width or depth"
        )
    return members


def main(argv: Sequence[str] | None = None) -> int:
    """The command on argv (default: sys.argv[1:]): print a family (--budget), a width sweep
    (--widths, one depth) or a depth sweep (--width); its exit status."""
    required = {"arch": f"one of {', '.join(architectures.names())}, e.g. --arch=mlp"}
    required["depths"] = "e.g. --depths=10,16,22,28,40"
    return cli.run(_print_members, _FLAGS, argv, prog=PROG, text=HELP, required=required)


def _print_members(argv) -> int:
    try:
        members = _members(cli.values(_FLAGS))
    except ValueError as e:  # FamilyError is a ValueError
        cli.fail(str(e))
    print(format_table(members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
