"""Combinations of options where one of them could never act (ranking after DAPO's accuracy filter, the task
reward's parts with distillation's task reward off): refused with a message naming the options and why; the
neighbouring combinations that do act stay accepted."""

from __future__ import annotations

import pytest

from r3_rllib import R3Config

TEACHER = "some/teacher"


def _errors(config: R3Config) -> str:
    with pytest.raises(ValueError) as info:
        config.validate()
    return str(info.value)


def test_ranking_with_dynamic_sampling_on_accuracy_is_refused():
    """DAPO's filter on accuracy drops every all-wrong group before the driver ranks the batch: with DAPO's preset
    and ranking on, a run ranked no group (r3/ranked_groups 0 each iteration) and said nothing."""
    message = _errors(R3Config.dapo_preset().r3(ranking=True))
    assert "ranking with dynamic_sampling (dynamic_sampling_metric='accuracy')" in message
    assert "drops the all-wrong groups that ranking rewards" in message


@pytest.mark.parametrize(
    "config",
    [
        R3Config.dapo_preset().r3(ranking=True).training(dynamic_sampling_metric="reward"),
        R3Config.dapo_preset(),
        R3Config().r3(ranking=True),
    ],
    ids=["filter-on-reward", "no-ranking", "no-dynamic-sampling"],
)
def test_ranking_and_dynamic_sampling_that_can_act_are_accepted(config):
    config.validate()


@pytest.mark.parametrize(
    ("training", "named"),
    [
        ({"replay": True}, "replay with distill_task_reward=False"),
        ({"ranking": True}, "ranking with distill_task_reward=False"),
        ({"replay": True, "ranking": True}, "replay, ranking with distill_task_reward=False"),
        ({"overlong_shaping": True}, "overlong_shaping with distill_task_reward=False"),
    ],
)
def test_task_reward_parts_without_the_task_reward_are_refused(training, named):
    """distill_task_reward=False zeroes the task advantages: a run with ranking on ranked every group and trained
    a policy loss of exactly 0, the ranking rewards unused."""
    config = R3Config().training(distill_teacher=TEACHER, distill_task_reward=False, **training)
    message = _errors(config)
    assert named in message
    assert "the task advantages are zeroed" in message and "set distill_task_reward=True" in message


@pytest.mark.parametrize(
    "training",
    [
        {"distill_task_reward": True, "replay": True, "ranking": True, "overlong_shaping": True},
        {"distill_task_reward": False, "reflection": True},  # reflection groups are distilled too
        {"distill_task_reward": False, "dynamic_sampling": True},  # the filter chooses the groups distilled
        # The overlong penalty shapes the rewards the filter reads on 'reward', and stage A's rarity counts.
        {
            "distill_task_reward": False,
            "overlong_shaping": True,
            "dynamic_sampling": True,
            "dynamic_sampling_metric": "reward",
        },
        {"distill_task_reward": False, "overlong_shaping": True, "rollout_head": True},
    ],
    ids=["task-reward-on", "reflection", "dynamic-sampling", "filter-on-reward", "r2po"],
)
def test_distillation_alone_with_parts_that_still_act_is_accepted(training):
    R3Config().training(distill_teacher=TEACHER, **training).validate()


@pytest.mark.parametrize("field", ["env_config", "eval_env_config"])
@pytest.mark.parametrize("seed", ["abc", "3", 1.5, True])
def test_an_env_seed_that_is_not_an_integer_is_refused(field, seed):
    """Each runner adds its offset to the env's seed: a string failed in every EnvRunner with a bare TypeError."""
    config = R3Config().environment("arithmetic")
    setattr(config, field, {"seed": seed})
    assert f"{field}['seed'] must be an integer" in _errors(config)


def test_an_integer_env_seed_is_accepted():
    R3Config().environment("arithmetic", env_config={"seed": 7}).validate()
