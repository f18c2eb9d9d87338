"""Sampling with R^2PO's rollout head on: the HF engine's decode loop over ``lm_logits + head(hidden)``.

The head is attached to the model (:func:`r3_rllib.models.rollout_head.attach_rollout_head`), whose hook adds it to
the LM head's output at every forward pass while rollout logits are on. The HF engine's loop (prefill, KV cache,
sampling, stop handling) is reused unchanged, so with the head on:

- ``Completion.logprobs`` / ``entropies`` are those of the *rollout* distribution (tempered, before top-k/top-p, as
  the HF engine reports them), i.e. of the behaviour policy that drew the tokens: what an importance weight against
  the base policy needs (:func:`r3_rllib.models.rollout_head.rollout_token_logprobs` recomputes both);
- ``update_weights`` accepts the head's tensors under ``rollout_head.*`` next to the base's HF names (the model's
  ``state_dict()`` holds both), so the learner's weight sync can carry the head with the policy.

Switch the head off (:meth:`RolloutHeadHFEngine.set_rollout_logits`) to sample the base policy, as evaluation does.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.models.dtypes import resolve_dtype
from r3_rllib.models.progress_bars import no_progress_bars
from r3_rllib.models.rollout_head import (
    RolloutHead,
    attach_rollout_head,
    get_rollout_head,
    load_policy_with_head,
    load_rollout_head,
)


class RolloutHeadHFEngine(HFEngine):
    """An :class:`HFEngine` whose model carries a rollout head, sampling with it on by default.

    Args:
        model: a model folder (its saved head, if any, is loaded; see ``head``) or a loaded HF causal LM (used as
            is; a head already attached to it is kept).
        tokenizer: as for :class:`HFEngine`.
        head: a :class:`RolloutHead` or a folder holding a saved one; None: the one attached to or saved with the
            model, else a fresh near-zero head seeded with ``head_seed``.
        rollout_logits: start with the head on (True) or off.
        head_seed: seed of a fresh head's init.
        **kwargs: :class:`HFEngine`'s (dtype, device, max_batch_size, eos_token_ids, kv_cache).
    """

    supports_rollout_logits = True

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        head: RolloutHead | str | Path | None = None,
        rollout_logits: bool = True,
        head_seed: int | None = 0,
        dtype: torch.dtype | str = torch.float32,
        **kwargs,
    ) -> None:
        if isinstance(head, (str, Path)):
            head = load_rollout_head(head, dtype=resolve_dtype(dtype))
        if isinstance(model, (str, Path)):
            from r3_rllib.models.tiny import load_tokenizer

            path = Path(model)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"no model folder (config.json) at {path}")
            if head is None:  # the head saved with the model, else a fresh one
                model = load_policy_with_head(path, dtype=resolve_dtype(dtype), seed=head_seed)
            else:
                with no_progress_bars():
                    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
            if tokenizer is None:
                tokenizer = load_tokenizer(path)
        attached = get_rollout_head(model)
        if head is not None and attached is not None and attached is not head:
            raise ValueError(
                "the model already carries a different rollout head; detach it or pass head=None"
            )
        if attached is None:
            attach_rollout_head(model, head, seed=head_seed)
        super().__init__(model, tokenizer, dtype=dtype, **kwargs)
        self.set_rollout_logits(rollout_logits)

    @property
    def head(self) -> RolloutHead:
        head = get_rollout_head(self.model)
        assert head is not None  # attached in __init__; detaching it from outside is a misuse
        return head

    @property
    def rollout_logits(self) -> bool:
        """Whether samples are drawn from ``lm_logits + head(hidden)`` (True) or the base logits."""
        return bool(self.head.enabled)

    def set_rollout_logits(self, enabled: bool) -> None:
        """Sample with the head on (training rollouts) or off (the base policy, e.g. for evaluation)."""
        self.head.enabled = bool(enabled)
