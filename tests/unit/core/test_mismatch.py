"""Rollout correction (r3_rllib.core.mismatch): importance weights, rejection, veto and diagnostics, by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from numeric import f32_tol, max_abs

from r3_rllib.core.mismatch import (
    RolloutCorrection,
    RunningMax,
    correction_from_config,
    micro_batch_share,
    normaliser_share,
    rescale_to_kept,
    rollout_correction,
)


def _two_sequences(second=(4.0, 1.0)):
    """Sequence 0: token ratios pi_trainer / pi_behaviour = 2.5, 1, 0.5; sequence 1: `second` and a pad."""
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.3, 0.9]]))
    behaviour = torch.log(torch.tensor([[0.2, 0.2, 0.2], [0.4 / second[0], 0.3 / second[1], 0.01]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return trainer, behaviour, mask


def test_token_weights_and_the_diagnostics_by_hand():
    trainer, behaviour, mask = _two_sequences()
    w, keep, d = rollout_correction(trainer, behaviour, mask, RolloutCorrection())
    # min(r, 2) per token; 1 at the pad.
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5], [2.0, 1.0, 1.0]]))
    assert keep.tolist() == mask.tolist()
    log_r = [math.log(2.5), 0.0, math.log(0.5), math.log(4.0), 0.0]
    k1 = -sum(log_r) / 5  # mean of log pi_behaviour - log pi_trainer
    k3 = sum(math.exp(x) - 1 - x for x in log_r) / 5
    # float32 log-probs carry ~1 ulp of their size each (|log 0.01| ~ 4.6 the largest); a mean of 5 differences of
    # them and exp(x) - 1 - x of values up to 4 then err by a few ulps of that: 8 float32 ulps of the largest
    # |log-prob| (~4.4e-6) for k1 and k3, and as a relative error for the perplexity ratio exp(-k1).
    tol = f32_tol(max_abs(trainer[mask], behaviour[mask]), ulps=8)
    assert float(d["k1"]) == pytest.approx(k1, abs=tol)
    assert float(d["k3"]) == pytest.approx(k3, abs=tol)
    # verl's ppl_ratio: per sequence ppl_trainer / ppl_behaviour = exp(mean_t(lp_b - lp_t)), then the mean over
    # sequences: sequence 0 (ratios 2.5, 1, 0.5) gives 1.25 ** (-1/3), sequence 1 (ratios 4, 1) 4 ** (-1/2).
    ppl_ratio = (1.25 ** (-1 / 3) + 0.5) / 2
    assert float(d["ppl_ratio"]) == pytest.approx(ppl_ratio, rel=tol)
    assert float(d["is_weight_mean"]) == pytest.approx((2 + 1 + 0.5 + 2 + 1) / 5)
    assert float(d["is_weight_max"]) == pytest.approx(2.0)
    for name in ("token_masked_frac", "seq_masked_frac", "token_zeroed_frac", "veto_frac"):
        assert float(d[name]) == 0.0


def test_sequence_weights_are_the_truncated_product_broadcast():
    trainer, behaviour, mask = _two_sequences()
    w, _, d = rollout_correction(trainer, behaviour, mask, RolloutCorrection(is_level="sequence"))
    # prod 2.5 * 1 * 0.5 = 1.25; 4 * 1 = 4, truncated to 2.
    torch.testing.assert_close(w, torch.tensor([[1.25, 1.25, 1.25], [2.0, 2.0, 1.0]]))
    assert float(d["is_weight_max"]) == pytest.approx(2.0)


def test_no_weight_gives_ones():
    trainer, behaviour, mask = _two_sequences()
    w, _, d = rollout_correction(trainer, behaviour, mask, RolloutCorrection(is_level=None))
    assert w.tolist() == [[1.0] * 3] * 2 and float(d["is_weight_mean"]) == 1.0


def test_token_rejection_drops_tokens_outside_the_band():
    trainer, behaviour, mask = _two_sequences()
    # Band [1/2, 2] (defaults: is_cap and its reciprocal): 2.5 and 4 leave, 0.5 stays (the band is closed).
    _, keep, d = rollout_correction(trainer, behaviour, mask, RolloutCorrection(rs_level="token"))
    assert keep.tolist() == [[False, True, True], [False, True, False]]
    assert float(d["token_masked_frac"]) == pytest.approx(2 / 5)
    assert float(d["seq_masked_frac"]) == 0.0
    assert float(d["is_weight_mean"]) == pytest.approx((1 + 0.5 + 1) / 3)  # over the kept tokens
    assert float(d["is_weight_max"]) == pytest.approx(1.0)


def test_sequence_and_geometric_rejection():
    trainer, behaviour, mask = _two_sequences(second=(1.05, 1.0))
    seq = RolloutCorrection(rs_level="sequence", rs_threshold=1.2, rs_threshold_lower=0.9)
    _, keep, d = rollout_correction(trainer, behaviour, mask, seq)
    # Products 1.25 (out of [0.9, 1.2]) and 1.05 (in).
    assert keep.tolist() == [[False] * 3, [True, True, False]]
    assert float(d["seq_masked_frac"]) == 0.5 and float(d["token_masked_frac"]) == pytest.approx(3 / 5)
    geo = RolloutCorrection(rs_level="geometric", rs_threshold=1.05, rs_threshold_lower=0.95)
    _, keep, d = rollout_correction(trainer, behaviour, mask, geo)
    # Geometric means 1.25 ** (1/3) = 1.077 (out of [0.95, 1.05]) and sqrt(1.05) = 1.0247 (in).
    assert keep.tolist() == [[False] * 3, [True, True, False]]
    geo = RolloutCorrection(rs_level="geometric", rs_threshold=1.1, rs_threshold_lower=0.95)
    _, keep, _ = rollout_correction(trainer, behaviour, mask, geo)
    assert keep.tolist() == mask.tolist()  # 1.077 is inside [0.95, 1.1]: the product 1.25 would not be


def test_icepop_zeroes_out_of_band_tokens_and_keeps_them_in_the_count():
    trainer, behaviour, mask = _two_sequences()
    w, keep, d = rollout_correction(trainer, behaviour, mask, RolloutCorrection(rs_level="icepop"))
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.5], [0.0, 1.0, 1.0]]))
    assert keep.tolist() == mask.tolist()
    assert float(d["token_zeroed_frac"]) == pytest.approx(2 / 5) and float(d["token_masked_frac"]) == 0.0
    assert not RolloutCorrection(rs_level="icepop").rejects and RolloutCorrection(rs_level="token").rejects


def test_veto_rejects_a_sequence_with_one_near_impossible_token():
    trainer, behaviour, mask = _two_sequences(second=(1e-5, 1.0))
    corr = RolloutCorrection(veto_threshold=1e-4)
    assert corr.rejects
    _, keep, d = rollout_correction(trainer, behaviour, mask, corr)
    assert keep.tolist() == [[True] * 3, [False] * 3]
    assert float(d["veto_frac"]) == 0.5 and float(d["seq_masked_frac"]) == 0.5


def test_identical_logprobs_show_no_mismatch():
    trainer, _, mask = _two_sequences()
    corr = RolloutCorrection(rs_level="geometric", rs_threshold=1.001, veto_threshold=1e-4)
    w, keep, d = rollout_correction(trainer, trainer.clone(), mask, corr)
    assert keep.tolist() == mask.tolist() and w.tolist() == [[1.0] * 3] * 2
    assert float(d["k1"]) == 0.0 and float(d["k3"]) == 0.0 and float(d["ppl_ratio"]) == 1.0
    assert float(d["token_masked_frac"]) == 0.0 and float(d["seq_masked_frac"]) == 0.0


def test_settings_are_checked_and_read_from_a_config():
    with pytest.raises(ValueError, match="rollout_is"):
        RolloutCorrection(is_level="seq")
    with pytest.raises(ValueError, match="rollout_rs"):
        RolloutCorrection(rs_level="tok")
    with pytest.raises(ValueError, match="lower < upper"):
        RolloutCorrection(rs_level="token", rs_threshold=1.1, rs_threshold_lower=1.2)
    with pytest.raises(ValueError, match="veto"):
        RolloutCorrection(veto_threshold=1.0)
    assert RolloutCorrection(rs_threshold=4.0).rs_band == (0.25, 4.0)
    cfg = SimpleNamespace(
        is_cap=3.0,
        rollout_is="sequence",
        rollout_rs="geometric",
        rollout_rs_threshold=1.001,
        rollout_rs_threshold_lower=None,
        rollout_token_veto_threshold=None,
    )
    corr = correction_from_config(cfg, weighted=True)
    assert (corr.is_level, corr.is_threshold, corr.rs_level) == ("sequence", 3.0, "geometric")
    assert correction_from_config(cfg, weighted=False).is_level is None  # off_policy_correction off


def test_shares_rescale_and_running_max():
    m = {"mismatch_token_masked_frac": 0.25, "mismatch_seq_masked_frac": 0.5}
    assert normaliser_share(m, "token-mean") == 0.75
    assert normaliser_share(m, "seq-mean-token-mean") == normaliser_share(m, "seq-mean-token-sum-norm") == 0.5
    assert micro_batch_share(m, "seq-mean-token-sum-norm") == 1.0  # its normaliser counts all rows
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.tensor([1.0, -3.0])
    rescale_to_kept([p], m, "token-mean")
    torch.testing.assert_close(p.grad, torch.tensor([4 / 3, -4.0]))
    rescale_to_kept(
        [p], {"mismatch_token_masked_frac": 1.0}, "token-mean"
    )  # all rejected: no gradient anyway
    torch.testing.assert_close(p.grad, torch.tensor([4 / 3, -4.0]))
    running = RunningMax()
    for value, real in ((1.5, True), (3.0, False), (1.2, True)):
        metrics = {"mismatch_is_weight_max": torch.tensor(value), "loss": torch.tensor(0.0)}
        running.take(metrics, real)
        assert "mismatch_is_weight_max" not in metrics and "loss" in metrics
    assert running.read() == {"mismatch_is_weight_max": 1.5}  # the padding pass's 3.0 does not count


def test_rl_objective_drops_rejected_tokens_from_the_loss_and_its_count():
    from r3_rllib.core.losses import rl_objective

    zeros = torch.zeros(1, 3)
    behaviour = torch.log(torch.tensor([[0.4, 1.0, 1.0]]))  # token 0: ratio 2.5, rejected at band [0.5, 2]
    mask = torch.ones(1, 3)
    params = {"clip_low": 0.2, "clip_high": 0.2, "agg_mode": "token-mean", "norm_len": None}
    adv = torch.tensor([2.0])
    # Ratio 1 to the proximal policy: per-token loss -A * w = -2 on the two kept tokens, over 2 (not 3) tokens.
    loss, m = rl_objective(
        zeros, zeros, behaviour, adv, mask, loss_params=params, correction=RolloutCorrection(rs_level="token")
    )
    assert float(loss) == pytest.approx(-2.0)
    assert float(m["mismatch_token_masked_frac"]) == pytest.approx(1 / 3)
    # Without rejection: the weight min(2.5, 2) on token 0: (-4 - 2 - 2) / 3.
    loss, m = rl_objective(
        zeros, zeros, behaviour, adv, mask, loss_params=params, correction=RolloutCorrection()
    )
    assert float(loss) == pytest.approx(-8 / 3)
