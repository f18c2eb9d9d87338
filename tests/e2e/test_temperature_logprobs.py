"""Behaviour log-probs and the learner's recomputed ones are taken under the same tempered distribution.

Rollouts sample from softmax(logits / T); the engines report log-probs of that distribution (before top-k/top-p)
and the learner divides its logits by the same T. With no update in between, the learner's recomputed log-probs
then equal the engine's, so the truncated importance weight is exactly 1 and only real policy lag moves it.
"""

from __future__ import annotations

import importlib.util
import math
import warnings

import numpy as np
import pytest
import torch
from numeric import EPS32, engine_atol, forward_atol

from r3_rllib.algorithms.r3.rl_module import pack_samples
from r3_rllib.core.logprobs import token_logprobs
from r3_rllib.core.losses import truncated_importance_weights
from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.models import default_tiny_model_path, load_tiny
from r3_rllib.types.samples import Sample

HAS_VLLM = importlib.util.find_spec("vllm") is not None
PROMPTS = ["12+34=", "57+38=", "90+19=", "1+2 is ", "x"]
T = 0.6  # the paper config's rollout temperature


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def shipped():
    return load_tiny(default_tiny_model_path())


def _samples(groups) -> list[Sample]:
    return [
        Sample(
            query_id=str(i),
            prompt_ids=list(c.prompt_ids),
            response_ids=list(c.token_ids),
            behavior_logprobs=c.logprobs,
            entropies=c.entropies,
            reward=0.0,
            correct=False,
            truncated=c.truncated,
            policy_version=0,
        )
        for i, group in enumerate(groups)
        for c in group
    ]


def _learner_scores(model, samples, temperature: float):
    """The learner's recomputation: the same packing and scoring pass as R3Learner, on the rollout model."""
    packed = pack_samples(samples, pad_id=0, device="cpu")
    with torch.no_grad():
        logp, entropy = token_logprobs(
            model,
            packed["input_ids"],
            packed["attention_mask"],
            response_mask=packed["response_mask"],
            temperature=temperature,
            with_entropy=True,
        )
    return packed, logp, entropy


def _engine_rows(packed, samples, field: str) -> torch.Tensor:
    out = torch.zeros_like(packed["behavior_logprobs"])
    for b, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        out[b, start : start + len(s.response_ids)] = torch.from_numpy(np.asarray(getattr(s, field)))
    return out


def _assert_same_distribution(logp, entropy, packed, samples, tolerance) -> None:
    """The learner's log-probs and entropies equal the engine's to `tolerance(compared values)`, and the truncated
    importance weight exp(logp - behaviour) is 1 to what that allows: |e^x - 1| <= |x| e^|x|, plus a float32 ulp of
    1 for the exp's rounding."""
    mask = packed["response_mask"]
    behaviour = packed["behavior_logprobs"][mask]
    lp_tol = tolerance(logp[mask], behaviour)
    torch.testing.assert_close(logp[mask], behaviour, atol=lp_tol, rtol=0)
    engine_entropy = _engine_rows(packed, samples, "entropies")[mask]
    torch.testing.assert_close(
        entropy[mask], engine_entropy, atol=tolerance(entropy[mask], engine_entropy), rtol=0
    )
    is_w = truncated_importance_weights(logp, packed["behavior_logprobs"], 2.0)[mask]
    torch.testing.assert_close(is_w, torch.ones_like(is_w), atol=lp_tol * math.exp(lp_tol) + EPS32, rtol=0)


@pytest.mark.parametrize("top_p, top_k", [(1.0, -1), (0.8, 5)])
def test_hf_engine_logprobs_equal_the_learners_at_t06(shipped, top_p, top_k):
    model, tok = shipped
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=8, temperature=T, top_p=top_p, top_k=top_k, seed=0)
    samples = _samples(engine.generate([tok.encode(p) for p in PROMPTS], 4, params))
    packed, logp, entropy = _learner_scores(model, samples, T)
    mask = packed["response_mask"]
    assert int(mask.sum()) == sum(len(s.response_ids) for s in samples) > 40
    # Same model, same temperature, the same untruncated distribution (top-k/top-p only choose what is sampled):
    # equal to float rounding (the engine decodes with a KV cache, the learner in one pass): forward_atol, FORWARD_ULPS
    # of the largest value compared (tests/numeric.py). A wrong temperature moves them by 0.05 on average and 0.3 at
    # most (test_tempered_logprobs_differ_from_untempered_ones), a shifted position or token by nats.
    _assert_same_distribution(logp, entropy, packed, samples, forward_atol)


def test_tempered_logprobs_differ_from_untempered_ones(shipped):
    """Before temperature-aware scoring, both sides used softmax(logits): this is the gap that was ignored."""
    model, tok = shipped
    samples = _samples(
        HFEngine(model, tok).generate(
            [tok.encode(p) for p in PROMPTS], 4, SamplingParams(max_new_tokens=8, temperature=T, seed=1)
        )
    )
    packed, untempered, untempered_entropy = _learner_scores(model, samples, 1.0)
    mask = packed["response_mask"]
    behaviour = packed["behavior_logprobs"][mask]
    gap = (behaviour - untempered[mask]).abs()
    # T < 1 sharpens the distribution: sampled (mostly likely) tokens gain probability and entropies fall.
    assert float(gap.mean()) > 0.05 and float(gap.max()) > 0.3
    untempered_w = torch.exp(untempered[mask] - behaviour)
    assert float((untempered_w - 1).abs().max()) > 0.3  # the importance weight the old scoring produced
    entropies = _engine_rows(packed, samples, "entropies")[mask]
    assert float((untempered_entropy[mask] - entropies).mean()) > 0.05


def test_greedy_reports_the_untempered_distribution(shipped):
    model, tok = shipped
    samples = _samples(
        HFEngine(model, tok).generate(
            [tok.encode(p) for p in PROMPTS], 1, SamplingParams(max_new_tokens=6, temperature=0.0)
        )
    )
    packed, logp, _ = _learner_scores(model, samples, 1.0)
    mask = packed["response_mask"]
    # A KV-cache decode against one pass: forward_atol of the values compared (tests/numeric.py); scoring at T = 0.6
    # instead of 1 would move them by 0.05 and more.
    behaviour = packed["behavior_logprobs"][mask]
    torch.testing.assert_close(logp[mask], behaviour, atol=forward_atol(logp[mask], behaviour), rtol=0)


@pytest.fixture(scope="module")
def vllm_engine():
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from r3_rllib.engines import make_engine

    _, tok = load_tiny(default_tiny_model_path())
    # K = vocabulary size: the entropy estimate covers every token, so it is exact and comparable.
    eng = make_engine(
        "vllm", default_tiny_model_path(), tok, logprobs_k=len(tok), kv_cache_memory_bytes=64 * 1024**2
    )
    yield eng
    eng.shutdown()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_engine_logprobs_equal_the_learners_at_t06(vllm_engine, shipped):
    model, tok = shipped
    params = SamplingParams(max_new_tokens=8, temperature=T, seed=0)
    samples = _samples(vllm_engine.generate([tok.encode(p) for p in PROMPTS], 4, params))
    packed, logp, entropy = _learner_scores(model, samples, T)
    assert int(packed["response_mask"].sum()) > 40
    # vLLM's CPU kernels (oneDNN matmuls, paged attention) against transformers, both fp32: engine_atol, ENGINE_ULPS
    # of the largest value compared (tests/numeric.py); a wrong temperature moves them by 0.05 on average.
    _assert_same_distribution(logp, entropy, packed, samples, engine_atol)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_with_top_p_reports_truncated_logprobs_and_warns(vllm_engine, shipped):
    """vLLM has no tempered-but-untruncated mode: with top-p its values are renormalised over the kept tokens,
    so each lies log(kept mass) >= 0 above the learner's, and the engine says so."""
    model, tok = shipped
    vllm_engine._warned_truncation = False
    params = SamplingParams(max_new_tokens=8, temperature=T, top_p=0.7, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = _samples(vllm_engine.generate([tok.encode(p) for p in PROMPTS], 4, params))
    assert any("after truncation" in str(w.message) for w in caught)
    packed, logp, _ = _learner_scores(model, samples, T)
    mask = packed["response_mask"]
    excess = packed["behavior_logprobs"][mask] - logp[mask]
    tol = engine_atol(logp[mask], packed["behavior_logprobs"][mask])  # vLLM against transformers (as above)
    assert float(excess.min()) > -tol
    assert float(excess.max()) > 0.01  # some positions lost mass to the truncation
    assert float(excess.max()) <= -np.log(0.7) + tol  # top-p 0.7 keeps at least 70 % of the mass
