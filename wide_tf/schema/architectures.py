"""The architectures of the width study, one spec each; pure Python, no TensorFlow.

A spec says what `depth` and `width` mean for its architecture: which depths exist, the exact
trainable-parameter count in closed form, the grid of widths the budget solver searches (integer
units for an MLP, a widening factor k on a 0.01 grid for a wide ResNet), how a member is named and
which channels it has. `wide_tf.schema.families` solves families from these specs,
`wide_tf.checks.validate` checks configs against them before TensorFlow starts, and
`wide_tf.engine.models.BUILDERS` holds the Keras builder of each spec under the same name
(tests/engine/test_models.py checks that every built model has exactly the count given here, and
that both registries name the same architectures).

Config files and validation import this module, so it must stay importable without TensorFlow.

To add an architecture inside the package: a subclass of `Architecture` here, passed to
`register`, and its builder in `wide_tf/engine/models/`, entered in
`wide_tf.engine.models.BUILDERS`. From outside the package, without editing it (as big_vision's
`model_name` names a module): `--config.model.arch=my_pkg.my_arch` names an importable module
that defines `SPEC` (an `Architecture`) and `build_model(depth, width, num_classes, input_shape,
norm, ghost_batch_size, name)`; `ensure` imports and registers it under that name before the
config checks (examples/residual_mlp.py, docs/options.md#your-own-model).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence

NORMS = ("none", "batch", "ghost")


def check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


def is_integer(x) -> bool:
    """True for an int or an integral float (configs hold widths as floats), never for a bool."""
    return not isinstance(x, bool) and isinstance(x, (int, float)) and int(x) == x


def round_half_up(x: float) -> int:
    # Python's round() is banker's rounding (round(2.5) == 2); channel counts should not depend on
    # the parity of the integer below, so round half up.
    return int(math.floor(x + 0.5))


class Architecture:
    """What the rest of the package needs to know about one architecture, without building it.

    Subclasses set `name`, `default_input_shape` and `min_width_index`, and implement
    `param_count`, `width_at` and `format_width`; the other methods have defaults that fit an
    architecture whose every depth and every input rank is valid.
    """

    name: str  # the config's model.arch, and the first part of every member name
    default_input_shape: tuple[int, ...]  # when a caller gives none
    min_width_index: int  # the narrowest point of the solver's grid (see width_at)

    def check_depth(self, depth) -> int:
        """The depth; ValueError naming the rule when this architecture has no such depth."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"{self.name.upper()} depth must be an integer >= 0, got {depth!r}")
        return depth

    def check_input_shape(self, shape: tuple[int, ...]) -> None:
        """ValueError when the architecture cannot take inputs of this (valid) shape."""

    def canonical_width(self, width) -> float:
        """The width as a member stores it (an int for integer widths)."""
        return float(width)

    def param_count(
        self, depth: int, width: float, num_classes: int, input_shape: Sequence[int], norm: str
    ) -> int:
        """Exact trainable-parameter count of the Keras model that the builder makes."""
        raise NotImplementedError

    def width_at(self, index: int) -> float:
        """The solver's width grid: the count must not decrease along it, from min_width_index."""
        raise NotImplementedError

    def format_width(self, width: float) -> str:
        """The width as it appears in member names."""
        raise NotImplementedError

    def member_name(self, depth: int, width: float) -> str:
        return f"{self.name}-{depth}-{self.format_width(width)}"

    def channels(self, width: float) -> tuple[int, ...] | None:
        """Channels per stage, for the family table and member records; None if not a CNN."""
        return None

    def widthless(self, depth: int) -> str | None:
        """Why a network of this depth has no width to solve for or sweep (None: it has one)."""
        return None


class MLP(Architecture):
    """`depth` hidden Dense(width) -> [norm] -> ReLU layers, then the logits (models/mlp.py).

    With a normalisation layer the hidden Dense layers have no bias (the norm's mean subtraction
    cancels it; its beta takes the bias's place) and the norm adds gamma and beta.
    """

    name = "mlp"
    default_input_shape = (28, 28, 1)  # MNIST
    min_width_index = 1

    def canonical_width(self, width) -> int:
        # Configs hold one width field for both architectures, so it may arrive as a float.
        if not is_integer(width) or width < 1:
            raise ValueError(f"MLP width must be a positive integer (units), got {width!r}")
        return int(width)

    def param_count(self, depth, width, num_classes, input_shape, norm="batch") -> int:
        check_norm(norm)
        depth = self.check_depth(depth)
        d_in = math.prod(input_shape)
        if depth == 0:  # multinomial logistic regression; width plays no part
            return d_in * num_classes + num_classes
        width = self.canonical_width(width)
        per_unit = 1 if norm == "none" else 2  # bias, or gamma + beta
        first = d_in * width + per_unit * width
        rest = (depth - 1) * (width * width + per_unit * width)
        return first + rest + width * num_classes + num_classes

    def width_at(self, index: int) -> int:
        return index

    def format_width(self, width) -> str:
        return str(int(width))

    def member_name(self, depth, width) -> str:
        return f"mlp-d{depth}-w{self.format_width(width)}"

    def widthless(self, depth) -> str | None:
        return "an MLP with no hidden layer" if depth == 0 else None


class WideResNet(Architecture):
    """WRN-depth-k, CIFAR style, pre-activation, convolutions without bias (models/resnet.py).

    Zagoruyko & Komodakis 2016: a 3x3 stem conv to 16 channels whatever k is (their Table 1), then
    three groups of n = (depth - 4) / 6 basic blocks with round(16k), round(32k), round(64k)
    channels at strides 1, 2, 2, a final norm-ReLU, global average pooling and the logits.
    """

    name = "wrn"
    default_input_shape = (32, 32, 3)  # CIFAR-10, the WRN paper's setting
    stem_channels = 16
    group_base = (16, 32, 64)
    group_strides = (1, 2, 2)
    # The solver searches k on this grid. With k = j/100 the channel counts 16k, 32k, 64k are never
    # exactly half-way between integers (their fractional parts are multiples of 1/25), so rounding
    # is unambiguous in floating point, a two-decimal name ('wrn-16-2.53') rebuilds exactly the
    # same network, and the grid is finer than one channel of the widest group (0.64 channels).
    k_grid = 100
    min_width_index = math.ceil(k_grid / 32)  # the smallest k with a channel in every group

    def blocks_per_group(self, depth) -> int:
        """n for a WRN of depth 6n+4 (n >= 1); ValueError otherwise."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ValueError(
                f"WRN depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 34, 40, ...), got {depth!r}"
            )
        return (depth - 4) // 6

    def check_depth(self, depth) -> int:
        self.blocks_per_group(depth)
        return depth

    def check_input_shape(self, shape) -> None:
        if len(shape) != 3:
            raise ValueError(f"WRN input_shape must be (height, width, channels), got {shape!r}")

    def channels(self, width) -> tuple[int, int, int]:
        """Channels of the three groups at widening factor k: round(16k), round(32k), round(64k)."""
        k = float(width)
        if not math.isfinite(k) or k <= 0:
            raise ValueError(f"WRN width multiplier k must be a positive number, got {width!r}")
        channels = tuple(round_half_up(base * k) for base in self.group_base)
        if channels[0] < 1:
            raise ValueError(
                f"WRN width multiplier k={width!r} gives {channels[0]} channels in the first "
                f"group; use k >= 1/32"
            )
        return channels  # type: ignore[return-value]

    def param_count(self, depth, width, num_classes, input_shape, norm="batch") -> int:
        check_norm(norm)
        n = self.blocks_per_group(depth)
        bn = 0 if norm == "none" else 2  # gamma + beta per channel
        total = 9 * input_shape[-1] * self.stem_channels
        prev = self.stem_channels
        for c, stride in zip(self.channels(width), self.group_strides):
            for b in range(n):
                s = stride if b == 0 else 1
                total += bn * prev + 9 * prev * c + bn * c + 9 * c * c
                if prev != c or s != 1:  # 1x1 projection shortcut where the shape changes
                    total += prev * c
                prev = c
        return total + bn * prev + prev * num_classes + num_classes

    def width_at(self, index: int) -> float:
        return index / self.k_grid

    def format_width(self, width) -> str:
        text = f"{float(width):.2f}"
        # A k off the two-decimal grid keeps enough digits that the name is still unambiguous.
        return text if float(text) == float(width) else f"{float(width):.6g}"


ARCHITECTURES: dict[str, Architecture] = {}


def register(spec: Architecture) -> Architecture:
    if spec.name in ARCHITECTURES:
        raise ValueError(f"architecture {spec.name!r} is registered already")
    ARCHITECTURES[spec.name] = spec
    return spec


MLP_SPEC = register(MLP())
WRN_SPEC = register(WideResNet())


def names() -> tuple[str, ...]:
    """The registered architectures' names, in registration order ('mlp', 'wrn', ...)."""
    return tuple(ARCHITECTURES)


def get(arch: str) -> Architecture:
    """The spec of `arch`; ValueError naming the registered architectures otherwise."""
    try:
        return ARCHITECTURES[arch]
    except (KeyError, TypeError):
        raise ValueError(
            f"arch must be one of {names()} or an importable module that defines SPEC and "
            f"build_model (pkg.module; docs/options.md#your-own-model), got {arch!r}"
        ) from None


# Architectures registered from outside the package: model.arch -> the module's build_model.
EXTERNAL: dict = {}
EXTERNAL_HELP = "docs/options.md#your-own-model"


def module_problem(name: str) -> str:
    """Why `name` cannot be a module to import ('' when it can), found without running any of its
    code: each dotted part an identifier, and its file located through sys.path's finders part
    by part (a package's __init__ is not executed, as find_spec on a dotted name would)."""
    import importlib.machinery
    import keyword
    import sys

    parts = name.split(".")
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        return "it is not a dotted module name (pkg.module)"
    if name in sys.modules:
        return ""
    search = None  # sys.path for the top-level package, then each package's folder
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return f"no module {'.'.join(parts[: i + 1])!r} is found on PYTHONPATH"
        if i < len(parts) - 1:
            if spec.submodule_search_locations is None:
                return f"{'.'.join(parts[: i + 1])!r} is a module, not a package"
            search = list(spec.submodule_search_locations)
    return ""


def ensure(arch) -> Architecture:
    """The spec of `arch`; a dotted name that is not registered is a module to import, whose
    `SPEC` is registered under that name (its builder in EXTERNAL). ValueError naming the fix when
    it cannot be imported or lacks SPEC or build_model."""
    if isinstance(arch, str) and arch in ARCHITECTURES:
        return ARCHITECTURES[arch]
    if not isinstance(arch, str) or "." not in arch:
        return get(arch)
    problem = module_problem(arch)
    if problem:  # said before any of the user's code runs (also under --dry_run)
        raise ValueError(
            f"model.arch={arch!r} is no registered architecture ({', '.join(names())}) and "
            f"{problem}; put the module on PYTHONPATH or run from the folder that holds it "
            f"({EXTERNAL_HELP})"
        )
    try:
        module = importlib.import_module(arch)
    except ImportError as e:
        raise ValueError(
            f"model.arch={arch!r} is no registered architecture ({', '.join(names())}) and its "
            f"module cannot be imported ({e}); put the module on PYTHONPATH or run from the "
            f"folder that holds it ({EXTERNAL_HELP})"
        ) from None
    spec, build = getattr(module, "SPEC", None), getattr(module, "build_model", None)
    if not isinstance(spec, Architecture) or not callable(build):
        raise ValueError(
            f"model.arch={arch!r}: the module must define SPEC (a wide_tf.schema.architectures."
            f"Architecture) and build_model(depth, width, num_classes, input_shape, norm, "
            f"ghost_batch_size, name) ({EXTERNAL_HELP})"
        )
    spec.name = arch  # records and the study's identity name the module
    register(spec)
    EXTERNAL[arch] = build
    return spec
