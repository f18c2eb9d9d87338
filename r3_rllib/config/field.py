"""A settings field with its own rule (choices, range, type) declared beside it, and the one loop that checks them.

A field is declared as ``group_size: int = setting(8, range=">= 2", integer=True)``: the rule travels in the
dataclass field's metadata, :func:`field_errors` reads it back for every field of a settings class and names each
value that breaks its rule. Rules that relate two fields are not written here (see :mod:`r3_rllib.config.rules`).

Choices are the owners' own containers (a registry, a tuple of a core module), read at check time, so a name
registered after the settings class was defined (``register_loss``, ``register_priority``) is accepted.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

from r3_rllib.core.objects import is_object_path
from r3_rllib.core.typo_hints import closest_name

_INTERVAL = re.compile(r"^([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])$")
_BOUND = re.compile(r"^(>=|>)\s*(\S+)$")


def _parse_range(text: str) -> tuple[float, bool, float, bool]:
    """``"[0, 1)"`` or ``">= 2"`` -> (low, low included, high, high included)."""
    interval = _INTERVAL.match(text.strip())
    if interval:
        left, low, high, right = interval.groups()
        return float(low), left == "[", float(high), right == "]"
    bound = _BOUND.match(text.strip())
    if bound:
        return float(bound.group(2)), bound.group(1) == ">=", math.inf, True
    raise ValueError(f"range {text!r}: write an interval like '[0, 1)' or a bound like '>= 2'")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one field accepts. Every part is optional; a value passes when it passes all parts that are given."""

    choices: Collection[Any] | Callable[[], Collection[Any]] | None = None
    """The allowed values: a container of the owner module (a registry, a tuple), or a function returning one."""
    range: str | None = None
    """Allowed numbers: an interval ``"[0, 1)"``, ``"(0, 1]"`` or a lower bound ``">= 2"``, ``"> 0"``."""
    integer: bool = False
    """The value must be an int (a bool is not one)."""
    finite: bool = False
    """The value must be finite (for a range with no upper bound)."""
    none_ok: bool = False
    """None is accepted (it means "off" or "derive it")."""
    also: tuple[Any, ...] = ()
    """Literal values accepted besides the range (e.g. ``"auto"``)."""
    types: tuple[type, ...] = ()
    """The value must be an instance of one of these (a bool is not an int here); empty: any type."""
    also_types: tuple[type, ...] = ()
    """Values of these types are accepted as they are: their owner checks their form (RLlib's ``lr`` schedule,
    a list)."""
    expect: str | None = None
    """What the error message says the value must be; None: written from the parts above."""
    note: str = ""
    """Why, appended to the expectation in the error message."""

    def __post_init__(self) -> None:
        if self.range is not None:
            _parse_range(self.range)  # a typo in a declaration fails at import, not at validation

    def pool(self) -> Collection[Any] | None:
        """The allowed values now (a function given as ``choices`` is called)."""
        return self.choices() if callable(self.choices) else self.choices

    def expectation(self) -> str:
        """What a valid value is, in words: ``"finite and > 0 or None"``, ``"one of ['hf', 'vllm']"``."""
        if self.expect is not None:
            return self.expect
        parts = []
        if self.types:
            parts.append(" or ".join(_TYPE_WORDS.get(t, t.__name__) for t in self.types))
        if self.choices is not None:
            parts.append(f"one of {_shown(self.pool())}")
        if self.range is not None:
            text = self.range if _BOUND.match(self.range.strip()) else f"in {self.range}"
            parts.append(("finite and " if self.finite else "") + text)
        alternatives = (
            [" and ".join(parts)]
            + [repr(a) for a in self.also]
            + [_TYPE_WORDS.get(t, t.__name__) for t in self.also_types]
            + (["None"] if self.none_ok else [])
        )
        if len(alternatives) == 1:
            return alternatives[0]
        return ", ".join(alternatives[:-1]) + " or " + alternatives[-1]

    def error(self, name: str, value: Any) -> str | None:
        """The message naming ``name`` when ``value`` breaks the rule, else None."""
        if (value is None and self.none_ok) or any(_same(value, a) for a in self.also):
            return None
        if self.also_types and isinstance(value, self.also_types) and not isinstance(value, bool):
            return None
        if self.types and not _of_types(value, self.types):
            return self._message(name, value)
        if self.choices is not None:
            pool = self.pool()
            if _is_registry_path(value, pool):
                return _path_error(name, value, pool)
            if not _member(value, pool):
                return self._message(name, value)
        if self.range is None and not self.integer:
            return None
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return f"{name} must be a number ({self.expectation()}), got {value!r}"
        if self.integer and not isinstance(value, numbers.Integral):
            return f"{name} must be an int, got {value!r}"
        if self.range is not None and not _within(value, self.range, self.finite):
            return self._message(name, value)
        return None

    def _message(self, name: str, value: Any) -> str:
        note = f" ({self.note})" if self.note else ""
        return f"{name} must be {self.expectation()}{note}, got {value!r}"


#: How the expectation names a type.
_TYPE_WORDS = {
    bool: "true or false",
    str: "a string",
    int: "an int",
    float: "a number",
    list: "a list",
    tuple: "a tuple",
    dict: "a mapping",
    os.PathLike: "a path",
}


def _of_types(value: Any, types: tuple[type, ...]) -> bool:
    """``isinstance`` where a bool is only a bool (YAML's ``yes`` must not pass as the int 1, nor 1 as True)."""
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _same(value: Any, literal: Any) -> bool:
    return type(value) is type(literal) and value == literal


def _names(pool: Collection[Any]) -> Collection[Any] | None:
    """A registry's known names, its entry points' included (None for a plain container)."""
    names = getattr(pool, "names", None)
    return names() if callable(names) else None


def _shown(pool: Collection[Any]) -> list[Any]:
    names = _names(pool)
    if names is not None:
        return list(names)
    return sorted(pool) if isinstance(pool, Mapping) else list(pool)


def _is_registry_path(value: Any, pool: Collection[Any]) -> bool:
    """Whether ``value`` is a ``"module:attribute"`` path given where a registry's names are the choices."""
    return is_object_path(value) and callable(getattr(pool, "lookup", None))


def _path_error(name: str, value: str, pool: Any) -> str | None:
    """The message when the path ``value`` does not import to a function here, in the driver (early, before any
    worker tries it), else None."""
    try:
        pool.lookup(value)
    except (ImportError, TypeError, ValueError) as exc:
        return f"{name}: {exc}"
    return None


def _member(value: Any, pool: Collection[Any]) -> bool:
    try:
        return value in pool or value in (_names(pool) or ())
    except TypeError:  # an unhashable value (a list) is not a name in a registry
        return False


def _within(value: float, text: str, finite: bool) -> bool:
    low, low_in, high, high_in = _parse_range(text)
    # Written as "inside" tests so that NaN, which compares False with everything, is outside.
    above = value >= low if low_in else value > low
    below = value <= high if high_in else value < high
    return above and below and (not finite or math.isfinite(value))


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    **rule: Any,
) -> Any:
    """A dataclass field with ``default`` (or ``default_factory``) and the :class:`Rule` given by the keywords."""
    metadata = {"rule": Rule(**rule)} if rule else {}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


#: Rules read from a field's annotation when it declares none: a switch is true or false (a -1 or a "yes" in a
#: run file would otherwise pass as true).
_ANNOTATION_RULES = {"bool": Rule(types=(bool,)), "bool | None": Rule(types=(bool,), none_ok=True)}


def field_rule(field: dataclasses.Field) -> Rule | None:
    """The rule declared with ``field``, else the one its annotation implies (a bool field), else None (any
    value)."""
    rule = field.metadata.get("rule")
    if rule is None:
        annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", None)
        return _ANNOTATION_RULES.get(annotation)
    return rule


def field_errors(settings_class: type, values: Any, rules: Mapping[str, Rule] | None = None) -> list[str]:
    """One message per field of the dataclass ``settings_class`` whose value on ``values`` breaks its rule.

    ``rules`` (field name -> rule) gives fields a rule where the field cannot name its owner's choices itself
    (a constant of a layer below the settings)."""
    errors = []
    for field in dataclasses.fields(settings_class):
        rule = (rules or {}).get(field.name) or field_rule(field)
        if rule is not None:
            message = rule.error(field.name, getattr(values, field.name))
            if message is not None:
                errors.append(message)
    return errors


def rules_errors(rules: Mapping[str, Rule], values: Any) -> list[str]:
    """One message per name of ``rules`` whose attribute on ``values`` breaks its rule (an absent attribute is not
    checked: it is the owner's default)."""
    errors = []
    for name, rule in rules.items():
        value = getattr(values, name, dataclasses.MISSING)
        message = None if value is dataclasses.MISSING else rule.error(name, value)
        if message is not None:
            errors.append(message)
    return errors


def unknown_key_message(key: Any, known: Collection[str], where: str) -> str:
    """``"unknown key 'x' in <where>; did you mean 'y'?"`` (the hint when a known key is close; else the known keys
    when they are few, as a run's stop criteria)."""
    hint = closest_name(str(key), known)
    if hint is not None:
        return f"unknown key {key!r} in {where}; did you mean {hint!r}?"
    if len(known) <= 8:
        return f"unknown key {key!r} in {where}; known keys: {', '.join(sorted(known))}"
    return f"unknown key {key!r} in {where}"


def mapping_errors(settings_class: type, values: Mapping[str, Any], where: str) -> list[str]:
    """What is wrong with ``values``, a mapping from a file, against the dataclass ``settings_class``: every key
    that is not one of its fields, and every value that breaks its field's rule, each message prefixed
    ``where.key``."""
    fields = {f.name: f for f in dataclasses.fields(settings_class)}
    errors = []
    for key, value in values.items():
        if key not in fields:
            errors.append(unknown_key_message(key, fields, f"section {where!r}"))
            continue
        rule = field_rule(fields[key])
        message = rule.error(f"{where}.{key}", value) if rule is not None else None
        if message is not None:
            errors.append(message)
    return errors


#: Old names already warned about in this process (each is warned about once).
_WARNED_RENAMES: set[str] = set()


def renamed_keys(values: Mapping[str, Any], renames: Mapping[str, str], where: str) -> dict[str, Any]:
    """``values`` with every key that ``renames`` maps (old name -> new name) given its new name, warning once per
    old name and process (a FutureWarning naming ``where``): old run files, scripts and saved configs keep
    working. Both names at once is a ValueError (which one was meant is unknown)."""
    out = dict(values)
    for old, new in renames.items():
        if old not in out:
            continue
        if new in out:
            raise ValueError(f"{where}: {old!r} is the former name of {new!r}; give only {new!r}")
        out[new] = out.pop(old)
        if old not in _WARNED_RENAMES:
            _WARNED_RENAMES.add(old)
            warnings.warn(
                f"{where}: {old!r} is now called {new!r}; the old name will go",
                FutureWarning,
                stacklevel=_user_stacklevel(),
            )
    return out


def _user_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn` that points at the first caller outside this package and Ray (the
    user's script or test line that gave the old name), not at the config code between them."""
    import sys

    ours = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)
    ray = sys.modules.get("ray")
    skip = ours + ((os.path.dirname(os.path.abspath(ray.__file__)),) if ray and ray.__file__ else ())
    frame, level = sys._getframe(1), 1  # level 1: renamed_keys, the function that warns
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip):
        frame, level = frame.f_back, level + 1
    return level
