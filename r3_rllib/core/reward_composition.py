"""The composed reward of one response: the env's reward and the reward terms' scores in one number (pure, no Ray).

``reward = env_reward_weight * env_reward + sum(weight_i * score_i)`` over the terms that are not gates. A gate term
(e.g. "format first") adds nothing to the sum: when its score is below its threshold the reward is the gate's
``gate_reward`` whatever the other terms say; when several gates fail, the first failing one (in the config's order)
gives the reward.

A term that could not grade the response (a judge that timed out, raised or returned an unparsable verdict: its
``reason`` is set) scores 0, as :class:`~r3_rllib.rewards.scoring.RewardScore` says: it adds nothing to the sum, and
a failed gate term counts as below its threshold only when 0 is (the score is 0 either way). The failure is not
hidden: the reward server counts it per reason and writes the reason on the sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """How one reward term enters the composition (the composition's view of a ``RewardModelSpec``)."""

    name: str
    weight: float = 1.0
    gate: bool = False
    gate_threshold: float = 0.5
    gate_reward: float = 0.0


def term_value(value: float, reason: str | None) -> float:
    """The value a term's score contributes: 0 for a failed score (``reason`` set) or a non-finite one, else the
    value."""
    if reason is not None or not math.isfinite(value):
        return 0.0
    return float(value)


def compose_reward(
    env_reward: float,
    terms: Sequence[Term],
    values: Sequence[float],
    env_reward_weight: float = 1.0,
) -> float:
    """The composed reward of one response: ``values[i]`` is term i's score (0 for a failed one: see
    :func:`term_value`). A gate below its threshold gives its ``gate_reward``; else the weighted sum (see the module
    docstring)."""
    if len(values) != len(terms):
        raise ValueError(f"{len(values)} scores for {len(terms)} reward terms")
    total = env_reward_weight * float(env_reward)
    for term, value in zip(terms, values, strict=True):
        if term.gate:
            if value < term.gate_threshold:
                return float(term.gate_reward)
            continue
        total += term.weight * float(value)
    return total
