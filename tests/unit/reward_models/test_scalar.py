"""The scalar reward model (r3_rllib/reward_models/scalar.py) on a tiny one-label Qwen2 sequence classifier built
here: the logit as the score, batches that do not change a row's score (right padding), a missing pad token, the
text the model reads, refused checkpoints and the rm_error reason."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from r3_rllib.models.tiny import build_tiny_tokenizer, save_tiny
from r3_rllib.reward_models.scalar import ScalarRewardModel, reward_model_text
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest, RewardScore, RewardScorer


def _classifier(tokenizer, num_labels: int = 1) -> Qwen2ForSequenceClassification:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    tokenizer = build_tiny_tokenizer()
    return str(save_tiny(_classifier(tokenizer), tokenizer, tmp_path_factory.mktemp("rm")))


def _request(response: str, prompt: str = "12+30=") -> RewardRequest:
    return RewardRequest("q", prompt, response, env_reward=0.0, env_correct=False, gold="42")


def _spec(model: str | None, batch_size: int = 32) -> RewardModelSpec:
    return RewardModelSpec(name="rm", type="scalar", model=model, batch_size=batch_size)


def _unpadded_logit(scorer: ScalarRewardModel, text: str) -> float:
    ids = torch.tensor([scorer.tokenizer(text)["input_ids"]], device=scorer.device)
    with torch.inference_mode():
        return float(scorer.model(input_ids=ids).logits[0, 0])


def _atol(scorer: ScalarRewardModel) -> float:
    """float32 on the CPU; bf16 on a GPU, where a padded batch's kernels round differently from a lone row's."""
    return 1e-5 if scorer.model.dtype == torch.float32 else 5e-2


RESPONSES = ["42", "41 is it", "", "a much longer response that says 42 at the end: 42", "x"]


def test_score_is_the_logit_and_independent_of_the_batch(rm_folder):
    batched = ScalarRewardModel(_spec(rm_folder))
    assert isinstance(batched, RewardScorer) and batched.name == "rm"
    assert batched.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    requests = [_request(r) for r in RESPONSES]
    scores = batched.score(requests)
    assert [s.reason for s in scores] == [None] * len(RESPONSES)
    alone = [_unpadded_logit(batched, "12+30=" + r) for r in RESPONSES]
    assert [s.value for s in scores] == pytest.approx(alone, abs=_atol(batched))
    # batches of 2 (3 forwards, the last of one row) give the same scores
    in_twos = ScalarRewardModel(_spec(rm_folder, batch_size=2)).score(requests)
    assert [s.value for s in in_twos] == pytest.approx([s.value for s in scores], abs=_atol(batched))
    assert len({s.value for s in scores}) == len(RESPONSES)  # the model tells the texts apart
    assert batched.score([]) == []


def test_missing_pad_token_pads_with_eos(tmp_path):
    tokenizer = build_tiny_tokenizer()
    model = _classifier(tokenizer)
    tokenizer.pad_token = None
    folder = save_tiny(model, tokenizer, tmp_path / "rm_no_pad")
    scorer = ScalarRewardModel(_spec(str(folder)))
    assert scorer.tokenizer.pad_token == scorer.tokenizer.eos_token
    assert scorer.model.config.pad_token_id == scorer.tokenizer.eos_token_id
    scores = scorer.score([_request(r) for r in RESPONSES[:2]])
    alone = [_unpadded_logit(scorer, "12+30=" + r) for r in RESPONSES[:2]]
    assert [s.value for s in scores] == pytest.approx(alone, abs=_atol(scorer))


def test_too_long_texts_keep_their_end(rm_folder):
    scorer = ScalarRewardModel(_spec(rm_folder))
    long_prompt = "9" * 400  # past the model's 256 positions
    (score,) = scorer.score([_request("42", prompt=long_prompt)])
    assert score.reason is None
    expected = _unpadded_logit(scorer, (long_prompt + "42")[-256:])
    assert score.value == pytest.approx(expected, abs=_atol(scorer))


def test_refused_checkpoints(rm_folder, tiny_random_model, tmp_path):
    with pytest.raises(ValueError, match="needs model"):
        ScalarRewardModel(_spec(None))
    with pytest.raises(ValueError, match="not a sequence-classification model"):
        ScalarRewardModel(_spec(tiny_random_model))
    tokenizer = build_tiny_tokenizer()
    two = save_tiny(_classifier(tokenizer, num_labels=2), tokenizer, tmp_path / "two_labels")
    with pytest.raises(ValueError, match="2 labels"):
        ScalarRewardModel(_spec(str(two)))


def test_failures_give_rm_error(rm_folder, monkeypatch):
    scorer = ScalarRewardModel(_spec(rm_folder, batch_size=2))
    calls = []

    def flaky(texts):
        calls.append(len(texts))
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory")
        return [math.nan if t.endswith("x") else 1.5 for t in texts]

    monkeypatch.setattr(scorer, "_logits", flaky)
    scores = scorer.score([_request(r) for r in ["a", "b", "c", "d", "x"]])
    assert calls == [2, 2, 1]
    assert scores == [RewardScore(1.5), RewardScore(1.5)] + [RewardScore(0.0, "rm_error")] * 3


class _ChatTokenizer:
    """A tokenizer with a chat template and one special token (what reward_model_text reads of it)."""

    chat_template = "{{ messages }}"
    all_special_tokens = ["<|im_start|>", "<|im_end|>"]

    def apply_chat_template(self, messages, tokenize):
        assert tokenize is False
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_reward_model_text():
    # no chat template: prompt and response as one text
    assert reward_model_text(build_tiny_tokenizer(), "1+1=", "2") == "1+1=2"
    chat = _ChatTokenizer()
    # a raw prompt is rendered as a user turn and the response as the assistant's
    assert (
        reward_model_text(chat, "1+1=", "2")
        == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    )
    # a prompt rendered with a chat template already is kept as the policy saw it
    templated = "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    assert reward_model_text(chat, templated, "2") == templated + "2"
