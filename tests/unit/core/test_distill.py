"""On-policy distillation's terms (r3_rllib/core/distill.py): values by hand on small tensors, and the gradients by
exact enumeration over a tiny vocabulary: on tokens sampled from the student, k2's expected gradient (and the
advantage mode's) is the reverse KL's; k1's is zero."""

from __future__ import annotations

import pytest
import torch

from r3_rllib.core.distill import (
    distill_advantages,
    distill_objective,
    importance_sampling_loss,
    k2_distill_loss,
    reverse_kl_k1,
)

B = torch.tensor([[-1.0, -2.0]])  # the sampler's log-probs
Q = torch.tensor([[-1.5, -1.0]])  # the teacher's
ALL = torch.ones(1, 2, dtype=torch.bool)


def test_advantages_by_hand():
    # -coef * (b - q) = -0.5 * [0.5, -1.0]
    adv = distill_advantages(B, Q, ALL, 0.5)
    assert torch.allclose(adv, torch.tensor([[-0.25, 0.5]]))
    assert not adv.requires_grad
    # A token without a teacher log-prob gets no distillation advantage.
    adv = distill_advantages(B, Q, torch.tensor([[True, False]]), 0.5)
    assert torch.allclose(adv, torch.tensor([[-0.25, 0.0]]))


def test_importance_sampling_loss_by_hand():
    adv = torch.tensor([[-0.25, 0.5]])
    # At logp == b the ratio is 1: -mean(A) = -(0.25) / 2.
    loss = importance_sampling_loss(B.clone(), B, adv, ALL, agg_mode="token-mean")
    assert loss.item() == pytest.approx(-0.125)
    # logp one nat above b on the first token: ratio e there.
    logp = torch.tensor([[0.0, -2.0]])
    loss = importance_sampling_loss(logp, B, adv, ALL, agg_mode="token-mean")
    assert loss.item() == pytest.approx(-(-0.25 * torch.e + 0.5) / 2)
    # The log-ratio clamp bounds it: clamp 0.5 gives e^0.5.
    loss = importance_sampling_loss(logp, B, adv, ALL, agg_mode="token-mean", log_ratio_clamp=0.5)
    assert loss.item() == pytest.approx(-(-0.25 * torch.e**0.5 + 0.5) / 2)


def test_k2_loss_by_hand_and_missing_teacher_counts_zero():
    # 0.5 * ((0.5)^2 + (-1)^2) / 2 tokens
    assert k2_distill_loss(B, Q, ALL, ALL, agg_mode="token-mean").item() == pytest.approx(0.3125)
    # Second token without a teacher log-prob: it counts 0 but stays in the normaliser (the learner's count).
    partial = torch.tensor([[True, False]])
    assert k2_distill_loss(B, Q, partial, ALL, agg_mode="token-mean").item() == pytest.approx(0.0625)
    # seq-mean-token-sum-norm with norm_len 4: (0.125 + 0.5) / 4.
    value = k2_distill_loss(B, Q, ALL, ALL, agg_mode="seq-mean-token-sum-norm", norm_len=4).item()
    assert value == pytest.approx(0.15625)


def test_objective_terms_and_metrics():
    loss_term, metrics = distill_objective("loss", B.clone(), B, Q, ALL, ALL, coef=2.0, agg_mode="token-mean")
    assert loss_term.item() == pytest.approx(2 * 0.3125)
    assert metrics["distill_loss"].item() == pytest.approx(0.625)
    # k1 mean with the sampler's log-probs: (0.5 - 1.0) / 2
    assert metrics["distill_reverse_kl"].item() == pytest.approx(-0.25)
    adv_term, metrics = distill_objective(
        "advantage", B.clone(), B, Q, ALL, ALL, coef=0.5, agg_mode="token-mean"
    )
    assert adv_term.item() == pytest.approx(-0.125)
    assert metrics["distill_advantage_mean"].item() == pytest.approx(0.125)
    # Only trained tokens with a teacher log-prob enter the metrics.
    _, metrics = distill_objective(
        "loss", B.clone(), B, Q, torch.tensor([[True, False]]), ALL, coef=1.0, agg_mode="token-mean"
    )
    assert metrics["distill_reverse_kl"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown distillation mode"):
        distill_objective("forward", B, B, Q, ALL, ALL, coef=1.0, agg_mode="token-mean")
    assert torch.equal(reverse_kl_k1(B, Q), torch.tensor([[0.5, -1.0]]))


def _expected_gradient(z: torch.Tensor, w: torch.Tensor, term) -> torch.Tensor:
    """sum_y p(y) * grad_z term(y): the expected gradient of a per-token term over a token y sampled from the
    student p = softmax(z), every token of the vocabulary enumerated, weighted by its (detached) probability."""
    p = torch.softmax(z, -1).detach()
    total = torch.zeros_like(z)
    for y in range(z.shape[-1]):
        zz = z.detach().clone().requires_grad_(True)
        logp = torch.log_softmax(zz, -1)[y].reshape(1, 1)
        q = torch.log_softmax(w, -1)[y].reshape(1, 1)
        (grad,) = torch.autograd.grad(term(logp, q), zz)
        total += p[y] * grad
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k2_expected_gradient_is_the_reverse_kl_gradient_and_k1_is_zero(seed):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(5, generator=gen, dtype=torch.float64)  # student logits over a 5-token vocabulary
    w = torch.randn(5, generator=gen, dtype=torch.float64)  # teacher logits
    one = torch.ones(1, 1, dtype=torch.bool)
    zz = z.clone().requires_grad_(True)
    p, logp, logq = torch.softmax(zz, -1), torch.log_softmax(zz, -1), torch.log_softmax(w, -1)
    (kl_grad,) = torch.autograd.grad((p * (logp - logq)).sum(), zz)  # exact KL(student || teacher)
    assert kl_grad.abs().max() > 1e-3  # a real gradient to match

    k2 = _expected_gradient(z, w, lambda lp, q: k2_distill_loss(lp, q, one, one, agg_mode="token-mean"))
    assert torch.allclose(k2, kl_grad, atol=1e-12)

    def k1(lp, q):  # the "KL loss" that is not one: the mean of logp - q
        return reverse_kl_k1(lp, q).mean()

    assert torch.allclose(_expected_gradient(z, w, k1), torch.zeros(5, dtype=torch.float64), atol=1e-12)

    def advantage_mode(lp, q):  # on-policy: the sampler's log-prob is the current one
        b = lp.detach()
        return distill_objective("advantage", lp, b, q, one, one, coef=1.0, agg_mode="token-mean")[0]

    assert torch.allclose(_expected_gradient(z, w, advantage_mode), kl_grad, atol=1e-12)
