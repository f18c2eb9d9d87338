"""Issue 36: our defaults are the reference implementations' formulas (verl, verl-agent). Each test checks numbers
computed by hand (written in the comments) on inputs small enough to follow; tolerances are a few float32 ulps of
the values' scale (the losses run in float32) or float64 rounding."""

import math

import numpy as np
import pytest
import torch

from r3_rllib.core.losses import gspo_policy_loss, gspo_token_policy_loss
from r3_rllib.core.mismatch import RolloutCorrection, rollout_correction

EPS32 = float(torch.finfo(torch.float32).eps)


def _grad(fn, logprobs, old, adv, mask, **kw):
    lp = logprobs.clone().requires_grad_(True)
    loss, _ = fn(lp, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), lp.grad


def test_gspo_scales_each_token_by_its_own_rollout_weight_as_verl():
    # One sequence of two tokens, on-policy (s_i = 1), A = 1, token weights w = [0.5, 1.5].
    # verl: loss = mean_t(-A * s_i * w_t) = -(0.5 + 1.5) / 2 = -1; d loss / d logp_t = -A * s_i * w_t / L
    # = [-0.25, -0.75] (each token its own weight). Weighting the sequence term by mean(w) = 1 would give
    # [-0.5, -0.5].
    lp = torch.zeros(1, 2)
    adv = torch.ones(1)
    mask = torch.ones(1, 2)
    w = torch.tensor([[0.5, 1.5]])
    for fn in (gspo_policy_loss, gspo_token_policy_loss):
        loss, grad = _grad(fn, lp, lp.clone(), adv, mask, is_weights=w)
        assert loss.item() == pytest.approx(-1.0, abs=4 * EPS32)
        torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.75]]), rtol=0, atol=4 * EPS32)
    # Without weights GSPO keeps its sequence-level gradient: -A * s_i / L = -0.5 for each token.
    _, grad = _grad(gspo_policy_loss, lp, lp.clone(), adv, mask)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5]]), rtol=0, atol=4 * EPS32)


def _ratios(k):
    """trainer/behaviour log-probs whose ratios are ``k`` (behaviour log-probs 0)."""
    return torch.log(torch.tensor([k], dtype=torch.float32)), torch.zeros(1, len(k))


@pytest.mark.parametrize(
    "correction",
    [
        # The band's upper bound 2.0 above is_cap 1.5: the weight is the ratio up to 2.0, not min(r, 1.5).
        RolloutCorrection(
            is_level="token", is_threshold=1.5, rs_level="icepop", rs_threshold=2.0, rs_threshold_lower=0.5
        ),
        # No importance weight asked for (off_policy_correction=False): IcePop's M(k) still applies.
        RolloutCorrection(
            is_level=None, is_threshold=1.5, rs_level="icepop", rs_threshold=2.0, rs_threshold_lower=0.5
        ),
    ],
)
def test_icepop_weight_is_the_ratio_inside_the_band_and_zero_outside(correction):
    # Ratios k = [0.4, 1.0, 1.8, 3.0], band [0.5, 2.0]: M(k) = [0, 1.0, 1.8, 0]; every token kept in the count.
    trainer, behaviour = _ratios([0.4, 1.0, 1.8, 3.0])
    w, keep, diag = rollout_correction(trainer, behaviour, torch.ones(1, 4), correction)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 1.8, 0.0]]), rtol=4 * EPS32, atol=0)
    assert keep.all()
    assert diag["token_zeroed_frac"].item() == 0.5 and diag["token_masked_frac"].item() == 0.0


def test_icepop_with_a_sequence_weight_is_refused():
    from r3_rllib.algorithms.r3.config import R3Config

    with pytest.raises(ValueError, match="rollout_is 'sequence' would be ignored; set rollout_is='token'"):
        R3Config().training(rollout_rs="icepop", rollout_is="sequence").validate()


def test_mismatch_ppl_ratio_is_verls_trainer_over_rollout_per_sequence_mean():
    # Sequence 1: two tokens, trainer log-probs [-1, -3], behaviour [-2, -2]: mean_t(behav - trainer) = (-1 + 1)/2
    # = 0 -> ratio 1. Sequence 2: one token, trainer -2, behaviour -1: behav - trainer = 1 -> ratio e.
    # verl: mean over sequences of exp(...) = (1 + e) / 2 = 1.859...; the pooled behaviour/trainer ratio was
    # exp(mean over the 3 tokens of trainer - behav) = exp((1 - 1 - 1) / 3) = 0.7165.
    trainer = torch.tensor([[-1.0, -3.0], [-2.0, 0.0]])
    behaviour = torch.tensor([[-2.0, -2.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    _, _, diag = rollout_correction(trainer, behaviour, mask, RolloutCorrection())
    assert diag["ppl_ratio"].item() == pytest.approx((1 + math.e) / 2, rel=4 * EPS32)
    # A row without tokens does not count among the sequences.
    pad = torch.zeros(1, 2)
    _, _, diag = rollout_correction(
        torch.cat([trainer, pad]),
        torch.cat([behaviour, pad]),
        torch.cat([mask, torch.zeros(1, 2, dtype=torch.long)]),
        RolloutCorrection(),
    )
    assert diag["ppl_ratio"].item() == pytest.approx((1 + math.e) / 2, rel=4 * EPS32)


def test_hgpo_single_step_row_query_gets_reward_over_one_plus_eps():
    from r3_rllib.core.hgpo import hgpo_advantages

    # One query, one trajectory of one step, reward 0.8: verl-agent's group of one has mean 0 and std 1, so the
    # episode group gives 0.8 / (1 + 1e-6); the step level (a group of one) says nothing.
    kw = dict(obs_keys=["s"], traj_ids=["t"], step_indices=[0], step_rewards=[0.8], base_group=True, eps=1e-6)
    np.testing.assert_allclose(hgpo_advantages(**kw), [0.8 / (1 + 1e-6)], rtol=1e-15)
    np.testing.assert_allclose(hgpo_advantages(**kw, mode="mean_norm"), [0.8], rtol=1e-15)


def test_r2po_stage_a_kl_is_the_references_unclamped_k3_by_default():
    from types import SimpleNamespace

    from r3_rllib.core.losses import kl_penalty
    from r3_rllib.r2po.method import stage_head_kl_type

    # d = ref - logp = 3: k3 = e^3 - 3 - 1 = 16.0855...; clamped (verl's low_var_kl) it is 10.
    logp, ref = torch.zeros(1, 1), torch.full((1, 1), 3.0)
    expected = math.exp(3.0) - 4.0
    assert kl_penalty(logp, ref, "k3_unclamped").item() == pytest.approx(expected, rel=4 * EPS32)
    assert kl_penalty(logp, ref, "k3").item() == 10.0
    assert stage_head_kl_type(SimpleNamespace(rollout_head_kl_clamp=False)) == "k3_unclamped"
    assert stage_head_kl_type(SimpleNamespace(rollout_head_kl_clamp=True)) == "k3"
