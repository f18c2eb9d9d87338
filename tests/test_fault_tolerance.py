"""A crashed EnvRunner: the iteration goes on with the others, RLlib restarts it, and it gets the current weights."""

from __future__ import annotations

import time

import pytest
import ray

from r3_rllib import R3Config

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_killed_runner_is_restarted_with_current_weights(ray_session, tiny_random_model, overlap):
    """With overlap_generation the runner dies with a rollout request in flight: that request is dropped, the
    survivor's half of the batch is trained on."""
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
        .learners(num_learners=0)
        .r3(ranking=True, ranking_start_epoch=0)
        .training(
            model_path=tiny_random_model,
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=4,
            lr=1e-3,
            overlap_generation=overlap,
        )
    )
    algo = config.build_algo()
    try:
        algo.train()
        algo.train()
        victim = algo.env_runner_group._worker_manager._actors[2]
        ray.kill(victim, no_restart=False)  # Ray restarts the actor process; RLlib marks it unhealthy
        result = algo.train()  # this iteration is sampled by the surviving runner alone
        assert result["training_iteration"] == 3
        assert result["rollout"]["runners_failed"] == 1
        restored = []
        for _ in range(120):  # the restarted actor needs a few seconds to load its engine
            restored = algo.restore_env_runners(algo.env_runner_group)
            if restored:
                break
            time.sleep(0.5)
        assert restored == [2]
        # Right after the restore, before any new update, the restarted runner holds the learner's weights.
        versions = algo.env_runner_group.foreach_env_runner(
            lambda r: r.engine.version, local_env_runner=False
        )
        learner_version = algo.learner_call(lambda lr: lr._policy_version)[0]
        assert learner_version >= 1 and versions == [learner_version, learner_version]
        assert algo.train()["rollout"]["runners_failed"] == 0
    finally:
        algo.stop()
