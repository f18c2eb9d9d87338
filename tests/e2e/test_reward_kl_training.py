"""verl's KL penalty in the reward end to end (use_kl_in_reward, the adaptive controller): one runner and one
local learner train on the tiny arithmetic model; current_kl and beta are logged, beta moves as the controller's
formula says from the logged current_kl, and a checkpoint brings beta back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow

QUERIES, GROUP = 4, 4
TARGET_KL, HORIZON = 1e-4, 64


def _next_beta(beta: float, current_kl: float) -> float:
    """verl's AdaptiveKLController step for a batch of QUERIES x GROUP rows (no replay, no reflection)."""
    error = float(np.clip(current_kl / TARGET_KL - 1.0, -0.2, 0.2))
    return beta * (1.0 + error * QUERIES * GROUP / HORIZON)


def test_adaptive_beta_follows_the_logged_kl_and_survives_a_restore(ray_session, tiny_random_model, tmp_path):
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 200, "seed": 0})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        # Ranking rewards: the untrained policy's groups are all wrong, and train only with them.
        .r3(ranking=True, ranking_start_epoch=0)
        .training(
            model_path=tiny_random_model,
            group_size=GROUP,
            queries_per_iteration=QUERIES,
            max_new_tokens=4,
            lr=1e-2,
            micro_batch_size=32,
            use_kl_in_reward=True,
            kl_ctrl_type="adaptive",
            kl_ctrl_coef=0.05,
            kl_ctrl_target_kl=TARGET_KL,
            kl_ctrl_horizon=HORIZON,
        )
        .debugging(seed=3)
    )
    algo = config.build_algo()
    try:
        first = algo.train()["r3"]
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        second = algo.train()["r3"]
        after_second = algo._reward_kl.coef
        algo.restore(checkpoint)
        restored = algo._reward_kl.coef
    finally:
        algo.stop()
    kls = [first["reward_kl_penalty"], second["reward_kl_penalty"]]
    assert all(math.isfinite(k) for k in kls)
    # The first rollout's policy is the reference (no update yet): no KL, up to the two forwards' rounding.
    assert kls[0] == pytest.approx(0.0, abs=1e-5)
    assert kls[1] > 0.0  # one update of lr 1e-2 moved the policy
    assert first["reward_kl_coef"] == 0.05
    assert second["reward_kl_coef"] == pytest.approx(_next_beta(0.05, kls[0]), rel=1e-12)
    assert after_second == pytest.approx(_next_beta(second["reward_kl_coef"], kls[1]), rel=1e-12)
    # The checkpoint was saved after the first iteration: its beta is the one the second iteration used.
    assert restored == second["reward_kl_coef"] != after_second
