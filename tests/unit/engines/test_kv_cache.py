"""The HF engine's preallocated KV cache gives the logits of transformers' DynamicCache, row drops included."""

from __future__ import annotations

import pytest
import torch
from numeric import forward_atol
from transformers.cache_utils import DynamicCache

from r3_rllib.engines.kv_cache import preallocated_cache
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer


def _decode(model, cache, prompt: torch.Tensor, steps: int, drop_after: int, keep: torch.Tensor) -> list:
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    logits, tokens, pos = [out.logits[:, -1]], out.logits[:, -1].argmax(-1), prompt.shape[1]
    for step in range(steps):
        if step == drop_after:
            cache.reorder_cache(keep)
            tokens = tokens[keep]
        out = model(
            input_ids=tokens[:, None],
            position_ids=torch.full((len(tokens), 1), pos),
            past_key_values=cache,
            use_cache=True,
        )
        logits.append(out.logits[:, -1])
        tokens, pos = out.logits[:, -1].argmax(-1), pos + 1
    return logits


@torch.inference_mode()
def test_preallocated_cache_matches_dynamic_cache():
    torch.manual_seed(0)
    model = build_tiny_model(build_tiny_tokenizer(), seed=0).eval()
    prompt = torch.randint(5, 30, (4, 6))
    keep = torch.tensor([0, 2, 3])  # row 1 finishes after 3 steps and leaves the batch
    steps = 8
    ref = _decode(model, DynamicCache(config=model.config), prompt, steps, 3, keep)
    cache = preallocated_cache(model.config, capacity=prompt.shape[1] + steps)
    assert cache is not None
    got = _decode(model, cache, prompt, steps, 3, keep)
    for a, b in zip(ref, got, strict=True):
        # another cache layout, other attention kernels: FORWARD_ULPS of the logits' scale (tests/numeric.py)
        torch.testing.assert_close(b, a, rtol=0, atol=forward_atol(a))
    assert cache.get_seq_length() == prompt.shape[1] + steps


def test_capacity_overflow_is_an_error_not_a_silent_truncation():
    model = build_tiny_model(build_tiny_tokenizer(), seed=0).eval()
    cache = preallocated_cache(model.config, capacity=4)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="KV cache capacity 6 exceeded"):
        model(input_ids=torch.randint(5, 30, (1, 6)), past_key_values=cache, use_cache=True)
        model(input_ids=torch.randint(5, 30, (1, 1)), past_key_values=cache, use_cache=True)


def test_sliding_window_models_keep_transformers_cache():
    config = build_tiny_model(build_tiny_tokenizer(), seed=0).config
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    assert preallocated_cache(config, capacity=8) is None
