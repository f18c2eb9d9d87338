from __future__ import annotations

import functools
import importlib.util
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from engine_hooks import load_weights_at_first_hook, rescore_after_update
from numeric import engine_atol, f32_tol, forward_atol

from r3_rllib.engines import make_engine
from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.engines.vllm_engine import entropy_from_topk
from r3_rllib.models import default_tiny_model_path, load_tiny

HAS_VLLM = importlib.util.find_spec("vllm") is not None
requires_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")

PROMPTS = ["12+34=", "57+38=", "90+19=", "11+11=", "1+2 is ", "x"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_entropy_estimate_hand_computed():
    ln2 = math.log(2)
    # Computed in float64 and returned as float32: half a float32 ulp of the value from the cast, the float64 sums'
    # errors far below, so 1 ulp of the largest value (1.5 ln 2); a lost or double-counted term (each -p log p here is
    # 0.35) moves it by 0.35.
    tol = f32_tol(1.5 * ln2, ulps=1)
    # All tokens reported: exact entropy of (0.5, 0.25, 0.25).
    full = entropy_from_topk(np.log([[0.5, 0.25, 0.25]]), np.log([0.25]), np.array([True]))
    assert full[0] == pytest.approx(1.5 * ln2, abs=tol)
    # Top-1 only, sampled inside it: the missing 0.5 counts as one bucket -> entropy of (0.5, 0.5).
    bucket = entropy_from_topk(np.log([[0.5]]), np.log([0.5]), np.array([True]))
    assert bucket[0] == pytest.approx(ln2, abs=tol)
    # Top-1 plus a sampled token outside it: (0.5, 0.25) known, 0.25 left over -> again (0.5, 0.25, 0.25).
    extra = entropy_from_topk(np.log([[0.5]]), np.log([0.25]), np.array([False]))
    assert extra[0] == pytest.approx(1.5 * ln2, abs=tol)
    # Merging tokens never raises entropy: the estimate is a lower bound of the true 1.5 ln 2.
    assert bucket[0] < full[0]


@pytest.fixture(scope="module")
def reference():
    return load_tiny(default_tiny_model_path())


@pytest.fixture(scope="module")
def engine(reference):
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    _, tok = reference
    # K = vocabulary size: the entropy "estimate" covers every token and must equal the exact entropy.
    eng = make_engine(
        "vllm", default_tiny_model_path(), tok, logprobs_k=len(tok), kv_cache_memory_bytes=64 * 1024**2
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def prompts(reference):
    return [reference[1].encode(p) for p in PROMPTS]


def rescore(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).numpy(), (
        -(logp.exp() * logp).sum(-1)
    ).numpy()


@pytest.mark.vllm
@requires_vllm
def test_sampled_logprobs_and_entropies_match_hf(engine, reference, prompts):
    model, _ = reference
    params = SamplingParams(max_new_tokens=10, temperature=1.3, seed=0)
    out = engine.generate(prompts, 4, params)
    assert len(out) == len(prompts) and all(len(g) == 4 for g in out)
    for prompt, group in zip(prompts, out, strict=True):
        for c in group:
            assert c.prompt_ids == prompt and len(c.token_ids) == len(c.logprobs) == len(c.entropies)
            lp, ent = rescore(model, prompt, c.token_ids, temperature=1.3)
            # Log-probs and entropies of the tempered distribution the tokens were sampled from: vLLM's kernels
            # against transformers, engine_atol of the values compared (tests/numeric.py); T = 1 instead of 1.3
            # moves each response's log-probs by 0.08 and more, a shifted position by nats.
            np.testing.assert_allclose(c.logprobs, lp, rtol=0, atol=engine_atol(c.logprobs, lp))
            np.testing.assert_allclose(c.entropies, ent, rtol=0, atol=engine_atol(c.entropies, ent))


@pytest.mark.vllm
@requires_vllm
def test_greedy_matches_hf_and_finish_reasons(engine, reference, prompts):
    model, tok = reference
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    ours = engine.generate(prompts, 1, params)
    hf = HFEngine(model, tok).generate(prompts, 1, params)
    agree = sum(a[0].token_ids == b[0].token_ids for a, b in zip(ours, hf, strict=True))
    assert agree >= len(prompts) - 1  # fp32 on both sides; allow one near-tie
    first = ours[0][0]
    assert first.finish_reason == "stop" and first.token_ids[-1] == tok.eos_token_id
    assert first.text == tok.decode(first.token_ids[:-1]) and first.text.isdigit()
    cut = engine.generate(prompts[:1], 1, SamplingParams(max_new_tokens=1, temperature=0.0))[0][0]
    assert cut.finish_reason == "length" and len(cut.token_ids) == 1
    stop_on = first.token_ids[0]
    stopped = engine.generate(prompts[:1], 1, SamplingParams(temperature=0.0, stop_token_ids=[stop_on]))[0][0]
    assert stopped.token_ids == [stop_on] and stopped.finish_reason == "stop"


@pytest.mark.vllm
@requires_vllm
def test_seeds_reproduce_and_samples_differ(engine, prompts):
    def ids(out):
        return [[c.token_ids for c in g] for g in out]

    params = SamplingParams(max_new_tokens=6, temperature=1.5, seed=11)
    same_prompt_twice = [prompts[4], prompts[4]]
    a = engine.generate(same_prompt_twice, 4, params)
    b = engine.generate(same_prompt_twice, 4, params)
    assert ids(a) == ids(b)
    assert ids(a)[0] != ids(a)[1]  # identical prompts get different samples
    assert len({tuple(t) for t in ids(a)[0]}) > 1
    other = engine.generate(same_prompt_twice, 4, SamplingParams(max_new_tokens=6, temperature=1.5, seed=12))
    assert ids(other) != ids(a)


@pytest.mark.vllm
@requires_vllm
def test_bad_inputs(engine):
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([[]], 1, SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[10_000]], 1, SamplingParams())
    with pytest.raises(ValueError, match="n must be >= 1"):
        engine.generate([[5]], 0, SamplingParams())


@pytest.fixture()
def no_eos(engine, monkeypatch):
    """Responses run to max_new_tokens (the tiny model ends its answers within a few tokens): vLLM's requests are
    made with ``ignore_eos`` and the engine's own eos list is emptied."""
    import vllm

    monkeypatch.setattr(engine, "eos_token_ids", ())
    monkeypatch.setattr(
        engine,
        "_vllm",
        SimpleNamespace(
            SamplingParams=functools.partial(vllm.SamplingParams, ignore_eos=True),
            TokensPrompt=vllm.TokensPrompt,
        ),
    )


@pytest.mark.vllm
@requires_vllm
def test_partial_rollout_same_weights_under_a_new_version_leave_the_responses_unchanged(
    engine, reference, prompts, no_eos
):
    """Stepped generation with a version bump (same weights) after step 4: every token and log-prob equals
    ``LLM.generate``'s, the first 4 tokens are tagged with the old version and the rest with the new one."""
    model, _ = reference
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7, stop_token_ids=())
    plain = engine.generate(prompts[:3], 3, params)
    start = engine.version
    seen = load_weights_at_first_hook(
        engine, {k: v.clone() for k, v in model.state_dict().items()}, start + 5
    )
    try:
        partial = engine.generate(prompts[:3], 3, params)
    finally:
        engine.between_steps = None
    assert seen[:2] == [start, start + 5]
    for a, b in zip(sum(plain, []), sum(partial, []), strict=True):
        assert a.token_ids == b.token_ids
        # Same weights and kernels, other batches (the stepped call schedules its requests otherwise): forward_atol
        # (tests/numeric.py); a load that changed the weights (std 0.05 noise, as in the next test) moves each
        # response's log-probs by 0.08 and more.
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=forward_atol(a.logprobs, b.logprobs))
        assert a.token_versions is None
        assert b.token_versions.tolist() == [start] * 4 + [start + 5] * 6


@pytest.mark.vllm
@requires_vllm
def test_partial_rollout_new_weights_change_only_the_tokens_after_the_update(
    engine, reference, prompts, no_eos
):
    """Perturbed weights loaded after step 4 of a stepped call: the first 4 tokens are the old policy's sample, the
    tokens after are the new policy's, on the KV cache the old weights computed (rescored by hand with that cache),
    and the prefix cache holds nothing of the old weights afterwards."""
    model, tok = reference
    original = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    hf_perturbed, _ = load_tiny(default_tiny_model_path())
    hf_perturbed.load_state_dict(perturbed)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11, stop_token_ids=())
    old = engine.generate(prompts, 2, params)
    start = engine.version
    load_weights_at_first_hook(engine, perturbed, start + 1)
    try:
        partial = engine.generate(prompts, 2, params)
        engine.between_steps = None
        after_call = engine.generate(prompts, 2, params)  # all new weights: nothing reused from the old ones
    finally:
        engine.between_steps = None
        engine.update_weights(original.items(), version=start + 2)
    long_enough = 0
    for prompt, g_old, g_partial, g_after in zip(prompts, old, partial, after_call, strict=True):
        for a, b, c in zip(g_old, g_partial, g_after, strict=True):
            assert a.token_ids[:4] == b.token_ids[:4]
            # vLLM against itself before the load (other batches): forward_atol (tests/numeric.py).
            before = forward_atol(a.logprobs[:4], b.logprobs[:4])
            np.testing.assert_allclose(a.logprobs[:4], b.logprobs[:4], rtol=0, atol=before)
            assert b.token_versions.tolist() == [start] * 4 + [start + 1] * 6
            if len(b.token_ids) > 4:
                long_enough += 1
                kept = rescore_after_update(model, hf_perturbed, prompt, b.token_ids, update_at=4)
                # vLLM against transformers: engine_atol of the values compared (tests/numeric.py); the perturbed
                # weights (std 0.05 noise on every weight) move the log-probs by more, as the next check shows.
                tol = engine_atol(b.logprobs[4:], kept)
                np.testing.assert_allclose(b.logprobs[4:], kept, rtol=0, atol=tol)
                lp_old, _ = rescore(model, prompt, b.token_ids)
                assert not np.allclose(b.logprobs[4:], lp_old[4:], rtol=0, atol=tol)
            after = rescore(hf_perturbed, prompt, c.token_ids)[0]
            np.testing.assert_allclose(c.logprobs, after, rtol=0, atol=engine_atol(c.logprobs, after))
    assert long_enough >= len(prompts)


@pytest.mark.vllm
@requires_vllm
def test_update_weights_direct_and_disk(engine, reference, prompts):
    """Runs last in this module: it changes the shared engine's weights and restores them at the end."""
    model, tok = reference
    original = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]  # keep the tie
    hf_perturbed, _ = load_tiny(default_tiny_model_path())
    hf_perturbed.load_state_dict(perturbed)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)

    before = engine.generate(prompts, 2, params)
    engine.update_weights(perturbed.items(), version=1)
    assert engine.version == 1
    after = engine.generate(prompts, 2, params)
    changed = 0
    for prompt, g_before, g_after in zip(prompts, before, after, strict=True):
        for cb, ca in zip(g_before, g_after, strict=True):
            lp, _ = rescore(hf_perturbed, prompt, ca.token_ids)
            # vLLM against transformers: engine_atol of the values compared (tests/numeric.py); a load that did not
            # reach the engine leaves the old log-probs, which the count below sees differ by more than it.
            tol = engine_atol(ca.logprobs, lp)
            np.testing.assert_allclose(ca.logprobs, lp, rtol=0, atol=tol)
            changed += ca.token_ids != cb.token_ids or not np.allclose(
                ca.logprobs, cb.logprobs, rtol=0, atol=tol
            )
    assert changed >= len(prompts)

    # A tied state dict without lm_head.weight (vLLM would silently keep a stale head): the engine adds it.
    without_head = [(k, v) for k, v in original.items() if k != "lm_head.weight"]
    engine.weight_transfer = "disk"
    engine.update_weights(without_head, version=2)
    restored = engine.generate(prompts, 2, params)
    for prompt, group in zip(prompts, restored, strict=True):
        for c in group:
            lp, _ = rescore(model, prompt, c.token_ids)
            # engine_atol (as above); a stale output head (the perturbed one) moves them by more than it.
            np.testing.assert_allclose(c.logprobs, lp, rtol=0, atol=engine_atol(c.logprobs, lp))
    assert [[c.token_ids for c in g] for g in restored] == [[c.token_ids for c in g] for g in before]
    engine.weight_transfer = "direct"
