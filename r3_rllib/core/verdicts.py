"""Reading an LLM judge's verdict out of the text it wrote (pure: standard library only).

A judge of one response (:func:`parse_verdict`) ends its text with a verdict line::

    Verdict: correct        -> 1.0
    Verdict: incorrect      -> 0.0
    Verdict: 0.75           -> 0.75   (a decimal number in [0, 1])

The verdict is the LAST line that begins with ``Verdict:`` (earlier ones are a judge thinking aloud; text after it
is ignored). Case does not matter; markdown emphasis or quoting around it (``**Verdict:** Correct``, ``> verdict:
incorrect``), backticks and one trailing ``.`` or ``!`` are allowed. Anything else on that line (``Verdict:
correct or incorrect``, ``Verdict: 7/10``, ``Verdict: 1.5``, ``Verdict: nan``, a percentage) makes the text
unparsable (None), and so does a text with no verdict line.

A judge of a group of ``n`` responses (:func:`parse_group_scores`) writes a JSON object ``{"scores": [s_1, ...,
s_n]}``, one score in [0, 1] per response in the order shown. Also accepted: ``"scores"`` as a list of objects
with a ``"score"`` each (in order, or all with an ``"id"`` 1..n), a bare JSON list of n numbers, or an object keyed
``"1"``..``"n"``; the JSON may sit in a code fence or among other text, and the last JSON value of one of these
shapes is the answer. Without one, the fallback reads lines ``Response k: s`` (each k of 1..n exactly once).
A wrong count, a score outside [0, 1] or not a finite number, a boolean, a repeated or missing id: None.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: Verdict words and the value each stands for.
VERDICT_WORDS = {"correct": 1.0, "incorrect": 0.0}

_MARKUP = re.compile(r"[*_`>#]")
_VERDICT_LINE = re.compile(r"^\s*verdict\s*:(?P<value>.*)$", re.IGNORECASE)
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_RESPONSE_LINE = re.compile(
    r"^\s*response\s*#?\s*(?P<k>\d+)\s*[:=]\s*(?P<value>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*[.,;]?\s*$",
    re.IGNORECASE,
)


def unit_score(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool), finite and in [0, 1]; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    score = float(value)
    return score if math.isfinite(score) and 0.0 <= score <= 1.0 else None


def _verdict_value(raw: str) -> float | None:
    """The value of what follows ``Verdict:`` (markup already removed): a verdict word or a number in [0, 1]."""
    value = raw.strip()
    if value[-1:] in (".", "!"):
        value = value[:-1].rstrip()
    word = VERDICT_WORDS.get(value.lower())
    if word is not None:
        return word
    if _NUMBER.match(value):
        return unit_score(float(value))
    return None


def parse_verdict(text: str) -> float | None:
    """The value in [0, 1] of the last ``Verdict:`` line of ``text`` (module docstring); None when there is none or
    it does not parse."""
    if not isinstance(text, str):
        return None
    for line in reversed(text.splitlines()):
        match = _VERDICT_LINE.match(_MARKUP.sub("", line))
        if match:
            return _verdict_value(match.group("value"))
    return None


def _json_values(text: str) -> list[Any]:
    """Every JSON object or array in ``text``, left to right, not counting those nested in an earlier one."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                i += 1
                continue
            values.append(value)
            i = end
        else:
            i += 1
    return values


def _scores_of_list(items: Sequence[Any], n: int) -> list[float] | None:
    """Scores from a list of numbers, or of objects with a ``score`` (ordered by ``id`` 1..n when all have one)."""
    if len(items) != n:
        return None
    if all(isinstance(item, Mapping) for item in items):
        ids = [item.get("id") for item in items]
        if all(i is not None for i in ids):
            keys = [str(i).strip() for i in ids]
            if sorted(keys) != sorted(str(k) for k in range(1, n + 1)):
                return None
            items = sorted(items, key=lambda item: int(str(item["id"]).strip()))
        items = [item.get("score") for item in items]
    scores = [unit_score(item) for item in items]
    return None if any(s is None for s in scores) else scores  # type: ignore[return-value]


def _scores_of_json(value: Any, n: int) -> tuple[bool, list[float] | None]:
    """``(shape accepted, scores)`` of one JSON value: a shape of the module docstring gives True and its scores
    (None when the count or a value is wrong); any other value gives ``(False, None)``."""
    if isinstance(value, Mapping) and "scores" in value:
        items = value["scores"]
        return True, _scores_of_list(items, n) if isinstance(items, list) else None
    if isinstance(value, list):
        return True, _scores_of_list(value, n)
    if isinstance(value, Mapping) and value and all(str(k).strip().isdigit() for k in value):
        keys = {str(k).strip(): v for k, v in value.items()}
        if sorted(keys) != sorted(str(k) for k in range(1, n + 1)) or len(keys) != len(value):
            return True, None
        return True, _scores_of_list([keys[str(k)] for k in range(1, n + 1)], n)
    return False, None


def _scores_of_lines(text: str, n: int) -> list[float] | None:
    """The fallback: lines ``Response k: s`` naming each k of 1..n exactly once."""
    found: dict[int, float | None] = {}
    for line in text.splitlines():
        match = _RESPONSE_LINE.match(_MARKUP.sub("", line))
        if match:
            k = int(match.group("k"))
            if k in found:
                return None
            found[k] = unit_score(float(match.group("value")))
    if sorted(found) != list(range(1, n + 1)) or any(s is None for s in found.values()):
        return None
    return [found[k] for k in range(1, n + 1)]  # type: ignore[misc]


def parse_group_scores(text: str, n: int) -> list[float] | None:
    """One score in [0, 1] per response of a group of ``n`` (module docstring), in the order shown; None when the
    text holds no such answer, the count is wrong or a score is not a finite number in [0, 1]."""
    if not isinstance(text, str) or n < 1:
        return None
    for value in reversed(_json_values(text)):
        accepted, scores = _scores_of_json(value, n)
        if accepted:
            return scores
    return _scores_of_lines(text, n)
