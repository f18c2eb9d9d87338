"""The learner's KL term (`KLReference`, held by `R3Learner`): the frozen reference model, loaded only when a term
compares with it, and the target log-probs each micro-batch's term is taken against.

Which term an update has is its training phase's (:meth:`r3_rllib.core.method.TrainingPhase.kl_term`): by default
``kl_coef`` toward the reference model (the policy as loaded from ``model_path``); a method's phase may compare with
the current base instead (from the training forward, e.g. R^2PO's stage A, :mod:`r3_rllib.r2po.method`). A term
aggregated otherwise than the policy term (R^2PO stage A's default, seq-mean-token-mean) is weighted per
micro-batch by its own count (:func:`kl_weight_ratio`), so the minibatch's term is that aggregate whatever the
micro-batching.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from r3_rllib.core.method import KLTerm, Method
from r3_rllib.models.hub import policy_path
from r3_rllib.models.lora import AdapterOff
from r3_rllib.types import TrainingBatch

#: Per-row tensors (a row's log-probs at every position), keyed by the row's index in the batch.
RowCache = dict[int, torch.Tensor]


def agg_count(batch: TrainingBatch, rows: np.ndarray, agg_mode: str) -> int:
    """What a loss aggregated with ``agg_mode`` over ``rows`` is divided by: their trained tokens (token-mean) or
    their number (the sequence modes)."""
    return int(batch.trained_tokens[rows].sum()) if agg_mode == "token-mean" else len(rows)


def kl_weight_ratio(local: tuple[int, int], denom: tuple[int, int]) -> float:
    """The KL term's weight in the minibatch relative to the policy term's, for one micro-batch: ``local`` and
    ``denom`` are the (policy, KL) aggregation counts of the micro-batch and of the minibatch. The learner weighs
    the micro-batch's objective by ``local[0] / denom[0]``; the KL term, aggregated over the micro-batch with its
    own mode, needs ``local[1] / denom[1]``. 1 when both modes agree (or for a pass with no policy count, whose
    rows have no trained token and so no KL either)."""
    if local[0] == 0 or (local[0], denom[0]) == (local[1], denom[1]):
        return 1.0
    if denom[1] == 0:  # a token-mean term over a minibatch with no trained token: nothing to weigh
        return 0.0
    return (local[1] / denom[1]) / (local[0] / denom[0])


class KLReference:
    """The frozen reference model of an ``R3Learner`` (None when no KL term of the method compares with it) and the
    target log-probs each micro-batch's KL term is taken against. ``score(model, packed)`` is the learner's scoring
    (at the rollout temperature; its first element: per-position log-probs)."""

    def __init__(self, model: torch.nn.Module | None, score: Callable[..., tuple]) -> None:
        self.model = model
        self._score = score

    @classmethod
    def load(
        cls,
        method: Method,
        config: Any,
        lora: Any,
        dtype: torch.dtype,
        device: Any,
        score: Callable[..., tuple],
    ) -> KLReference:
        """The reference when a KL term of some phase of ``method`` needs it (no model otherwise: no memory
        spent): loaded from the policy's own checkpoint, i.e. the policy as it starts; with LoRA (``lora``, the peft
        policy) the policy with its adapter off (no second model)."""
        if not method.needs_reference_model(config):
            return cls(None, score)
        if lora is not None:
            return cls(AdapterOff(lora), score)
        from transformers import AutoModelForCausalLM

        path = policy_path(config.model_path)
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        ref.eval().requires_grad_(False)
        return cls(ref, score)

    def used_by(self, term: KLTerm) -> bool:
        """Whether ``term`` compares with this reference model (and one is loaded)."""
        return self.model is not None and term.coef > 0 and term.target == "reference"

    def logprobs(self, packed: dict[str, torch.Tensor]) -> torch.Tensor:
        """The reference model's per-position log-probs of the packed rows."""
        return self._score(self.model, packed)[0]

    def target_logprobs(
        self,
        term: KLTerm,
        packed: dict[str, torch.Tensor],
        logp: torch.Tensor,
        base: list,
        idx: np.ndarray,
        real: bool,
        ref_lp: RowCache | None,
    ) -> torch.Tensor | None:
        """The log-probs the KL ``term`` of rows ``idx`` compares ``logp`` with (None without a term): the current
        base's from the training forward (``base``, a term toward the current base), else the reference model's:
        recorded ones (``ref_lp``), else scored now (and recorded); a padding pass with recorded rows takes the
        policy's own (weight 0 anyway)."""
        if base:
            return base[0]
        if not self.used_by(term):
            return None
        if ref_lp is not None and real and int(idx[0]) in ref_lp:
            return torch.stack([fit_row(ref_lp[int(i)], logp.shape[1]) for i in idx])
        if not real and ref_lp is not None:
            return logp.detach()
        with torch.no_grad():
            ref = self.logprobs(packed)
        if ref_lp is not None:
            ref_lp.update({int(i): ref[j] for j, i in enumerate(idx)})
        return ref


def fit_row(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad/trim a per-position row recomputed in another packing to `width` (positions past a row's end are
    masked out of every loss)."""
    if t.shape[0] >= width:
        return t[:width]
    return torch.nn.functional.pad(t, (0, width - t.shape[0]))
