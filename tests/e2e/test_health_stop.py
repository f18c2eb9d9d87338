"""Health checks in a real run: a loss that turns NaN stops ``algo.train()`` with a message naming the metric, the
iteration and the last checkpoint saved, and the learner's weights are those from before (the step was skipped).
(A healthy run's health/* metrics, without a false alarm: tests/e2e/test_algorithm.py's first test.)"""

from __future__ import annotations

import os

import pytest

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import learner as learner_module
from r3_rllib.core.health import NonFiniteTrainingError

pytestmark = pytest.mark.slow


def test_a_nan_loss_stops_training_naming_the_iteration_and_the_last_checkpoint(
    ray_session, tiny_random_model, tmp_path, monkeypatch
):
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 32, "seed": 0})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)  # the learner runs in this process: the patched objective below is its own
        .r3(ranking=True, ranking_start_epoch=0)  # ranking rewards: even the random policy's groups train
        .training(
            model_path=tiny_random_model, group_size=4, queries_per_iteration=4, max_new_tokens=4, lr=1e-3
        )
    )
    algo = config.build_algo()
    try:
        first = algo.train()
        assert first["health"]["nonfinite"] == 0.0 and first["learner"]["nonfinite_grad_steps"] == 0.0
        saved = os.path.abspath(str(tmp_path / "checkpoint"))
        algo.save(saved)
        weights = algo.learner_call(lambda learner: learner.parameter_checksum())[0]

        objective = learner_module.rl_objective

        def nan_loss(*args, **kwargs):
            loss, metrics = objective(*args, **kwargs)
            return loss * float("nan"), metrics

        monkeypatch.setattr(learner_module, "rl_objective", nan_loss)
        with pytest.raises(NonFiniteTrainingError) as err:
            algo.train()
        message = str(err.value)
        assert message.startswith("training stopped at iteration 2: NaN/inf in the loss or gradients")
        assert "learner/loss is nan" in message
        assert f"the last good checkpoint is {saved} (iteration 1)" in message
        # Exact: the NaN gradient's step was skipped, so the weights are bit for bit those of iteration 1.
        assert algo.learner_call(lambda learner: learner.parameter_checksum())[0] == weights
        # The runner's weight load (it runs while the driver logs the iteration) was collected although the health
        # check raised: a load left in flight would refuse the next rollout request. The run goes on.
        assert algo.env_runner_group.num_in_flight_async_reqs() == 0
        monkeypatch.undo()
        assert algo.train()["learner"]["trained_tokens"] > 0
    finally:
        algo.stop()
