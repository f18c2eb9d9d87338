"""ranking_source: R^3's ranking of an all-wrong group by a group judge's scores ('judge') or the mean with the
structural entropy ranking ('both'), by hand-computed numbers; and the config's refusals."""

from dataclasses import replace

import numpy as np
import pytest

from r3_rllib.algorithms.r3.groups import assemble_training_batch, build_training_batch, ranking_rewards
from r3_rllib.config.rules import ranking_source_has_a_judge
from r3_rllib.core.iteration import IterationSettings
from r3_rllib.types.samples import Group, Sample

# p = 0.25 over 4 tokens: E_peak is the largest entropy, E_global the mean.
# A (peak 2, mean 0.5) dominates B (1, 1) and C (1.5, 1.5); B and C are incomparable: S = [2, 0, 0].
# Ranks of 3 with r_max 0.5: A rank 0 -> 0.5; B and C share ranks 1 and 2 -> 0.5 * (1 - 1.5 / 2) = 0.125.
ENTROPIES = [(2.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0), (1.5, 1.5, 1.5, 1.5)]
ENTROPY_REWARDS = [0.5, 0.125, 0.125]
# The judge's scores order B (0.9) > C (0.5) > A (0.1): rewards 0.5, 0.25, 0 -> per sample [0, 0.5, 0.25].
JUDGE = [0.1, 0.9, 0.5]
JUDGE_REWARDS = [0.0, 0.5, 0.25]
BOTH_REWARDS = [0.25, 0.3125, 0.1875]  # the mean of the two
SETTINGS = IterationSettings(
    ranking=True, ranking_p=0.25, ranking_r_max=0.5, advantage_estimator="grpo", advantage_params={"eps": 0.0}
)


def _group(qid="q", judge=None, weight=0.0, entropies=ENTROPIES):
    samples = [
        Sample(
            query_id=qid,
            prompt_ids=[1, 2],
            response_ids=[3, 4, 5, 6],
            behavior_logprobs=np.zeros(4, np.float32),
            entropies=np.asarray(h, np.float32),
            reward=0.0,
            correct=False,
            truncated=False,
            policy_version=0,
        )
        for h in entropies
    ]
    return Group(qid, samples, judge_scores=judge, judge_rank_weight=weight)


def test_entropy_ranking_is_unchanged_without_judge_scores():
    np.testing.assert_allclose(ranking_rewards(_group(), p=0.25, r_max=0.5), ENTROPY_REWARDS)
    # a weight without scores is no judge ranking
    np.testing.assert_allclose(ranking_rewards(_group(weight=1.0), p=0.25, r_max=0.5), ENTROPY_REWARDS)


def test_judge_ranking_uses_the_rank_mapping_and_ties_share():
    np.testing.assert_allclose(
        ranking_rewards(_group(judge=JUDGE, weight=1.0), p=0.25, r_max=0.5), JUDGE_REWARDS
    )
    # a tie at the top shares ranks 0 and 1: 0.5 * (1 - 0.5 / 2) = 0.375 each, the last 0
    tied = ranking_rewards(_group(judge=[0.9, 0.9, 0.1], weight=1.0), p=0.25, r_max=0.5)
    np.testing.assert_allclose(tied, [0.375, 0.375, 0.0])


def test_both_is_the_mean_of_the_two_rankings():
    np.testing.assert_allclose(
        ranking_rewards(_group(judge=JUDGE, weight=0.5), p=0.25, r_max=0.5), BOTH_REWARDS
    )


@pytest.mark.parametrize(
    ("weight", "expected"), [(1.0, JUDGE_REWARDS), (0.5, BOTH_REWARDS), (0.0, ENTROPY_REWARDS)]
)
def test_the_batch_trains_on_the_judge_ranking(weight, expected):
    batch, metrics = build_training_batch([_group(judge=JUDGE, weight=weight)], SETTINGS)
    assert metrics["ranked_groups"] == 1.0
    np.testing.assert_allclose([s.reward for s in batch], expected)
    r = np.asarray(expected)
    np.testing.assert_allclose([s.advantage for s in batch], (r - r.mean()) / r.std(), rtol=1e-6)
    assert [s.env_reward for s in batch] == [0.0] * 3


def test_judged_groups_are_ranked_on_the_driver_when_the_ranking_is_deferred():
    judged, plain = _group("j", judge=JUDGE, weight=1.0), _group("e")
    batch, _, deferred = assemble_training_batch([judged, plain], SETTINGS, defer_ranking=True)
    assert [g.query_id for _, g, _ in deferred] == ["e"]  # the learner ranks the other by its entropies
    np.testing.assert_allclose([s.reward for s in batch if s.query_id == "j"], JUDGE_REWARDS)


def test_a_correct_group_is_not_ranked_whatever_the_judge_says():
    g = _group(judge=JUDGE, weight=1.0)
    g = replace(
        g, samples=[replace(s, correct=i == 0, reward=float(i == 0)) for i, s in enumerate(g.samples)]
    )
    batch, metrics = build_training_batch([g], SETTINGS)
    assert metrics["ranked_groups"] == 0.0 and [s.reward for s in batch] == [1.0, 0.0, 0.0]


class _Config:
    ranking = True
    ranking_source = "judge"
    reward_models = [{"name": "rank", "type": "group_judge", "model": "m"}]
    ranking_entropy_source = "auto"
    engine = "hf"

    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"ranking": False}, "needs ranking=True"),
        ({"reward_models": None}, "needs a reward_models term of type 'group_judge'"),
        ({"reward_models": [{"name": "j", "type": "judge", "model": "m"}]}, "of type 'group_judge'"),
        ({"ranking_source": "both", "engine": "vllm"}, "ranking_source 'both' mixes"),
        (
            {"ranking_source": "both", "ranking_entropy_source": "learner"},
            "set ranking_entropy_source 'engine'",
        ),
    ],
)
def test_combinations_that_cannot_work_are_refused(kw, message):
    assert message in ranking_source_has_a_judge(_Config(**kw))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"engine": "vllm"},  # 'judge' with the learners' entropies: judged groups are ranked on the driver
        {"ranking_source": "both"},
        {"ranking_source": "both", "engine": "vllm", "ranking_entropy_source": "engine"},
        {"ranking_source": "entropy", "ranking": False, "reward_models": None},
    ],
)
def test_combinations_that_work_are_accepted(kw):
    assert ranking_source_has_a_judge(_Config(**kw)) is None
