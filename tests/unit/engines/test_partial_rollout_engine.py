"""Partial rollouts in the HF engine: weights loaded between decoding steps, the same responses going on, every token
tagged with the version that sampled it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from engine_hooks import load_weights_at_first_hook
from numeric import TORCH_THREADS, forward_atol

from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer
from r3_rllib.rollout.kinds.base import oldest_version

PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, stop_token_ids=())


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _engine(tok, seed: int) -> HFEngine:
    torch.set_num_threads(TORCH_THREADS)
    return HFEngine(build_tiny_model(tok, seed=seed), tok, eos_token_ids=[tok.vocab_size + 99])


def test_same_weights_under_a_new_version_leave_the_responses_unchanged(tok):
    """A version bump with the same weights between steps 4 and 5: tokens and log-probs equal the plain run's, the
    first 4 tokens are tagged 0 and the rest 3 (the update is taken mid-response, the response goes on)."""
    prompts = [tok.encode("12+34="), tok.encode("7+8=")]
    plain = _engine(tok, seed=1).generate(prompts, 2, PARAMS)
    engine = _engine(tok, seed=1)
    calls = load_weights_at_first_hook(engine, copy.deepcopy(engine.model.state_dict()), version=3)
    partial = engine.generate(prompts, 2, PARAMS)
    assert calls[:2] == [0, 3]  # the hook ran every 4 steps, and saw the new version after the first time
    for a, b in zip(sum(plain, []), sum(partial, []), strict=True):
        assert a.token_ids == b.token_ids
        # The same weights and shapes in two engines: not bit-identical by construction (GEMM kernels may pick their
        # path by the buffers' alignment): FORWARD_ULPS of the scale (tests/numeric.py).
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=forward_atol(a.logprobs))
        assert a.token_versions.tolist() == [0] * 12
        assert b.token_versions.tolist() == [0] * 4 + [3] * 8
        assert oldest_version(b.token_versions, call_version=3) == 0


def test_new_weights_between_steps_change_only_the_tokens_after_the_update(tok):
    """Different weights loaded after step 4: the first 4 tokens are the old policy's sample (same seed), the tokens
    after are sampled from the new weights (their log-probs differ from the old run's)."""
    prompts = [tok.encode("99+1=")]
    old = _engine(tok, seed=1).generate(prompts, 4, PARAMS)[0]
    engine = _engine(tok, seed=1)
    new_state = {k: v.clone() for k, v in build_tiny_model(tok, seed=2).state_dict().items()}
    load_weights_at_first_hook(engine, new_state, version=1)
    partial = engine.generate(prompts, 4, PARAMS)[0]
    for a, b in zip(old, partial, strict=True):
        assert a.token_ids[:4] == b.token_ids[:4]
        np.testing.assert_allclose(a.logprobs[:4], b.logprobs[:4], rtol=0, atol=forward_atol(a.logprobs[:4]))
        assert b.token_versions.tolist() == [0] * 4 + [1] * 8
    after = np.concatenate([b.logprobs[4:] for b in partial])
    before_swap_policy = np.concatenate([a.logprobs[4:] for a in old])
    assert not np.allclose(after, before_swap_policy, atol=1e-3)
