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

The teacher is distilled into the policy's base logits: the policy that is evaluated, exported and served. With
R^2PO's rollout head (``rollout_head``, :mod:`r3_rllib.r2po`) the samples were drawn from the base logits plus the
head's, and each update is told its phase (:meth:`DistillTerm.start`):

- stage A (a phase that scores the rollout logits: it trains the head alone, on its rarity reward and its KL
  term) gets no distillation term, and its rarity advantages are never zeroed: the head is an exploration device,
  not the student, and pulling it toward the teacher would work against the rarity reward it is there to learn;
- stage B (it trains the base, on the base logits) gets the term, with the student being the base, not the
  sampler: the student's log-prob of a sampled token is the base's proximal one ``s_t`` (the update's "old"
  log-prob), never the sampler's ``b_t`` (head on). 'advantage': ``A_t = distill_coef * (q_t - s_t)``, trained
  with ``-w_t * exp(logp_t - s_t) * A_t``; 'loss': ``distill_coef * w_t * 0.5 * (logp_t - q_t)^2``; ``w_t`` is the
  stage's own behaviour weight, the one its task term gets (``rollout_head_stage_b_weight``: 'truncated_is'
  ``min(exp(s_t - b_t), is_cap)`` at the ``rollout_is`` level, 'none' 1). With 'truncated_is' and no truncation
  the advantage mode is the recipe's importance-sampling loss against the sampler, ``exp(logp_t - b_t)``, and
  its expected gradient is the base's reverse KL's, ``KL(pi_base || pi_teacher)``. With the sampler's log-prob
  instead (as without a head), the advantage ``q_t - b_t`` would add ``s_t - b_t`` to every token's, and the
  term would minimise ``KL(pi_base || pi_teacher) - KL(pi_base || pi_rollout)``: push the base away from the
  head's exploration. ``distill_reverse_kl`` is then the mean of ``s_t - q_t``, the base's k1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from r3_rllib.core.distill import distill_advantages, distill_objective, importance_sampling_loss
from r3_rllib.core.losses import aggregate_loss
from r3_rllib.core.method import DEFAULT_PHASE, TrainingPhase
from r3_rllib.core.mismatch import RolloutCorrection, rollout_correction
from r3_rllib.core.reductions import invariant_sum
from r3_rllib.types import TrainingBatch


class DistillTerm:
    """The distillation term of an ``R3Learner``'s objective (see the module docstring); inert without a teacher
    (``distill_teacher`` None) and in a phase that does not distill (:attr:`TrainingPhase.distills`)."""

    def __init__(self, config: Any) -> None:
        self.enabled = bool(getattr(config, "distill_teacher", None))
        self.mode = str(getattr(config, "distill_mode", "advantage"))
        self.coef = float(getattr(config, "distill_coef", 1.0))
        self.task_reward = bool(getattr(config, "distill_task_reward", True))
        self._agg_mode = config.loss_agg_mode
        self._norm_len = config.max_new_tokens
        self._log_ratio_clamp = config.log_ratio_clamp
        self.start(DEFAULT_PHASE, sampled_by_trained=True)

    def start(self, phase: TrainingPhase, *, sampled_by_trained: bool) -> None:
        """Set an update in ``phase`` up: whether the term trains it (:attr:`TrainingPhase.distills`), and whether the
        logits it trains are the ones the samples were drawn from (``sampled_by_trained``; False in R^2PO's stage
        B, where the student's log-prob is then the base's proximal one, not the sampler's)."""
        self.active = self.enabled and phase.distills
        self._student_is_sampler = sampled_by_trained

    def task_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """The rows' task advantages as the policy loss takes them: zeros when distilling without the task reward
        (in a phase the term trains: R^2PO's stage A keeps its rarity advantages)."""
        if self.active and not self.task_reward:
            return torch.zeros_like(advantages)
        return advantages

    def add(
        self,
        loss: torch.Tensor,
        metrics: dict[str, torch.Tensor],
        packed: dict[str, torch.Tensor],
        logp: torch.Tensor,
        old_logp: torch.Tensor | None = None,
        correction: RolloutCorrection | None = None,
    ) -> torch.Tensor:
        """``loss`` plus the micro-batch's distillation term (its metrics added to ``metrics``, the same keys in
        every pass, zeros when the batch has no teacher column); ``loss`` itself, and no metric, without a teacher
        or in a phase that does not distill (R^2PO's stage A: its update reports no distillation term rather than
        a term of 0). ``old_logp``: the proximal log-probs of the trained logits, and ``correction``: the phase's
        rollout correction, both read only when the trained logits are not the sampler's (stage B)."""
        if not self.active:
            return loss
        if "teacher_logprobs" not in packed:
            zero = torch.zeros((), device=logp.device)
            metrics["distill_reverse_kl"] = zero
            metrics["distill_loss" if self.mode == "loss" else "distill_advantage_mean"] = zero
            return loss
        if not self._student_is_sampler:
            if old_logp is None or correction is None:
                raise ValueError("the trained logits did not draw the samples: pass old_logp and correction")
            term, distill_metrics = self._off_sampler_objective(packed, logp, old_logp, correction)
        else:
            term, distill_metrics = distill_objective(
                self.mode,
                logp,
                packed["behavior_logprobs"],
                packed["teacher_logprobs"],
                packed["teacher_mask"],
                packed["response_mask"],
                coef=self.coef,
                agg_mode=self._agg_mode,
                norm_len=self._norm_len,
                log_ratio_clamp=self._log_ratio_clamp,
            )
        metrics.update(distill_metrics)
        return loss + term

    def _off_sampler_objective(
        self,
        packed: dict[str, torch.Tensor],
        logp: torch.Tensor,
        student: torch.Tensor,
        correction: RolloutCorrection,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The term and its metrics when the trained logits did not draw the samples (R^2PO's stage B, module
        docstring): the student's log-prob is ``student`` (the base's proximal one), each token weighted by the
        phase's behaviour weight ``w_t`` (that of its task term; 1 without one)."""
        mask, teacher = packed["response_mask"], packed["teacher_logprobs"]
        student = student.detach()
        m = packed["teacher_mask"].bool() & mask.bool()
        count = m.sum().clamp(min=1).to(torch.float32)
        # The task term's importance weight (1 everywhere without one); rollout_rs is refused with a teacher.
        weights = rollout_correction(student, packed["behavior_logprobs"], mask, correction)[0]
        with torch.no_grad():
            k1 = student.float() - teacher.float()
            metrics = {"distill_reverse_kl": invariant_sum(torch.where(m, k1, torch.zeros_like(k1))) / count}
        if self.mode == "advantage":
            adv = distill_advantages(student, teacher, m, self.coef)
            term = importance_sampling_loss(
                logp,
                student,
                weights * adv,
                mask,
                agg_mode=self._agg_mode,
                norm_len=self._norm_len,
                log_ratio_clamp=self._log_ratio_clamp,
            )
            metrics["distill_advantage_mean"] = invariant_sum(adv) / count
        else:
            d = logp - teacher.detach().to(logp.dtype)
            per_token = torch.where(m, weights.to(logp.dtype) * 0.5 * d**2, torch.zeros_like(d))
            term = self.coef * aggregate_loss(per_token, mask, self._agg_mode, norm_len=self._norm_len)
            metrics["distill_loss"] = term.detach()
        return term, metrics

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
