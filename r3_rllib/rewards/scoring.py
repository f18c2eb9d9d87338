"""Rewards beyond the env's rule grader: what a reward scorer (a rule function, a scalar reward model, a generative
judge, a group judge) is given and what it returns.

A scorer grades responses the EnvRunners sampled, on the driver's reward server (``r3_rllib.reward_models.server``),
after the env has graded them: each :class:`RewardRequest` carries the prompt, the response and the env's own
grade; the scorer returns one :class:`RewardScore` per request, in order. A scorer that cannot grade a response
(a judge whose verdict does not parse, a model that raised) says so in :attr:`RewardScore.reason` with value 0:
the server counts reasons and never lets one response stop the run. The server combines the scores with the env's
reward by the config's composition (``r3_rllib.core.reward_composition``).

Group scorers (:class:`GroupRewardScorer`, RULER-style judges) see all the responses to one prompt at once and
return scores relative to each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class RewardRequest:
    """One sampled response to grade."""

    query_id: str
    prompt_text: str
    """The prompt as the policy saw it (chat template applied, when the env applies one)."""
    response_text: str
    env_reward: float
    """The env's reward of the response (its rule grader's)."""
    env_correct: bool
    """The env's verdict on the response (what R^3's replay and the accuracy metrics read)."""
    gold: str | None = None
    """The reference answer when the env exposes one (a judge may show it in its rubric); None otherwise."""


@dataclass(frozen=True)
class RewardScore:
    """A scorer's grade of one response: ``value`` (finite), and ``reason`` None when graded normally, else why the
    scorer gave no grade (then ``value`` is 0): e.g. ``"judge_unparsable"``, ``"judge_error"``, ``"timeout"``."""

    value: float
    reason: str | None = None


@runtime_checkable
class RewardScorer(Protocol):
    """Grades responses one by one (batched for speed, independently in meaning)."""

    name: str

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardScore]:
        """One score per request, in order."""


@runtime_checkable
class GroupRewardScorer(Protocol):
    """Grades the responses to one prompt relative to each other (a group judge)."""

    name: str

    def score_groups(self, groups: Sequence[Sequence[RewardRequest]]) -> list[list[RewardScore]]:
        """For each group (the responses to one prompt), one score per response, in order."""
