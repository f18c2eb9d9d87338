"""What the config's ``reward_models`` list holds: one :class:`RewardModelSpec` per reward term beside the env's own
reward (a rule function, a scalar reward model, a generative judge, a group judge)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The scorer types a spec may name (``type:``), each built by :func:`r3_rllib.reward_models.build_scorer`.
SCORER_TYPES = ("rule", "scalar", "judge", "group_judge")


@dataclass(frozen=True)
class RewardModelSpec:
    """One reward term of the config's ``reward_models`` list.

    ``type`` picks the scorer: ``rule`` (a Python function ``function: "module:name"`` called as
    ``fn(prompt_text, response_text, gold) -> float``), ``scalar`` (a sequence-classification model at ``model``,
    one logit per response), ``judge`` (a generative judge: the causal LM at ``model`` run by the ``engine``, HF or
    vLLM, prompted with ``rubric``, its verdict parsed), ``group_judge`` (a judge that sees all the responses to one
    prompt and scores them against each other, RULER-style).
    """

    name: str
    """The term's name: its metrics (``reward_server/<name>_mean``) and its key in each sample's reward parts."""
    type: str
    weight: float = 1.0
    """The term's weight in the composed reward (``env_reward_weight * env reward + sum of weight * score``)."""
    gate: bool = False
    """A gate term (e.g. "format first"): when its score is below ``gate_threshold`` the composed reward is
    ``gate_reward`` whatever the other terms say; a gate adds nothing to the weighted sum."""
    gate_threshold: float = 0.5
    gate_reward: float = 0.0
    model: str | None = None
    """The model's path (or a named model) for ``scalar``, ``judge`` and ``group_judge``."""
    function: str | None = None
    """A ``rule`` term's function: ``"module:name"``, ``"path/to/file.py:name"``, or ``"math"`` (the math grader)."""
    engine: str = "hf"
    """The judge's generation engine (``hf`` or ``vllm``, as the runners' ``engine`` setting)."""
    rubric: str | None = None
    """The judge's prompt template (``{question}``, ``{response}``, ``{gold}`` are filled in); None: the scorer's
    default rubric."""
    max_new_tokens: int = 256
    """Tokens a judge may write before its verdict."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy, reproducible)."""
    batch_size: int = 32
    """Requests per forward (scalar) or per engine call (judges)."""
    scorer_class: str | None = None
    """``"module:Class"`` of a scorer of your own for this term, built as ``Class(spec)`` in place of the type's
    (a ``group_judge`` term's class scores whole groups: ``score_groups``); then ``model`` and ``function`` are
    the class's to require."""


#: The fields a ``reward_models`` entry may set (every field of :class:`RewardModelSpec`).
SPEC_FIELDS = tuple(RewardModelSpec.__dataclass_fields__)

#: The field each scorer type cannot do without.
_NEEDS = {"rule": "function", "scalar": "model", "judge": "model", "group_judge": "model"}

_NUMBER_FIELDS = ("weight", "gate_threshold", "gate_reward", "temperature")
_COUNT_FIELDS = ("max_new_tokens", "batch_size")
_TEXT_FIELDS = ("name", "type", "model", "function", "engine", "rubric", "scorer_class")


class RewardModelsError(ValueError):
    """A ``reward_models`` entry that cannot be a reward term; the message names the entry and the field."""


def _entry_name(index: int, entry: Mapping[str, Any]) -> str:
    name = entry.get("name")
    return f"reward_models[{index}]" + (f" ({name!r})" if isinstance(name, str) and name else "")


def _field_error(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be field ``key`` of a spec, or None."""
    if key in _NUMBER_FIELDS:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if key == "temperature" and value < 0:
            return f"must be >= 0, got {value!r}"
    elif key in _COUNT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"must be an int >= 1, got {value!r}"
    elif key == "gate":
        if not isinstance(value, bool):
            return f"must be true or false, got {value!r}"
    elif key in _TEXT_FIELDS and value is not None and not isinstance(value, str):
        return f"must be a string, got {value!r}"
    return None


def parse_reward_model(index: int, entry: Any) -> RewardModelSpec:
    """Entry ``index`` of the config's ``reward_models`` list (a dict, or a spec already) as a spec; a
    :class:`RewardModelsError` naming the entry and the field when it cannot be one."""
    if isinstance(entry, RewardModelSpec):
        entry = dataclasses.asdict(entry)
    if not isinstance(entry, Mapping):
        raise RewardModelsError(
            f"reward_models[{index}] must be a dict of a reward term's fields, got {entry!r}"
        )
    where = _entry_name(index, entry)
    unknown = sorted(str(k) for k in entry if k not in SPEC_FIELDS)
    if unknown:
        raise RewardModelsError(
            f"{where}: unknown field(s) {unknown}; a reward term's fields are {list(SPEC_FIELDS)}"
        )
    for key in ("name", "type"):
        if not entry.get(key):
            raise RewardModelsError(f"{where}: field {key!r} is missing")
    if entry["type"] not in SCORER_TYPES:
        raise RewardModelsError(
            f"{where}: field 'type' must be one of {list(SCORER_TYPES)}, got {entry['type']!r}"
        )
    for key, value in entry.items():
        message = _field_error(key, value)
        if message is not None:
            raise RewardModelsError(f"{where}: field {key!r} {message}")
    for key in ("function", "scorer_class"):
        value = entry.get(key)
        if value is not None and ":" not in value and not (key == "function" and value == "math"):
            raise RewardModelsError(f"{where}: field {key!r} must be 'module:name', got {value!r}")
    needed = _NEEDS[entry["type"]]
    if not entry.get(needed) and entry.get("scorer_class") is None:
        raise RewardModelsError(f"{where}: a {entry['type']!r} term needs field {needed!r}")
    if entry.get("engine", "hf") not in ("hf", "vllm"):
        raise RewardModelsError(f"{where}: field 'engine' must be 'hf' or 'vllm', got {entry['engine']!r}")
    return RewardModelSpec(**{k: float(v) if k in _NUMBER_FIELDS else v for k, v in entry.items()})


def parse_reward_models(entries: Sequence[Any] | None) -> list[RewardModelSpec]:
    """The config's ``reward_models`` list as specs, in order (None: no term); a :class:`RewardModelsError` for the
    first entry that cannot be a reward term, or for two terms of one name (their metrics and reward parts would
    collide)."""
    if entries is None:
        return []
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Sequence):
        raise RewardModelsError(f"reward_models must be a list of reward terms (dicts), got {entries!r}")
    specs = [parse_reward_model(i, entry) for i, entry in enumerate(entries)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise RewardModelsError(f"reward_models[{i}]: the name {spec.name!r} is used by an earlier term")
        seen.add(spec.name)
    return specs
