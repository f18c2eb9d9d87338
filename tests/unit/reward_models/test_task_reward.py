"""What the reward server's composition leaves on a sample: the replay buffer keeps the composed task reward (a
replayed sample is on the scale of the fresh ones of its group), not the env's alone nor a ranking reward; requests
carry the group's reference answer."""

from __future__ import annotations

import dataclasses

import numpy as np

from r3_rllib.core.reward_composition import Term
from r3_rllib.reward_models.server import RewardServer, requests_of
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.types.samples import Group, Sample


def _sample(reward: float) -> Sample:
    return Sample(
        query_id="q",
        prompt_ids=[1],
        response_ids=[2],
        behavior_logprobs=np.zeros(1, np.float32),
        entropies=np.zeros(1, np.float32),
        reward=reward,
        correct=reward > 0,
        truncated=False,
        policy_version=0,
        response_text="7",
    )


def test_replay_keeps_the_task_reward_not_the_ranking_one():
    fresh = _sample(1.0)
    assert fresh.env_reward == fresh.task_reward == 1.0 and fresh.to_replay().reward == 1.0
    composed = dataclasses.replace(fresh, reward=1.3, task_reward=1.3)  # the reward server's composition
    ranked = dataclasses.replace(composed, reward=0.25)  # a ranking reward within one batch
    assert ranked.env_reward == 1.0 and ranked.to_replay().reward == 1.3
    assert Sample.from_replay(ranked.to_replay()).reward == 1.3


def test_compose_sets_reward_and_task_reward_and_keeps_the_env_reward():
    server = object.__new__(RewardServer)  # the composition only: no workers
    server.terms = [Term("rm", 0.5, False, 0.5, 0.0)]
    server.env_reward_weight = 1.0
    out = server._compose(_sample(1.0), [(0.4, None)])
    assert out.reward == out.task_reward == 1.2 and out.env_reward == 1.0 and out.reward_parts == {"rm": 0.4}


def test_requests_carry_the_groups_reference_answer():
    group = Group(query_id="q", samples=[_sample(0.0), _sample(1.0)], prompt_text="3+4=", gold="7")
    requests = requests_of(group)
    assert [r.gold for r in requests] == ["7", "7"] and requests[0].prompt_text == "3+4="
    assert RewardModelSpec(name="x", type="rule").gate is False
