"""The learner's KL term (`KLReference`, held by `R3Learner`): the frozen reference model, loaded only when a term
compares with it, and the target log-probs each micro-batch's term is taken against.

Which term an update has is its training phase's (:meth:`r3_rllib.core.method.TrainingPhase.kl_term`): by default
``kl_coef`` toward the reference model (the policy as loaded from ``model_path``); a method's phase may compare with
the current base instead (from the training forward, e.g. R^2PO's stage A, :mod:`r3_rllib.r2po.method`). A term
aggregated otherwise than the policy term (R^2PO stage A's default, seq-mean-token-mean) is weighted per
micro-batch by its own count (:func:`kl_weight_ratio`), so the minibatch's term is that aggregate whatever the
micro-batching.

With sync_ref_model (TRL's) the reference follows the policy: every ref_model_sync_steps optimizer steps it becomes
``alpha * policy + (1 - alpha) * reference`` (`ReferenceSync`, `mix_toward`); the log-probs an update takes from it
are those of the reference at the update's start (TRL's are scored when its batch is generated).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class ReferenceSync:
    """sync_ref_model's clock: every ``every`` optimizer steps of the run the reference moves ``alpha`` of the way to
    the policy. ``steps`` and ``syncs`` (so far) are saved in the learner's checkpoint."""

    alpha: float
    every: int
    steps: int = 0
    syncs: int = 0


@torch.no_grad()
def mix_toward(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """``reference <- alpha * policy + (1 - alpha) * reference``, parameter by parameter under the same names (TRL's
    sync_target_model). A sharded policy's (FSDP2) parameters are gathered one by one, in the same order on every
    rank: collective, call it on every rank at the same step. Mixed in fp32, then stored in the reference's dtype."""
    ref_params = dict(reference.named_parameters())
    for name, param in policy.named_parameters():
        if name not in ref_params:
            raise RuntimeError(f"sync_ref_model: the reference model has no parameter {name!r}")
        target = param.detach()
        target = target.full_tensor() if hasattr(target, "full_tensor") else target
        ref = ref_params[name]
        ref.copy_(ref.float().lerp_(target.float().to(ref.device), alpha))


class KLReference:
    """The frozen reference model of an ``R3Learner`` (None when no KL term of the method compares with it) and the
    target log-probs each micro-batch's KL term is taken against. ``score(model, packed)`` is the learner's scoring
    (at the rollout temperature; its first element: per-position log-probs). ``sync``: sync_ref_model's clock (None
    when off: the reference stays the policy as loaded)."""

    def __init__(
        self, model: torch.nn.Module | None, score: Callable[..., tuple], sync: ReferenceSync | None = None
    ) -> None:
        self.model = model
        self._score = score
        self.sync = sync

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

        from r3_rllib.models.progress_bars import no_progress_bars

        path = policy_path(config.model_path)
        with no_progress_bars():  # the policy's own load shows none either (rl_module.py)
            ref = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        ref.eval().requires_grad_(False)
        sync = ReferenceSync(config.ref_model_mixup_alpha, config.ref_model_sync_steps)
        return cls(ref, score, sync if config.sync_ref_model else None)

    def after_optimizer_step(self, policy: torch.nn.Module) -> None:
        """Count an applied optimizer step; on every ``sync.every``-th, move the reference toward ``policy``
        (:func:`mix_toward`, collective). Nothing without sync_ref_model."""
        sync = self.sync
        if sync is None:
            return
        sync.steps += 1
        if sync.steps % sync.every == 0:
            mix_toward(self.model, policy, sync.alpha)
            sync.syncs += 1

    def sync_metrics(self) -> dict[str, float]:
        """``ref_model_syncs`` (the reference's syncs so far) with sync_ref_model, else nothing."""
        return {} if self.sync is None else {"ref_model_syncs": float(self.sync.syncs)}

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
