"""The learner's on-policy distillation term (`DistillTerm`, held by `R3Learner`): what each micro-batch's objective
gains from the teacher's log-probs that the driver's teacher stage attached to the samples (``r3_rllib.distill``),
and the task advantage it keeps.

The term itself is :func:`r3_rllib.core.distill.distill_objective` (``distill_mode`` 'advantage': tinker-cookbook's
dense per-token advantage and importance-sampling loss; 'loss': the k2 loss): added to the run's policy loss (and
KL term), aggregated with ``loss_agg_mode`` over the micro-batch's trained tokens as the policy loss is, so the
learner's weighting of micro-batches applies to it unchanged. A token without a teacher log-prob (its sample was
not scored: a teacher error or timeout, a replayed sample) adds 0. With ``distill_task_reward`` False the task
advantages are zeroed: the update trains on distillation alone. Rejection sampling
(``rollout_rs``) is refused with a teacher (config rule ``distillation_has_no_rejection``): this term does not
follow the rejection.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from r3_rllib.core.distill import distill_objective
from r3_rllib.types import TrainingBatch


class DistillTerm:
    """The distillation term of an ``R3Learner``'s objective (see the module docstring); inert without a teacher
    (``distill_teacher`` None)."""

    def __init__(self, config: Any) -> None:
        self.enabled = bool(getattr(config, "distill_teacher", None))
        self.mode = str(getattr(config, "distill_mode", "advantage"))
        self.coef = float(getattr(config, "distill_coef", 1.0))
        self.task_reward = bool(getattr(config, "distill_task_reward", True))
        self._agg_mode = config.loss_agg_mode
        self._norm_len = config.max_new_tokens
        self._log_ratio_clamp = config.log_ratio_clamp

    def task_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """The rows' task advantages as the policy loss takes them: zeros when distilling without the task reward."""
        if self.enabled and not self.task_reward:
            return torch.zeros_like(advantages)
        return advantages

    def add(
        self,
        loss: torch.Tensor,
        metrics: dict[str, torch.Tensor],
        packed: dict[str, torch.Tensor],
        logp: torch.Tensor,
    ) -> torch.Tensor:
        """``loss`` plus the micro-batch's distillation term (its metrics added to ``metrics``, the same keys in
        every pass, zeros when the batch has no teacher column); ``loss`` itself without a teacher."""
        if not self.enabled:
            return loss
        mask = packed["response_mask"]
        if "teacher_logprobs" not in packed:
            zero = torch.zeros((), device=logp.device)
            metrics["distill_reverse_kl"] = zero
            metrics["distill_loss" if self.mode == "loss" else "distill_advantage_mean"] = zero
            return loss
        term, distill_metrics = distill_objective(
            self.mode,
            logp,
            packed["behavior_logprobs"],
            packed["teacher_logprobs"],
            packed["teacher_mask"],
            mask,
            coef=self.coef,
            agg_mode=self._agg_mode,
            norm_len=self._norm_len,
            log_ratio_clamp=self._log_ratio_clamp,
        )
        metrics.update(distill_metrics)
        return loss + term

    def update_metrics(self, batch: TrainingBatch) -> dict[str, float]:
        """The update's teacher coverage: trained tokens with a teacher log-prob (``distill_teacher_tokens``) and
        their share of the trained tokens (``distill_teacher_token_frac``); nothing without a teacher."""
        if not self.enabled:
            return {}
        trained = int(batch.trained_tokens.sum())
        if batch.teacher_logprobs is None:
            scored = 0
        else:
            has = np.isfinite(batch.teacher_logprobs)
            scored = int((has if batch.loss_mask is None else has & batch.loss_mask).sum())
        return {
            "distill_teacher_tokens": float(scored),
            "distill_teacher_token_frac": scored / trained if trained else 0.0,
        }
