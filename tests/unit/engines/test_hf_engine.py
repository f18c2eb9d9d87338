from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, f32_tol, forward_atol
from repo_paths import SHARED_DATA
from transformers import AutoTokenizer

from r3_rllib.engines import make_engine
from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.hf_engine import HFEngine, filter_logits, logprobs_and_entropy
from r3_rllib.models import default_tiny_model_path, load_tiny
from r3_rllib.models.tiny import (
    build_tiny_model,
    build_tiny_model_for_tokenizer,
    build_tiny_tokenizer,
    save_tiny,
)

R1_TOKENIZER = SHARED_DATA / "tokenizers" / "r1_distill_qwen_1.5b"
PROMPTS = ["12+34=", "7+8=", "the sum of 1 and 2 is ", "99+1="]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(TORCH_THREADS)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=3)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def shipped():
    return load_tiny(default_tiny_model_path())


def forward_scores(model, prompt, tokens, temperature=1.0):
    """Log-probs of ``tokens`` and entropies under softmax(logits / temperature), from one forward pass."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    return lp.numpy(), (-(logp.exp() * logp).sum(-1)).numpy()


def test_filter_logits_hand_computed():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    inf = float("-inf")
    # top-p 0.6: 0.5 alone is short of 0.6, so 0.3 joins; the mass before 0.2 is 0.8 >= 0.6, so it goes.
    assert torch.isinf(filter_logits(logits, 1.0, 0.6, -1)).tolist() == [[False, False, True]]
    # top-p 0.5: the first token already reaches it.
    assert torch.isinf(filter_logits(logits, 1.0, 0.5, -1)).tolist() == [[False, True, True]]
    assert filter_logits(logits, 1.0, 1.0, 2)[0, 2].item() == inf
    halved = filter_logits(logits, 2.0, 1.0, -1)
    torch.testing.assert_close(halved, logits / 2, rtol=0, atol=0)  # dividing by 2 is exact in binary floats


def test_logprobs_and_entropy_hand_computed():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]))
    # float32 log-softmax and entropy of 3 entries by hand: 8 float32 ulps of the largest |log p| (log 6).
    tol = f32_tol(math.log(6), ulps=8)
    lp, ent = logprobs_and_entropy(logits, torch.tensor([1, 0]))
    assert lp.tolist() == pytest.approx([math.log(0.25), math.log(1 / 3)], abs=tol)
    assert ent.tolist() == pytest.approx([1.5 * math.log(2), math.log(3)], abs=tol)
    # T = 0.5 squares the probabilities before renormalising: (0.25, 0.0625, 0.0625) / 0.375 = (2/3, 1/6, 1/6).
    lp, ent = logprobs_and_entropy(logits, torch.tensor([1, 0]), 0.5)
    assert lp.tolist() == pytest.approx([math.log(1 / 6), math.log(1 / 3)], abs=tol)
    expected = -(2 / 3 * math.log(2 / 3) + 2 * (1 / 6) * math.log(1 / 6))
    assert ent.tolist() == pytest.approx([expected, math.log(3)], abs=tol)
    # Temperature 0 (greedy) reports the untempered distribution.
    assert logprobs_and_entropy(logits, torch.tensor([1, 0]), 0.0)[0].tolist() == pytest.approx(
        [math.log(0.25), math.log(1 / 3)], abs=tol
    )


def test_shapes_and_n_samples(model, tok, prompts):
    engine = HFEngine(model, tok)
    out = engine.generate(prompts, 3, SamplingParams(max_new_tokens=6, seed=0))
    assert len(out) == len(prompts) and all(len(g) == 3 for g in out)
    for prompt, group in zip(prompts, out, strict=True):
        for c in group:
            assert c.prompt_ids == prompt
            assert 1 <= len(c.token_ids) <= 6
            assert c.logprobs.shape == c.entropies.shape == (len(c.token_ids),)
            assert c.logprobs.dtype == np.float32
            assert np.all(c.logprobs <= 0) and np.all(c.entropies >= 0)
    assert len({tuple(c.token_ids) for c in out[0]}) > 1  # samples of one prompt differ


def test_logprobs_and_entropies_match_a_forward_pass(model, tok, prompts):
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=20, seed=1)
    for prompt, group in zip(prompts, engine.generate(prompts, 2, params), strict=True):
        for c in group:
            lp, ent = forward_scores(model, prompt, c.token_ids, temperature=0.7)
            # The tempered distribution before truncation: top-k and top-p do not enter the reported numbers.
            # (sampling with a KV cache vs one full forward pass: tests/numeric.py's FORWARD_ULPS of the scale)
            np.testing.assert_allclose(c.logprobs, lp, rtol=0, atol=forward_atol(lp))
            np.testing.assert_allclose(c.entropies, ent, rtol=0, atol=forward_atol(ent))


def test_left_padding_matches_unpadded_prompts(model, tok, prompts):
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    batched = engine.generate(prompts, 1, params)
    for prompt, group in zip(prompts, batched, strict=True):
        single = engine.generate([prompt], 1, params)[0][0]
        assert single.token_ids == group[0].token_ids
        # a padded batch vs one prompt: other shapes, other sums (FORWARD_ULPS of the scale, tests/numeric.py)
        np.testing.assert_allclose(
            single.logprobs, group[0].logprobs, rtol=0, atol=forward_atol(single.logprobs)
        )
        np.testing.assert_allclose(
            single.entropies, group[0].entropies, rtol=0, atol=forward_atol(single.entropies)
        )


def test_chunking_does_not_change_greedy_results(model, tok, prompts):
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    whole = HFEngine(model, tok, max_batch_size=64).generate(prompts, 2, params)
    chunked = HFEngine(model, tok, max_batch_size=3).generate(prompts, 2, params)
    assert [[c.token_ids for c in g] for g in whole] == [[c.token_ids for c in g] for g in chunked]


def test_seeds_reproduce(model, tok, prompts):
    engine = HFEngine(model, tok)

    def ids(seed):
        out = engine.generate(prompts, 2, SamplingParams(max_new_tokens=12, seed=seed))
        return [[c.token_ids for c in g] for g in out]

    assert ids(7) == ids(7)
    assert ids(7) != ids(8)


def test_top_k_1_and_tiny_top_p_are_greedy(model, tok, prompts):
    engine = HFEngine(model, tok)
    greedy = engine.generate(prompts, 1, SamplingParams(max_new_tokens=6, temperature=0.0))
    for params in (
        SamplingParams(max_new_tokens=6, top_k=1, seed=0),
        SamplingParams(max_new_tokens=6, top_p=1e-6),
    ):
        sampled = engine.generate(prompts, 2, params)
        assert all(
            c.token_ids == g[0].token_ids for g, group in zip(greedy, sampled, strict=True) for c in group
        )


def test_stop_and_length_finish_reasons(shipped):
    model, tok = shipped
    engine = HFEngine(model, tok)
    prompt = tok.encode("12+34=")
    done = engine.generate([prompt], 1, SamplingParams(max_new_tokens=8, temperature=0.0))[0][0]
    assert done.finish_reason == "stop" and not done.truncated
    assert done.token_ids[-1] == tok.eos_token_id  # the stop token is kept in token_ids ...
    assert done.text == tok.decode(done.token_ids[:-1])  # ... but not in the text
    assert done.text.isdigit()
    cut = engine.generate([prompt], 1, SamplingParams(max_new_tokens=1, temperature=0.0))[0][0]
    assert cut.finish_reason == "length" and cut.truncated and len(cut.token_ids) == 1
    # A stop token id ends generation right after it is produced, and stays in the text.
    first = done.token_ids[0]
    stopped = engine.generate([prompt], 1, SamplingParams(temperature=0.0, stop_token_ids=[first]))[0][0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    assert stopped.text == tok.decode([first])


def test_update_weights_in_place(tok, prompts):
    model = build_tiny_model(tok, seed=3)
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    before = engine.generate(prompts, 1, params)
    other = build_tiny_model(tok, seed=4)
    engine.update_weights(other.state_dict().items(), version=5)
    assert engine.version == 5
    after = engine.generate(prompts, 1, params)
    reference = HFEngine(other, tok).generate(prompts, 1, params)
    for b, a, r in zip(before, after, reference, strict=True):
        assert a[0].token_ids == r[0].token_ids
        # The same weights and shapes in two engines: the same sums, but not bit-identical by construction (the GEMM
        # kernels may pick their path by the buffers' alignment), so FORWARD_ULPS of the scale (tests/numeric.py).
        np.testing.assert_allclose(a[0].logprobs, r[0].logprobs, rtol=0, atol=forward_atol(r[0].logprobs))
        assert not np.allclose(a[0].logprobs[:1], b[0].logprobs[:1])
    with pytest.raises(KeyError, match="no parameter or buffer named 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))], version=6)
    with pytest.raises(ValueError, match="has shape"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))], version=6)


def test_engine_from_a_model_folder(tmp_path, tok, model):
    save_tiny(model, tok, tmp_path)
    engine = make_engine("hf", tmp_path)
    out = engine.generate([tok.encode("1+1=")], 1, SamplingParams(max_new_tokens=4, temperature=0.0))[0][0]
    reference = HFEngine(model, tok).generate(
        [tok.encode("1+1=")], 1, SamplingParams(max_new_tokens=4, temperature=0)
    )
    assert out.token_ids == reference[0][0].token_ids and out.text == reference[0][0].text


def test_bad_inputs(model, tok):
    engine = HFEngine(model, tok)
    with pytest.raises(ValueError, match="n must be >= 1"):
        engine.generate([[5]], 0, SamplingParams())
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[5], []], 1, SamplingParams())
    with pytest.raises(ValueError, match="prompt 0 has a token id outside"):
        engine.generate([[100]], 1, SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(model, tok, max_batch_size=0)
    with pytest.raises(FileNotFoundError, match="no model folder"):
        HFEngine("/nonexistent/model")


def test_make_engine_errors(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown engine kind 'sglang'"):
        make_engine("sglang", tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ImportError, match="needs the vllm module"):
        make_engine("vllm", tmp_path)


@pytest.mark.skipif(not R1_TOKENIZER.is_dir(), reason=f"R1 tokenizer not found at {R1_TOKENIZER}")
def test_chat_template_prompt_with_the_r1_tokenizer():
    tok = AutoTokenizer.from_pretrained(str(R1_TOKENIZER))
    model = build_tiny_model_for_tokenizer(tok, hidden=32, layers=1)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    engine = HFEngine(model, tok)
    assert tok.eos_token_id in engine.eos_token_ids
    c = engine.generate([ids], 2, SamplingParams(max_new_tokens=5, seed=0))[0][0]
    lp, _ = forward_scores(model, ids, c.token_ids)
    np.testing.assert_allclose(
        c.logprobs, lp, rtol=0, atol=forward_atol(lp)
    )  # FORWARD_ULPS (tests/numeric.py)
    assert c.text == tok.decode(c.token_ids)


def test_a_folder_loaded_in_bf16_samples_with_fp32_logprobs_and_entropies(tiny_random_model, caplog):
    """dtype='bfloat16' on CPU (BENCHMARKS 39): the engine holds bf16 weights and reports float32 log-probs and
    entropies of the tokens it sampled (each a log-probability, each entropy within [0, log V]); no warning where
    the CPU has bf16 instructions."""
    import logging

    from r3_rllib.models.dtypes import cpu_has_native_bf16

    with caplog.at_level(logging.WARNING, logger="r3_rllib.models.dtypes"):
        engine = HFEngine(tiny_random_model, dtype="bfloat16")
    assert engine.model.dtype == torch.bfloat16
    warned = [r for r in caplog.records if r.name == "r3_rllib.models.dtypes"]  # not transformers' own
    assert bool(warned) != cpu_has_native_bf16()  # the warning where bf16 is emulated, only there
    vocab = engine.model.config.vocab_size
    out = engine.generate([[5, 6, 7], [8, 9]], 2, SamplingParams(max_new_tokens=6, seed=0))
    for c in (c for row in out for c in row):
        assert c.logprobs.dtype == np.float32 and c.entropies.dtype == np.float32
        assert len(c.logprobs) == len(c.token_ids) == len(c.entropies) > 0
        assert np.all(np.isfinite(c.logprobs)) and np.all(c.logprobs <= 0.0)
        # The entropy is a float32 sum over the V tokens: its rounding, at most ~V ulps of log V.
        assert np.all(c.entropies >= 0.0) and np.all(
            c.entropies <= math.log(vocab) + f32_tol(math.log(vocab), vocab)
        )
