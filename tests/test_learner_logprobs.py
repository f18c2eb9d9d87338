"""The learner's scoring pass: per-token log-probs (with gradients) and the optional no-grad entropies."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from r3_rllib.algorithms.r3.learner import token_logprobs
from r3_rllib.core.losses import entropy_from_logits


def test_token_logprobs_match_log_softmax_and_entropies_are_optional(tiny_random_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_random_model, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0  # left padding

    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    expected_lp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    # chunk=4 splits the 6 positions into 4 + 2, so the chunked entropy pass is checked too
    lp, entropy = token_logprobs(model, input_ids, attention_mask, with_entropy=True, chunk=4)
    torch.testing.assert_close(lp.detach(), expected_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, entropy_from_logits(logits), atol=1e-5, rtol=1e-5)
    assert lp.requires_grad and not entropy.requires_grad

    lp_only, none = token_logprobs(model, input_ids, attention_mask)
    assert none is None
    torch.testing.assert_close(lp_only, lp)
