"""On-policy distillation's per-token terms (torch, token-level tensors ``[B, T]`` as in :mod:`r3_rllib.core.losses`).

The student samples a response ``y`` at the rollout temperature ``T``; a teacher scores every sampled token. Both
log-probs are of the tempered distributions: the engines sample from ``softmax(logits / T)`` and report the sampled
token's log-prob under it (the *sampler's* log-prob ``b_t``, ``behavior_logprobs``), the learner scores the student
under the same one (``logp_t``), and the teacher is scored with its logits divided by the same ``T``
(``q_t``, :mod:`r3_rllib.distill.teacher`). The divergence distilled is therefore the reverse KL between the two
tempered next-token distributions, ``KL(pi_student^T || pi_teacher^T)``, per context; at ``T = 1`` the models' own.

Per-token estimate (Schulman's k1) on a token the student sampled: ``k1_t = b_t - q_t``. Its expectation over the
student's sampling is the exact per-context reverse KL, so its mean over the trained tokens that have a teacher
log-prob is the run's estimate of the reverse KL (``distill_reverse_kl``).

Two ways to train on it (``distill_mode``), following one reference each, exactly:

- ``'advantage'``: tinker-cookbook's on-policy distillation recipe (``tinker_cookbook/distillation/
  train_on_policy.py``, ``incorporate_kl_penalty``): the reverse KL ``k1_t = b_t - q_t`` is taken with the
  *sampler's* log-prob ``b_t`` (the rollout's ``logprobs``, not a recomputed one), its negative is a dense per-token
  reward with no discounting (the recipe's default ``kl_discount_factor = 0``: each token gets its own term only,
  not a sum of later ones), and ``distill_coef`` times it is added to the token's advantage:
  ``A_t = A_task + distill_coef * (q_t - b_t)`` (:func:`distill_advantages`). The recipe trains ``A_t`` with
  its importance-sampling loss ``-exp(logp_t - b_t) * A_t`` (ratio against the sampler's log-prob, no clipping).
  Here the task part ``A_task`` keeps the run's own policy loss (GRPO's clipped surrogate, or any estimator's and
  loss's), and the distillation part is the recipe's importance-sampling loss on ``distill_coef * (q_t - b_t)``
  (:func:`importance_sampling_loss`), aggregated with the run's ``loss_agg_mode``; the log-ratio is clamped to
  ``+-log_ratio_clamp`` before ``exp`` (finite for stale samples). On the first optimizer step of an update the
  policy's ratio is 1, no clip is active and the clipped surrogate is linear in ``A``: the sum of the two terms then
  has exactly the gradient of the policy loss at the summed advantage ``A_t``.
- ``'loss'``: a loss term ``distill_coef * agg_t(0.5 * (logp_t - q_t)^2)`` (k2, :func:`k2_distill_loss`), with
  ``logp_t`` the learner's current log-prob (with gradient) and the run's ``loss_agg_mode``. For tokens sampled from
  the student, ``E_y[grad 0.5 (log p - log q)^2] = E_y[(log p - log q) grad log p] = grad KL(p || q)`` (the
  score-function gradient of the reverse KL, since ``E_y[grad log p] = 0``): k2 is the loss whose gradient is the
  reverse KL's. The k1 mean ``agg_t(logp_t - q_t)``, used as a loss, has expected gradient ``E_y[grad log p] = 0``:
  a "KL loss" that trains nothing (tests/unit/core/test_distill.py proves both by exact enumeration).

A token with no teacher log-prob (``teacher_mask`` False: the teacher failed or timed out on its sample, a tool
token) gets no distillation term in either mode; it keeps its task term.
"""

from __future__ import annotations

import torch

from r3_rllib.core.losses import aggregate_loss
from r3_rllib.core.reductions import invariant_sum

#: Values of ``distill_mode``.
DISTILL_MODES: tuple[str, ...] = ("advantage", "loss")


def _check(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shape mismatch: {shapes}")
    if next(iter(tensors.values())).dim() != 2:
        raise ValueError(f"distillation tensors must be [B, T], got shapes {shapes}")


def reverse_kl_k1(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimate of the reverse KL, ``student - teacher`` (sampled-token log-probs; see the module
    docstring)."""
    _check(student_logprobs=student_logprobs, teacher_logprobs=teacher_logprobs)
    return student_logprobs - teacher_logprobs


def distill_advantages(
    behavior_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, teacher_mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """The dense per-token distillation advantage of the ``'advantage'`` mode (tinker-cookbook's recipe):
    ``-coef * (b_t - q_t)`` with ``b_t`` the sampler's log-prob, 0 where ``teacher_mask`` is False; detached."""
    _check(behavior=behavior_logprobs, teacher=teacher_logprobs, teacher_mask=teacher_mask)
    with torch.no_grad():
        k1 = reverse_kl_k1(behavior_logprobs.float(), teacher_logprobs.float())
        return torch.where(teacher_mask.bool(), -float(coef) * k1, torch.zeros_like(k1))


def importance_sampling_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    token_advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg_mode: str,
    norm_len: float | None = None,
    log_ratio_clamp: float | None = None,
) -> torch.Tensor:
    """The reference's importance-sampling policy-gradient loss with per-token advantages:
    ``agg_t(-exp(logp_t - b_t) * A_t)`` over the trained tokens ``mask``, the ratio against the sampler's log-prob ``b_t`` (log-ratio
    clamped to ``+-log_ratio_clamp`` when set), ``A_t`` detached; reduced with :func:`aggregate_loss`."""
    _check(logprobs=logprobs, behavior=behavior_logprobs, advantages=token_advantages, mask=mask)
    log_ratio = logprobs - behavior_logprobs.detach().to(logprobs.dtype)
    if log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    per_token = -torch.exp(log_ratio) * token_advantages.detach().to(logprobs.dtype)
    return aggregate_loss(per_token, mask, agg_mode, norm_len=norm_len)


def k2_distill_loss(
    logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_mask: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg_mode: str,
    norm_len: float | None = None,
) -> torch.Tensor:
    """The ``'loss'`` mode's term before its coefficient: ``agg_t(0.5 * (logp_t - q_t)^2)`` with
    :func:`aggregate_loss` over the trained tokens ``mask``, a token without a teacher log-prob (``teacher_mask``
    False) counting 0; its on-policy expected gradient is the reverse KL's (module docstring)."""
    _check(logprobs=logprobs, teacher=teacher_logprobs, teacher_mask=teacher_mask, mask=mask)
    d = logprobs - teacher_logprobs.detach().to(logprobs.dtype)
    per_token = torch.where(teacher_mask.bool(), 0.5 * d**2, torch.zeros_like(d))
    return aggregate_loss(per_token, mask, agg_mode, norm_len=norm_len)


def distill_objective(
    mode: str,
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_mask: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float,
    agg_mode: str,
    norm_len: float | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation term added to the learner's objective on one micro-batch, and its detached metrics.

    ``'advantage'``: :func:`importance_sampling_loss` of :func:`distill_advantages` (coefficient inside the
    advantage); ``'loss'``: ``coef *`` :func:`k2_distill_loss`. Both aggregated with ``agg_mode`` over the trained
    tokens ``mask``, as the policy loss is (so the learner's normaliser applies unchanged), the tokens outside
    ``teacher_mask`` (no teacher log-prob) counting 0. Metrics: ``distill_reverse_kl`` (the k1 mean ``b_t - q_t``
    over the trained tokens with a teacher log-prob, with the sampler's log-probs), and ``distill_advantage_mean``
    (the mean distillation advantage over those tokens) or ``distill_loss`` (the term's value)."""
    if mode not in DISTILL_MODES:
        raise ValueError(f"unknown distillation mode {mode!r}; known: {list(DISTILL_MODES)}")
    m = teacher_mask.bool() & mask.bool()
    count = m.sum().clamp(min=1).to(torch.float32)
    with torch.no_grad():
        k1 = reverse_kl_k1(behavior_logprobs.float(), teacher_logprobs.float())
        metrics = {"distill_reverse_kl": invariant_sum(torch.where(m, k1, torch.zeros_like(k1))) / count}
    if mode == "advantage":
        adv = distill_advantages(behavior_logprobs, teacher_logprobs, m, coef)
        term = importance_sampling_loss(
            logprobs,
            behavior_logprobs,
            adv,
            mask,
            agg_mode=agg_mode,
            norm_len=norm_len,
            log_ratio_clamp=log_ratio_clamp,
        )
        metrics["distill_advantage_mean"] = invariant_sum(adv) / count
    else:
        term = float(coef) * k2_distill_loss(
            logprobs, teacher_logprobs, m, mask, agg_mode=agg_mode, norm_len=norm_len
        )
        metrics["distill_loss"] = term.detach()
    return term, metrics
