"""The learner's pure pieces: the scoring pass (per-token log-probs, optional no-grad entropies) and the
token-budget micro-batches."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from r3_rllib.algorithms.r3.learner import token_budget_chunks, token_logprobs
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


def test_token_budget_chunks_pack_longest_first_within_the_budget():
    lengths = [5, 9, 3, 4, 9]

    def as_lists(chunks):
        return [c.tolist() for c in chunks]

    # 9+9 fill 2 x 9 = 18; then 5, 4, 3 padded to 5: 3 x 5 = 15
    assert as_lists(token_budget_chunks(lengths, 18)) == [[1, 4], [0, 3, 2]]
    # rows longer than the budget go alone; 4 and 3 padded to 4 fit 8
    assert as_lists(token_budget_chunks(lengths, 8)) == [[1], [4], [0], [3, 2]]
    assert as_lists(token_budget_chunks(lengths, 1000)) == [[1, 4, 0, 3, 2]]
    assert token_budget_chunks([], 10) == []
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_chunks(lengths, 0)


def test_config_rejects_a_non_positive_token_budget():
    from r3_rllib import R3Config

    R3Config().training(micro_batch_max_tokens=4096).validate()
    with pytest.raises(ValueError, match="micro_batch_max_tokens must be >= 1"):
        R3Config().training(micro_batch_max_tokens=0).validate()
