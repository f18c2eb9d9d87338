"""A scalar reward model: a sequence-classification model with one output, whose logit is the reward.

The model at ``spec.model`` (a folder, a named model or a hub name: :func:`r3_rllib.models.hub.resolve_model_path`)
is loaded with ``AutoModelForSequenceClassification``; a checkpoint of another architecture (a causal LM, whose
score head would be random) or with other than one label is refused. It runs on a GPU when one is visible (bf16
where supported), else on the CPU in float32.

What the model reads (:func:`reward_model_text`): the prompt as the policy saw it followed by the response, as one
text, when the reward model's tokenizer has no chat template or the prompt already holds one of that tokenizer's
special tokens (it was rendered with a chat template; the response then ends without an end-of-turn token, as the
policy wrote it). Otherwise (a raw prompt, a reward model trained on chat conversations) the pair is rendered
through the reward model's chat template as a user turn (the prompt) and an assistant turn (the response).

Batches of ``spec.batch_size`` texts are padded on the right (every row's positions start at 0, so a row's score
does not depend on its batch); the model scores each row at its last token that is not the pad token (transformers'
pooling). A tokenizer without a pad token pads with its eos token, and the model's ``pad_token_id`` is set to the
tokenizer's. Texts longer than the model's positions keep their end (the response). A batch whose forward raises
gives every request in it ``RewardScore(0, "rm_error")``; a non-finite logit gives its request the same.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest, RewardScore

logger = logging.getLogger(__name__)


def reward_model_text(tokenizer: Any, prompt_text: str, response_text: str) -> str:
    """The text the reward model reads for one response (module docstring)."""
    template = getattr(tokenizer, "chat_template", None)
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    if not template or any(token in prompt_text for token in specials):
        return prompt_text + response_text
    messages = [{"role": "user", "content": prompt_text}, {"role": "assistant", "content": response_text}]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _checked_architecture(path: Any) -> None:
    """``ValueError`` when the checkpoint names architectures and none is a sequence classifier."""
    from transformers import AutoConfig

    architectures = getattr(AutoConfig.from_pretrained(str(path)), "architectures", None) or []
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(
            f"scalar reward model at {path} is a {', '.join(architectures)}, not a sequence-classification model "
            "(its score head would be random); use type: judge for a causal LM"
        )


class ScalarRewardModel:
    """Scores each response with a one-label sequence-classification model (module docstring); a
    :class:`~r3_rllib.rewards.scoring.RewardScorer`."""

    def __init__(self, spec: RewardModelSpec) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        from r3_rllib.models.dtypes import resolve_dtype
        from r3_rllib.models.hub import resolve_model_path
        from r3_rllib.models.progress_bars import no_progress_bars
        from r3_rllib.models.tiny import load_tokenizer

        if not spec.model:
            raise ValueError(f"reward term {spec.name!r} (type scalar) needs model: a folder or a model name")
        self.name = spec.name
        self.batch_size = int(spec.batch_size)
        path = resolve_model_path(spec.model)
        _checked_architecture(path)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        with no_progress_bars():
            model = AutoModelForSequenceClassification.from_pretrained(
                str(path), dtype=resolve_dtype("auto", self.device.type)
            )
        if model.config.num_labels != 1:
            raise ValueError(f"scalar reward model at {path} has {model.config.num_labels} labels, not 1")
        self.tokenizer = load_tokenizer(path)
        if self.tokenizer.pad_token_id is None:
            if self.tokenizer.eos_token is None:
                raise ValueError(
                    f"scalar reward model at {path}: its tokenizer has neither pad nor eos token"
                )
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(self.device).eval()
        self.max_length = getattr(model.config, "max_position_embeddings", None)

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardScore]:
        """One score per request, in order: the model's logit, batched by ``batch_size``."""
        scores: list[RewardScore] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            try:
                values = self._logits(
                    [reward_model_text(self.tokenizer, r.prompt_text, r.response_text) for r in chunk]
                )
            except Exception as exc:  # a model that fails on one batch must not stop the run
                logger.warning(
                    "scalar reward model %s failed on a batch: %s: %s", self.name, type(exc).__name__, exc
                )
                scores.extend(RewardScore(0.0, "rm_error") for _ in chunk)
                continue
            scores.extend(
                RewardScore(v) if math.isfinite(v) else RewardScore(0.0, "rm_error") for v in values
            )
        return scores

    def _logits(self, texts: list[str]) -> list[float]:
        """The model's logit of each text, one forward for all (right padding)."""
        import torch

        bos = self.tokenizer.bos_token
        rows = [
            self.tokenizer(
                text,
                add_special_tokens=not (bos and text.startswith(bos)),
                truncation=self.max_length is not None,
                max_length=self.max_length,
            )["input_ids"]
            for text in texts
        ]
        batch = self.tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return [float(v) for v in logits[:, 0].float().cpu()]
