"""TRL's mask_truncated_completions: the responses that hit max_new_tokens leave the update after they counted in
their groups' advantages (core/reward_shaping.without_truncated, R3._build_batch), and the combination that would
rank on a part of a group's failures is refused (config/rules.py)."""

from __future__ import annotations

import pytest
from random_samples import graded_sample

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.iteration_settings import iteration_settings
from r3_rllib.algorithms.r3.r3 import R3
from r3_rllib.core.reward_shaping import without_truncated
from r3_rllib.types.samples import Group, Sample


def _group(qid: str, rewards: list[float], truncated: list[bool]) -> Group:
    samples = [graded_sample(qid, r, truncated=t) for r, t in zip(rewards, truncated, strict=True)]
    return Group(query_id=qid, samples=samples)


def _batch(mask: bool) -> tuple[list[Sample], dict]:
    algo = object.__new__(R3)  # the batch step alone: no runners, learners or replay
    algo.config = R3Config.grpo_preset().training(group_size=4, mask_truncated_completions=mask)
    algo._replay = None
    algo._reward_kl = None  # use_kl_in_reward off (R3.setup)
    groups = [
        _group("a", [1.0, 0.0, 0.0, 1.0], [False, True, False, True]),
        _group("b", [0.0, 1.0, 0.0, 0.0], [False] * 4),
    ]
    settings = iteration_settings(algo.config, dataset_epoch=0, policy_version=0)
    return R3._build_batch(algo, groups, settings)


def test_truncated_responses_leave_the_batch_after_shaping_their_groups_advantages():
    full, full_metrics = _batch(mask=False)
    kept, metrics = _batch(mask=True)
    assert "truncated_masked" not in full_metrics and metrics["truncated_masked"] == 2
    assert [s.truncated for s in full].count(True) == 2 and not any(s.truncated for s in kept)
    # The kept responses' advantages are the ones the whole groups gave them (group a's mean and std include the
    # two truncated responses: rewards 1, 0, 0, 1).
    expected = [s.advantage for s in full if not s.truncated]
    assert [s.advantage for s in kept] == expected
    assert expected[0] == pytest.approx(-expected[1]) and expected[0] > 0


def test_without_truncated_by_hand():
    samples = _group("a", [1.0, 0.0, 1.0], [True, False, False]).samples
    kept, dropped = without_truncated(samples)
    assert kept == samples[1:] and dropped == 1
    assert without_truncated([]) == ([], 0)


def test_ranking_on_the_learners_entropies_is_refused_with_the_mask():
    with pytest.raises(
        ValueError, match="mask_truncated_completions with ranking on the learners' entropies"
    ):
        R3Config.r3_preset().training(mask_truncated_completions=True, engine="vllm").validate()
    R3Config.r3_preset().training(
        mask_truncated_completions=True, engine="vllm", ranking_entropy_source="engine"
    ).validate()
    R3Config.r3_preset().training(
        mask_truncated_completions=True
    ).validate()  # hf: exact entropies on the driver
