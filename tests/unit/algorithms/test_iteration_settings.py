"""IterationSettings: the one frozen view of the config an iteration uses."""

import dataclasses

import pytest

from r3_rllib.algorithms.r3.config import R3Config
from r3_rllib.algorithms.r3.iteration_settings import iteration_settings


def test_parts_switch_on_at_their_start_epochs_with_the_estimators_declared_params():
    cfg = R3Config.r3_preset().r3(replay_start_epoch=1, reflection_start_epoch=2, ranking_start_epoch=0)
    first = iteration_settings(cfg, dataset_epoch=0, policy_version=5)
    assert first.active_parts == ("ranking",) and first.reflection is None
    second = iteration_settings(cfg, dataset_epoch=2, policy_version=7)
    assert second.active_parts == ("replay", "reflection", "ranking")
    assert second.reflection.policy_version == 7 and second.reflection.tau == cfg.reflection_tau
    # the estimator's parameters are the config fields it registered, nothing else
    assert second.advantage_estimator == cfg.advantage_estimator == "mixed"
    assert second.advantage_params == {"alpha": cfg.adv_alpha, "lam": cfg.adv_lambda}
    assert second.keep_zero_advantage == (cfg.kl_coef > 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.replay = False  # type: ignore[misc]


def test_switched_off_parts_stay_off_in_every_epoch():
    cfg = R3Config.grpo_preset()
    late = iteration_settings(cfg, dataset_epoch=10, policy_version=0)
    assert late.active_parts == () and late.advantage_params == {"eps": cfg.adv_eps, "ddof": cfg.adv_std_ddof}


def test_batch_step_of_the_estimator_and_under_r2po_stages():
    from r3_rllib.r2po.method import STAGE_B_ESTIMATOR, stage_settings
    from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE

    name = "reinforce_plus_plus_baseline"
    cfg = R3Config.grpo_preset().training(advantage_estimator=name)
    s = iteration_settings(cfg, dataset_epoch=0, policy_version=0)
    assert (s.advantage_estimator, s.advantage_params) == (name, {})
    assert s.batch_step == name and s.batch_step_params == {}
    assert iteration_settings(R3Config.grpo_preset(), dataset_epoch=0, policy_version=0).batch_step is None
    # R^2PO: stage B wraps the estimator and keeps its batch step; stage A's head estimator ('rarity') has none.
    b = stage_settings(s, BASE_STAGE, cfg)
    assert b.advantage_estimator == STAGE_B_ESTIMATOR and b.batch_step == name
    a = stage_settings(s, HEAD_STAGE, cfg)
    assert a.advantage_estimator == cfg.rollout_head_advantage and a.batch_step is None
