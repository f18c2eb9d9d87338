"""A rule reward term: a Python function graded each response, or the package's math grader.

``function: "module:name"`` names a function importable where the reward server runs (an installed package, a module
in the current directory or on ``PYTHONPATH``, as every ``"module:attribute"`` of a config:
:func:`r3_rllib.core.objects.load_object`), or ``"path/to/file.py:name"`` a function of a Python file. It is called
as ``fn(prompt_text, response_text, gold)`` and returns a real number (a bool counts as 1 or 0; a numpy scalar or a
0-d tensor as its value). ``function: math`` is the math grader
(:mod:`r3_rllib.rewards.math_grader`: 1.0 when the last ``\\boxed{}`` of the response equals the gold answer, else
0.0).

A function that raises gives ``RewardScore(0, "rule_error")``; one that returns something else or a value that is
not finite gives ``RewardScore(0, "rule_bad_value")``; the math grader without a gold answer gives
``RewardScore(0, "rule_no_gold")``, and one whose worker timed out or failed (its reasons ``timeout`` and
``error``) ``RewardScore(0, "rule_error")``. None of them stops the run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from r3_rllib.core.objects import ObjectPathError, load_object
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest, RewardScore

logger = logging.getLogger(__name__)

#: ``function:`` value that selects the math grader.
MATH_FUNCTION = "math"
#: The math grader's reasons that are no grade (its worker timed out or failed), reported as ``rule_error``.
_MATH_FAILURES = ("timeout", "error")


def load_rule_function(path: str) -> Callable[..., Any]:
    """The callable ``path`` names: ``"module:name"`` (see :func:`~r3_rllib.core.objects.load_object`) or
    ``"file.py:name"`` (the file is imported as a module of its own). An
    :class:`~r3_rllib.core.objects.ObjectPathError` (a ``ValueError``) when it names nothing callable."""
    module_part, _, attr = path.rpartition(":")
    if module_part.endswith(".py"):
        fn = _load_from_file(Path(module_part), attr, path)
    else:
        fn = load_object(path, what="rule reward")
    if not callable(fn):
        raise ObjectPathError(f"rule reward {path!r} is a {type(fn).__name__}, not a function")
    return fn


def _load_from_file(file: Path, attr: str, path: str) -> Any:
    """Attribute ``attr`` of the Python file ``file``, imported under a name derived from its absolute path (two
    files of one basename do not collide)."""
    if not file.is_file():
        raise ObjectPathError(f"rule reward {path!r}: no Python file at {file}")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(f"_r3_rule_{file.stem}_{digest}", file)
    if module_spec is None or module_spec.loader is None:
        raise ObjectPathError(f"rule reward {path!r}: cannot import {file}")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ObjectPathError(
            f"rule reward {path!r}: importing {file} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, attr):
        raise ObjectPathError(f"rule reward {path!r}: {file} has no attribute {attr!r}")
    return getattr(module, attr)


def rule_value(value: Any) -> float | None:
    """A rule function's return value as a finite float (a bool as 1.0 or 0.0, a numpy scalar or 0-d tensor as its
    value); None for anything else."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class RuleScorer:
    """Grades each response with the spec's ``function`` (module docstring); a
    :class:`~r3_rllib.rewards.scoring.RewardScorer`."""

    def __init__(self, spec: RewardModelSpec) -> None:
        if not spec.function:
            raise ValueError(f"reward term {spec.name!r} (type rule) needs function: 'module:name' or 'math'")
        self.name = spec.name
        self.function = spec.function
        self._fn = None if spec.function == MATH_FUNCTION else load_rule_function(spec.function)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardScore]:
        """One score per request, in order."""
        if self._fn is None:
            return self._score_math(requests)
        return [self._score_one(request) for request in requests]

    def _score_one(self, request: RewardRequest) -> RewardScore:
        try:
            value = self._fn(request.prompt_text, request.response_text, request.gold)  # type: ignore[misc]
        except Exception as exc:  # a user's function must not stop the run: reason and count instead
            logger.debug("rule reward %s raised %s: %s", self.function, type(exc).__name__, exc)
            return RewardScore(0.0, "rule_error")
        number = rule_value(value)
        return RewardScore(0.0, "rule_bad_value") if number is None else RewardScore(number)

    def _score_math(self, requests: Sequence[RewardRequest]) -> list[RewardScore]:
        """The math grader on the requests that have a gold answer (one batch to its worker)."""
        from r3_rllib.rewards.math_grader import shared_grader

        graded = [i for i, r in enumerate(requests) if r.gold is not None]
        results = shared_grader().grade_many([(requests[i].response_text, requests[i].gold) for i in graded])
        scores = [RewardScore(0.0, "rule_no_gold") for _ in requests]
        for i, result in zip(graded, results, strict=True):
            failed = result.reason in _MATH_FAILURES
            scores[i] = RewardScore(0.0, "rule_error") if failed else RewardScore(float(result.correct))
        return scores
