"""Reward terms beyond the env's rule grader: scalar reward models, generative judges (one response at a time, or a
whole group at once), rule functions, all behind :class:`~r3_rllib.rewards.scoring.RewardScorer`; and the reward
server, a Ray actor pool the driver grades each rollout with (:mod:`r3_rllib.reward_models.server`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from r3_rllib.reward_models.specs import SCORER_TYPES, RewardModelSpec

if TYPE_CHECKING:
    from r3_rllib.rewards.scoring import GroupRewardScorer, RewardScorer

#: The scorer class of each spec type, as ``(module, class)``: imported on first use, so a config with only rule
#: terms never imports transformers or vLLM.
SCORER_CLASSES = {
    "rule": ("r3_rllib.reward_models.rule", "RuleScorer"),
    "scalar": ("r3_rllib.reward_models.scalar", "ScalarRewardModel"),
    "judge": ("r3_rllib.reward_models.judge", "GenerativeJudge"),
    "group_judge": ("r3_rllib.reward_models.group_judge", "GroupJudge"),
}


def build_scorer(spec: RewardModelSpec) -> RewardScorer | GroupRewardScorer:
    """The scorer of ``spec``: its ``scorer_class`` when it names one, else its type's class, built from the spec
    (a ``group_judge`` scores whole groups)."""
    if spec.scorer_class is not None:
        module, _, cls = spec.scorer_class.partition(":")
    elif spec.type in SCORER_CLASSES:
        module, cls = SCORER_CLASSES[spec.type]
    else:
        raise ValueError(
            f"reward term {spec.name!r}: unknown type {spec.type!r}; one of {list(SCORER_TYPES)}"
        )
    return getattr(importlib.import_module(module), cls)(spec)
