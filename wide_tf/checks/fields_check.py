"""Owns checking each field of a config on its own: that every section has exactly the schema's
fields, and one loop that checks every field's value against its declared domain (schema/fields.py),
plus the theory check's section, which has no schema. The rules that relate several fields are
schema/rules.py's; checks/validate.py runs both."""

from __future__ import annotations

from wide_tf.schema import defaults, fields, rules
from wide_tf.schema.fields import suggest
from wide_tf.schema.problems import UsageError

_FIX = "build the config from wide_tf.schema.defaults.base_config(), which sets every field"


def check_sections(config) -> None:
    """Each section has exactly the fields that the schema gives it (`sweep` may be None: one
    run), so that a config file written by hand fails here, not as an AttributeError mid-run."""
    for section in fields.SECTIONS:
        have = config.get(section)
        if have is None and section == "sweep":
            continue
        if have is None:
            raise UsageError(f"the config has no {section} section; {_FIX}")
        _same_fields(section, have, defaults.section(section), _FIX)


def _same_fields(where: str, have, want, fix: str) -> None:
    for k in want:
        if k not in have:
            raise UsageError(f"{where}.{k} is missing from the config; {fix}")
    for k in have:
        if k not in want:
            raise UsageError(
                f"{where}.{k} is not a config field{suggest(k, list(want))}; remove or rename it "
                f"in the config file"
            )
        if hasattr(want[k], "keys") and hasattr(have[k], "keys"):  # sweep.family
            _same_fields(f"{where}.{k}", have[k], want[k], fix)


def _raise(message: str | None) -> None:
    if message:
        raise UsageError(message)


def _check_list(where: str, domain: fields.NumList, value) -> None:
    values = list(value or [])
    if domain.empty is not None and not values:
        raise UsageError(domain.empty)
    for v in values:
        _raise(domain.item.error(where, v, listed=True))
    if domain.increasing and values != sorted(values):
        raise UsageError(f"{where}={values} must increase; fix the list in the config file")
    if domain.unique and len(set(values)) != len(values):
        repeated = sorted({v for v in values if values.count(v) > 1})
        raise UsageError(
            f"{where}={values} repeats {', '.join(map(str, repeated))}; list each value once "
            f"(--config.{where}=...)"
        )


def _check_jit(where: str, jit) -> None:
    if not (isinstance(jit, bool) or str(jit).lower() in fields.JIT_COMPILE):
        raise UsageError(
            f"{where}={jit!r} is not valid; use auto, True or False (--config.{where}=...)"
        )


def check_value(config, f: fields.Field) -> None:
    """Raises a UsageError when the value of field `f` in `config` is outside its domain."""
    value = config
    for part in f.path.split("."):
        value = value[part]
    domain = f.domain
    if isinstance(domain, (fields.Num, fields.Choice)):
        _raise(domain.error(f.path, value))
    elif isinstance(domain, fields.NumList):
        _check_list(f.path, domain, value)
    elif domain == fields.JIT:
        _check_jit(f.path, value)
    # FREE, and the targets (whose value depends on the metric): schema/rules.py's check_targets.


def check_values(config) -> None:
    """Every field of a training config against its domain, in the schema's order; the sweep's
    fields only for a sweep, a field with a condition only where it holds."""
    sweep = rules.has_sweep(config)
    for f in fields.FIELDS.values():
        if f.section == "sweep" and not sweep:
            continue
        if f.when is None or f.when(config):
            check_value(config, f)


def parse_target(where: str, spec) -> tuple[str, float]:
    """An entry of train.extra_targets, "metric:value", as (metric, value) (schema/rules.py has the
    grammar); a UsageError naming `where` if it is malformed."""
    try:
        return rules.parse_target(where, spec)
    except rules.RuleError as e:
        raise UsageError(str(e)) from None


def check_theory(config) -> None:
    t = config.get("theory")
    if t is None:
        raise UsageError(
            "config.kind='theory' needs a config.theory section; start from configs/theory.py"
        )
    count = fields.Num(low=1, integer=True)
    for key in ("input_dim", "budget", "fixed_width", "n_samples"):
        if key in t:
            _raise(count.error(f"theory.{key}", t[key]))
    if "n_inits" in t:
        two = fields.Num(low=2, integer=True, fix="the intervals need two draws or more")
        _raise(two.error("theory.n_inits", t.n_inits))
    for key in ("widths", "depths"):
        if key in t:
            _check_list(f"theory.{key}", fields.NumList(count, empty=_empty(key)), t[key])
    if "label_noise" in t:
        _raise(fields.Num(low=0).error("theory.label_noise", t.label_noise))
    for kind in t.get("kinds", []):
        _raise(fields.Choice(fields.THEORY_KINDS).error("theory.kinds", kind))


def _empty(key: str) -> str:
    return f"theory.{key} is empty; list at least one value in the config file"
