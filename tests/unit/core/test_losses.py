import math

import pytest
import torch
from numeric import EPS32, TORCH_THREADS, f32_tol, f64_tol

from r3_rllib.core.losses import (
    LOSS_FNS,
    TOKEN_ADVANTAGE_LOSSES,
    aggregate_loss,
    clipped_policy_loss,
    entropy_from_logits,
    get_loss_fn,
    kl_penalty,
    truncated_importance_weights,
)

torch.set_num_threads(TORCH_THREADS)

# Two sequences of lengths 3 and 1 (T = 4).
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_token_mean():
    # (1 + 2 + 3 + 4) / 4 tokens
    assert aggregate_loss(PER_TOKEN, MASK, "token-mean").item() == pytest.approx(2.5)


def test_seq_mean_token_mean():
    # mean(2, 4) = 3
    assert aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-mean").item() == pytest.approx(3.0)


def test_seq_mean_token_mean_skips_empty_sequences():
    x = torch.tensor([[1.0, 3.0], [9.0, 9.0]])
    m = torch.tensor([[1, 1], [0, 0]])
    assert aggregate_loss(x, m, "seq-mean-token-mean").item() == pytest.approx(2.0)


def test_seq_mean_token_sum_by_hand():
    """verl's 'seq-mean-token-sum': sums 6 and 4, mean 5; a sequence with no valid token is not counted (verl
    divides by every row; rows without a trained token come only from a rejecting rollout correction)."""
    assert aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum").item() == pytest.approx(5.0)
    x = torch.tensor([[1.0, 3.0], [9.0, 9.0]])
    assert aggregate_loss(x, torch.tensor([[1, 1], [0, 0]]), "seq-mean-token-sum").item() == pytest.approx(
        4.0
    )


def test_seq_mean_token_sum_norm():
    # sums 6 and 4, / norm_len 8 -> 0.75, 0.5 -> mean 0.625
    assert aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm", norm_len=8).item() == pytest.approx(
        0.625
    )
    # default norm_len = T = 4 -> 1.5, 1.0 -> 1.25
    assert aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="norm_len"):
        aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm", norm_len=0)


def test_aggregate_errors_and_empty_mask():
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate_loss(PER_TOKEN, MASK, "sum")
    with pytest.raises(ValueError, match="shape mismatch"):
        aggregate_loss(PER_TOKEN, MASK[:, :3], "token-mean")
    x = torch.ones(2, 3, requires_grad=True)
    out = aggregate_loss(x, torch.zeros(2, 3), "token-mean")
    assert out.item() == 0.0 and out.requires_grad


def _loss(ratios, advs, clip_low=0.2, clip_high=0.28, **kw):
    """Per-token losses for one-token sequences with the given ratios and advantages."""
    r = torch.tensor(ratios, dtype=torch.float64)
    logp = torch.log(r).unsqueeze(-1).requires_grad_(True)
    old = torch.zeros_like(logp)
    mask = torch.ones_like(logp)
    loss, metrics = clipped_policy_loss(
        logp,
        old,
        torch.tensor(advs, dtype=torch.float64),
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        agg_mode="seq-mean-token-sum-norm",
        norm_len=1,
        **kw,
    )
    return loss, metrics, logp


def test_clip_higher_positive_advantage():
    # ratio 1.5 > 1 + 0.28 with A = +1: clipped at 1.28 and no gradient
    loss, metrics, logp = _loss([1.5], [1.0])
    assert loss.item() == pytest.approx(-1.28)
    loss.backward()
    assert logp.grad.abs().sum().item() == 0.0
    assert metrics["clip_frac_high"].item() == 1.0 and metrics["clip_frac_low"].item() == 0.0


def test_clip_low_negative_advantage():
    # ratio 0.5 < 1 - 0.2 with A = -1: clipped at 0.8 -> loss 0.8, no gradient
    loss, metrics, logp = _loss([0.5], [-1.0])
    assert loss.item() == pytest.approx(0.8)
    loss.backward()
    assert logp.grad.abs().sum().item() == 0.0
    assert metrics["clip_frac_low"].item() == 1.0 and metrics["clip_frac_high"].item() == 0.0


@pytest.mark.parametrize(
    "ratio, adv",
    [
        (1.2, 1.0),  # inside [0.8, 1.28]
        (0.9, -1.0),  # inside
        (1.27, 2.0),  # just below the higher clip (would be clipped with symmetric 0.2)
        (0.5, 1.0),  # below the low clip but A > 0: the unclipped term is the pessimistic one
        (1.5, -1.0),  # above the high clip but A < 0: unclipped
    ],
)
def test_unclipped_cases(ratio, adv):
    loss, metrics, logp = _loss([ratio], [adv])
    assert loss.item() == pytest.approx(-adv * ratio)
    loss.backward()
    # d(-A r)/d logp = -A r
    assert logp.grad.item() == pytest.approx(-adv * ratio)
    assert metrics["clip_frac_low"].item() == 0.0 and metrics["clip_frac_high"].item() == 0.0


def test_metrics_hand_computed():
    loss, metrics, _ = _loss([1.5, 0.5, 1.0, 1.1], [1.0, -1.0, 1.0, 1.0])
    assert metrics["clip_frac_high"].item() == pytest.approx(0.25)
    assert metrics["clip_frac_low"].item() == pytest.approx(0.25)
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1.0 + 1.1) / 4)
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.0, 1.1)]
    assert metrics["approx_kl"].item() == pytest.approx(sum(k3) / 4)
    assert all(not v.requires_grad for v in metrics.values())


def test_is_weights_scale_per_token_loss_and_are_detached():
    w = torch.tensor([[2.0], [0.5]], dtype=torch.float64, requires_grad=True)
    loss, metrics, logp = _loss([1.0, 1.0], [1.0, 1.0], is_weights=w)
    # per-token -A*r = -1 each, times weights 2 and 0.5 -> mean(-2, -0.5) = -1.25
    assert loss.item() == pytest.approx(-1.25)
    loss.backward()
    assert w.grad is None  # weights are constants of the loss
    assert logp.grad.squeeze(-1).tolist() == pytest.approx([-1.0, -0.25])  # -A r w / B
    assert metrics["is_weight_mean"].item() == pytest.approx(1.25)


def test_gradient_only_on_valid_tokens_and_not_on_old_logprobs():
    logp = torch.zeros(2, 3, requires_grad=True)
    old = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, -1.0], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = clipped_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg_mode="token-mean")
    loss.backward()
    # token-mean over 3 valid tokens: d/dlogp = -A / 3 on valid tokens, 0 on padding
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    assert old.grad is None and adv.grad is None


def test_clipped_loss_validation():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3)
    kw = dict(clip_low=0.2, clip_high=0.2, agg_mode="token-mean")
    with pytest.raises(ValueError, match="advantages must be"):
        clipped_policy_loss(x, x, torch.zeros(3), m, **kw)
    with pytest.raises(ValueError, match="shape mismatch"):
        clipped_policy_loss(x, torch.zeros(2, 4), torch.zeros(2), m, **kw)
    with pytest.raises(ValueError, match="clip_low"):
        clipped_policy_loss(x, x, torch.zeros(2), m, clip_low=1.0, clip_high=0.2, agg_mode="token-mean")
    with pytest.raises(ValueError, match="is_weights"):
        clipped_policy_loss(x, x, torch.zeros(2), m, is_weights=torch.ones(2), **kw)


def test_dual_clip_caps_negative_advantages_at_c():
    # c = 3: ratio 4, A = -1: PPO's max(4 * 1, 1.28 * 1) = 4, capped at 3 -> no gradient; ratio 2.5 stays 2.5 (grad
    # -A r = 2.5); ratio 4 with A = +1 is the ordinary clip-higher (-1.28); ratio 1 with A = -1 gives 1.
    loss, metrics, logp = _loss([4.0, 2.5, 4.0, 1.0], [-1.0, -1.0, 1.0, -1.0], clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.5 - 1.28 + 1.0) / 4)
    loss.backward()
    assert logp.grad.squeeze(-1).tolist() == pytest.approx([0.0, 2.5 / 4, 0.0, 1.0 / 4])
    assert metrics["clip_frac_dual"].item() == pytest.approx(0.25)
    # A = -2, ratio 5: capped at -A * c = 6; off (None), the loss is -A r = 10
    assert _loss([5.0], [-2.0], clip_ratio_c=3.0)[0].item() == pytest.approx(6.0)
    off, off_metrics, _ = _loss([5.0], [-2.0])
    assert off.item() == pytest.approx(10.0) and off_metrics["clip_frac_dual"].item() == 0.0


def test_log_ratio_clamp_before_exp():
    # clamp 0.1: log-ratio 0.15 -> ratio e^0.1 = 1.10517 (A = +1, below 1.28: unclipped), no gradient through the
    # clamp; log-ratio -0.05 is inside: ratio e^-0.05 = 0.95123, gradient -A r = -0.95123 (two sequences, / 2).
    logp = torch.tensor([[0.15], [-0.05]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(logp)
    kw = dict(clip_low=0.2, clip_high=0.28, agg_mode="seq-mean-token-sum-norm", norm_len=1)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, metrics = clipped_policy_loss(logp, old, adv, torch.ones_like(logp), log_ratio_clamp=0.1, **kw)
    assert loss.item() == pytest.approx(-(math.exp(0.1) + math.exp(-0.05)) / 2)
    loss.backward()
    assert logp.grad.squeeze(-1).tolist() == pytest.approx([0.0, -math.exp(-0.05) / 2])
    assert metrics["ratio_mean"].item() == pytest.approx((math.exp(0.1) + math.exp(-0.05)) / 2)
    # verl's 20: a log-ratio of 100 (e^100 overflows fp32) gives the finite e^20 with A = -1, and with the dual clip 3
    big = torch.tensor([[100.0]], requires_grad=True)
    neg = torch.tensor([-1.0])
    clamped, _ = clipped_policy_loss(
        big, torch.zeros(1, 1), neg, torch.ones(1, 1), log_ratio_clamp=20.0, **kw
    )
    # One float32 exp and a product by -1: a few ulps of the value (8 float32 eps, relative).
    assert clamped.item() == pytest.approx(math.exp(20.0), rel=8 * EPS32)
    raw, _ = clipped_policy_loss(big, torch.zeros(1, 1), neg, torch.ones(1, 1), **kw)
    assert math.isinf(raw.item())
    both, _ = clipped_policy_loss(
        big, torch.zeros(1, 1), neg, torch.ones(1, 1), log_ratio_clamp=20.0, clip_ratio_c=3.0, **kw
    )
    assert both.item() == pytest.approx(3.0)


def test_dual_clip_and_clamp_validation_and_config_defaults():
    x, m = torch.zeros(1, 1), torch.ones(1, 1)
    kw = dict(clip_low=0.2, clip_high=0.2, agg_mode="token-mean")
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        clipped_policy_loss(x, x, torch.zeros(1), m, clip_ratio_c=1.0, **kw)
    with pytest.raises(ValueError, match="log_ratio_clamp must be > 0"):
        clipped_policy_loss(x, x, torch.zeros(1), m, log_ratio_clamp=0.0, **kw)
    from r3_rllib.algorithms.r3.config import R3Config

    params = LOSS_FNS.params_from("clipped_pg", R3Config.grpo_preset())
    assert params["clip_ratio_c"] == 3.0 and params["log_ratio_clamp"] == 20.0  # verl's, on by default
    R3Config.grpo_preset().training(clip_ratio_c=None, log_ratio_clamp=None).validate()
    with pytest.raises(ValueError, match="clip_ratio_c must be finite and > 1"):
        R3Config.grpo_preset().training(clip_ratio_c=0.5).validate()
    with pytest.raises(ValueError, match="log_ratio_clamp must be finite and > 0"):
        R3Config.grpo_preset().training(log_ratio_clamp=-1.0).validate()


def test_kl_kinds_hand_computed():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.4)])
    d = [math.log(0.5 / 0.25), math.log(0.2 / 0.4)]  # logp - ref = ln 2, -ln 2
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor(d))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.5 * x * x for x in d]))
    # k3 = exp(ref - logp) - (ref - logp) - 1: ratios 0.5 and 2
    k3 = [0.5 + math.log(2) - 1, 2 - math.log(2) - 1]
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.tensor(k3))
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    torch.testing.assert_close(
        kl_penalty(logp, ref, "abs"), torch.tensor([math.log(2), math.log(2)])
    )  # verl's abs
    with pytest.raises(ValueError, match="unknown KL kind"):
        kl_penalty(logp, ref, "k4")


def test_k3_is_clamped_at_ten_like_verl():
    """d = ref - logp; k3 = e^d - d - 1 reaches 10 at d ~ 2.611 and d ~ -11.0. Inside, the value and gradient are
    the unclamped ones; outside, the value is 10 with no gradient; a huge d (e^100 overflows fp32) stays finite."""
    d = torch.tensor([2.6, 2.62, -10.99, -11.01, 100.0, -100.0])
    logp = torch.zeros(6, requires_grad=True)
    k3 = kl_penalty(logp, d, "k3")
    e26, e_1099 = math.exp(2.6), math.exp(-10.99)
    expected = [e26 - 3.6, 10.0, e_1099 + 9.99, 10.0, 10.0, 10.0]
    # float32 e^d - d - 1 against float64: each of the 3 terms rounds to half an ulp of the largest one (e^2.6 ~ 13.5;
    # exp itself to ~1 ulp), so 8 float32 ulps of e^2.6 (1.3e-5) bound the value and the gradient alike.
    tol = f32_tol(e26, ulps=8)
    torch.testing.assert_close(k3.detach(), torch.tensor(expected), rtol=0, atol=tol)
    k3.sum().backward()
    # d k3 / d logp = -(e^d - 1) inside the clamp, 0 outside (and finite everywhere, not nan)
    grad_inside = [-(e26 - 1.0), 0.0, -(e_1099 - 1.0), 0.0, 0.0, 0.0]
    torch.testing.assert_close(logp.grad, torch.tensor(grad_inside), rtol=0, atol=tol)
    # k1 and k2 are not clamped
    assert kl_penalty(logp.detach(), d, "k1")[4].item() == -100.0
    assert kl_penalty(logp.detach(), d, "k2")[4].item() == 5000.0


def test_truncated_importance_weights():
    prox = torch.tensor([0.0, math.log(3.0), math.log(0.5)], requires_grad=True)
    behav = torch.zeros(3)
    w = truncated_importance_weights(prox, behav, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0, 0.5]))
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(prox, behav, cap=0.0)


def test_entropy_from_logits():
    uniform = torch.zeros(2, 4)
    torch.testing.assert_close(entropy_from_logits(uniform), torch.full((2,), math.log(4)))
    # p = (0.5, 0.5, 0) with a masked entry: ln 2, finite
    logits = torch.tensor([[1.0, 1.0, -float("inf")]], requires_grad=True)
    h = entropy_from_logits(logits)
    torch.testing.assert_close(h.detach(), torch.tensor([math.log(2)]))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    # large logits stay stable: near-deterministic distribution has ~0 entropy
    # (entropy = -sum p log p over probabilities <= 1: a few float32 ulps of 1, the scale of its terms)
    assert entropy_from_logits(torch.tensor([1000.0, 0.0])).item() == pytest.approx(0.0, abs=4 * EPS32)


def test_loss_registry():
    assert LOSS_FNS["clipped_pg"] is clipped_policy_loss
    assert get_loss_fn("clipped_pg") is clipped_policy_loss
    with pytest.raises(KeyError, match="unknown policy loss"):
        get_loss_fn("nope")


def _token_weight(cap: float):
    """The token-level truncated importance weight min(pi_old / pi_behaviour, cap), no rejection."""
    from r3_rllib.core.mismatch import RolloutCorrection

    return RolloutCorrection(is_level="token", is_threshold=cap)


def test_rl_objective_combines_the_named_loss_importance_weights_and_kl_by_hand():
    from r3_rllib.core.losses import rl_objective

    zeros = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    params = {"clip_low": 0.2, "clip_high": 0.2, "agg_mode": "token-mean", "norm_len": None}
    # Ratio 1 and importance weight 1: per-token loss -A, i.e. -2, -2, +1 over the 3 valid tokens.
    loss, m = rl_objective(zeros, zeros, zeros, adv, mask, loss_params=params, correction=_token_weight(2.0))
    assert float(loss) == pytest.approx(-1.0)
    assert float(m["is_weight_mean"]) == pytest.approx(1.0) and float(m["kl"]) == 0.0
    # k3 with ref - logp = -0.1 on every token: exp(-0.1) + 0.1 - 1 = 0.0048374, times kl_coef 0.5.
    loss, m = rl_objective(
        zeros, zeros, zeros, adv, mask, loss_params=params, ref_logprobs=zeros - 0.1, kl_coef=0.5
    )
    k3 = math.exp(-0.1) + 0.1 - 1.0
    # float32 k3 cancels terms of size ~1 (8 ulps of 1); the loss averages terms of size 2 (8 ulps of 2).
    assert float(m["kl"]) == pytest.approx(k3, abs=f32_tol(1.0, ulps=8))
    assert float(loss) == pytest.approx(-1.0 + 0.5 * k3, abs=f32_tol(2.0, ulps=8))
    assert "is_weight_mean" not in m  # no correction asked for
    # The behaviour policy found the first token half as likely as the proximal one: weight min(2, cap 1.5).
    behav = torch.tensor([[-0.6931472, 0.0], [0.0, 0.0]])
    loss, m = rl_objective(zeros, zeros, behav, adv, mask, loss_params=params, correction=_token_weight(1.5))
    assert float(loss) == pytest.approx((-2 * 1.5 - 2 + 1) / 3, abs=f32_tol(3.0, ulps=8))  # terms up to 3


def test_rl_objective_calls_a_loss_registered_by_name():
    from r3_rllib.core.losses import LOSS_FNS, register_loss, rl_objective

    @register_loss("test_plain_pg", config_params={"agg_mode": "loss_agg_mode"})
    def plain_pg(logprobs, old_logprobs, advantages, mask, *, agg_mode, is_weights=None):
        per_token = -advantages.unsqueeze(-1) * logprobs
        return aggregate_loss(per_token, mask, agg_mode), {"plain": per_token.sum().detach()}

    try:
        lp = torch.tensor([[-1.0, -2.0]])
        loss, m = rl_objective(
            lp,
            lp,
            lp,
            torch.tensor([1.0]),
            torch.ones(1, 2),
            policy_loss="test_plain_pg",
            loss_params={"agg_mode": "token-mean"},
        )
        assert float(loss) == pytest.approx(1.5) and float(m["plain"]) == pytest.approx(3.0)
    finally:
        del LOSS_FNS["test_plain_pg"]


# -- GSPO, GSPO-token, CISPO -------------------------------------------------------------------------------------------
# Two sequences of lengths 2 and 1 (T = 3); old log-probs 0, so each token's log-ratio is its log-prob. The padding
# token's log-prob (9) must not count anywhere.
SEQ_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
SEQ_ADV = torch.tensor([2.0, -1.0])
GSPO_PARAMS = {"clip_low": 3e-4, "clip_high": 4e-4, "agg_mode": "seq-mean-token-mean"}


# The GSPO / CISPO tests below run in float64 on both sides (the expected values by hand with math.exp/log): a few
# exp/log/mean steps give a few float64 ulps; 2**12 ulps relative (~9e-13) leave room and still see any wrong term.
F64_REL = f64_tol(1.0, ulps=2**12)


def _logp(rows):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=True)


def test_gspo_inside_the_clip_range_is_minus_the_mean_of_s_times_a():
    from r3_rllib.core.losses import gspo_policy_loss, rl_objective

    # s_0 = exp(mean(0.0002, 0.0004)) = exp(0.0003), s_1 = exp(-0.0001): both inside [1 - 3e-4, 1 + 4e-4].
    lp = _logp([[0.0002, 0.0004, 9.0], [-0.0001, 9.0, 9.0]])
    old = torch.zeros(2, 3, dtype=torch.float64)
    s0, s1 = math.exp(0.0003), math.exp(-0.0001)
    expected = -(2.0 * s0 + (-1.0) * s1) / 2
    loss, m = gspo_policy_loss(lp, old, SEQ_ADV, SEQ_MASK, **GSPO_PARAMS)
    assert loss.item() == pytest.approx(expected, rel=F64_REL)
    assert float(m["clip_frac_low"]) == 0.0 and float(m["clip_frac_high"]) == 0.0
    assert float(m["clip_frac_dual"]) == 0.0
    assert float(m["ratio_mean"]) == pytest.approx((2 * s0 + s1) / 3, rel=F64_REL)  # token-weighted
    # The same through the learner's entry point, by name.
    loss2, m2 = rl_objective(
        lp,
        old,
        old,
        SEQ_ADV,
        SEQ_MASK,
        policy_loss="gspo",
        loss_params=GSPO_PARAMS,
        agg_mode="seq-mean-token-mean",
    )
    assert loss2.item() == pytest.approx(expected, rel=F64_REL) and float(m2["pg_loss"]) == loss2.item()
    assert LOSS_FNS.config_params["gspo"]["clip_low"] == "gspo_clip_low"


def test_gspo_clips_the_whole_sequence():
    from r3_rllib.core.losses import gspo_policy_loss

    # s_0 = exp(0.001) > 1 + 4e-4 with A_0 = 2 > 0: clipped, -2 * 1.0004, and no gradient to either token.
    lp = _logp([[0.0005, 0.0015, 9.0], [-0.0001, 9.0, 9.0]])
    old = torch.zeros(2, 3, dtype=torch.float64)
    loss, m = gspo_policy_loss(lp, old, SEQ_ADV, SEQ_MASK, **GSPO_PARAMS)
    assert loss.item() == pytest.approx((-2.0 * 1.0004 + math.exp(-0.0001)) / 2, rel=F64_REL)
    loss.backward()
    assert lp.grad[0].tolist() == [0.0, 0.0, 0.0]
    assert float(m["clip_frac_high"]) == pytest.approx(2 / 3)  # both tokens of sequence 0, of 3 valid tokens
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        gspo_policy_loss(lp, old, SEQ_ADV, SEQ_MASK, clip_low=3e-4, clip_high=4e-4, agg_mode="token-mean")
    with pytest.raises(ValueError, match="one advantage per sequence"):
        gspo_policy_loss(lp, old, torch.zeros(2, 3), SEQ_MASK, **GSPO_PARAMS)


def test_gspo_with_token_sums_is_luspo_each_sequence_weighed_by_its_length():
    from r3_rllib import R3Config
    from r3_rllib.core.losses import gspo_policy_loss, gspo_token_policy_loss

    # As above: sequence 0 (2 tokens) clipped at -2 * 1.0004, sequence 1 (1 token) -(-1) * exp(-0.0001). LUSPO
    # (TRL's loss_type 'luspo', sequence-level ratio): each term times its length, then the mean over sequences.
    lp = _logp([[0.0005, 0.0015, 9.0], [-0.0001, 9.0, 9.0]])
    old = torch.zeros(2, 3, dtype=torch.float64)
    params = GSPO_PARAMS | {"agg_mode": "seq-mean-token-sum"}
    expected = (2 * (-2.0 * 1.0004) + 1 * math.exp(-0.0001)) / 2
    loss, _ = gspo_policy_loss(lp, old, SEQ_ADV, SEQ_MASK, **params)
    assert loss.item() == pytest.approx(expected, rel=F64_REL)
    token_loss, _ = gspo_token_policy_loss(lp, old, SEQ_ADV, SEQ_MASK, **params)
    assert token_loss.item() == pytest.approx(expected, rel=F64_REL)
    R3Config().training(policy_loss="gspo", loss_agg_mode="seq-mean-token-sum").validate()
    with pytest.raises(ValueError, match="'sapo' needs loss_agg_mode 'seq-mean-token-mean'"):
        R3Config().training(policy_loss="sapo", loss_agg_mode="seq-mean-token-sum").validate()


def test_gspo_token_has_gspos_value_and_gradient_for_sequence_advantages_and_per_token_gradient_otherwise():
    from r3_rllib.core.losses import gspo_policy_loss, gspo_token_policy_loss

    rows = [[0.0002, 0.0004, 9.0], [-0.0001, 9.0, 9.0]]
    old = torch.zeros(2, 3, dtype=torch.float64)
    s0, s1 = math.exp(0.0003), math.exp(-0.0001)
    lp_seq, lp_tok = _logp(rows), _logp(rows)
    loss_seq, _ = gspo_policy_loss(lp_seq, old, SEQ_ADV, SEQ_MASK, **GSPO_PARAMS)
    loss_tok, m_tok = gspo_token_policy_loss(lp_tok, old, SEQ_ADV, SEQ_MASK, **GSPO_PARAMS)
    assert loss_tok.item() == pytest.approx(loss_seq.item(), rel=F64_REL)
    assert float(m_tok["ratio_mean"]) == pytest.approx((2 * s0 + s1) / 3, rel=F64_REL)
    loss_seq.backward()
    loss_tok.backward()
    # d/d logp_{i,t} = -(1/N) A_i s_i / |y_i|: sequence 0: -(1/2) * 2 * s0 / 2; sequence 1: -(1/2) * (-1) * s1 / 1.
    expected = [[-s0 / 2, -s0 / 2, 0.0], [s1 / 2, 0.0, 0.0]]
    for grad in (lp_seq.grad, lp_tok.grad):
        for got, want in zip(grad.flatten().tolist(), sum(expected, []), strict=True):
            assert got == pytest.approx(want, rel=F64_REL, abs=f64_tol(1.0, ulps=16))
    # Per-token advantages (GSPO-token only): token (0, 1) has A = 4, so its gradient doubles; the value is
    # (1/2) * (mean(-2 s0, -4 s0) + s1) = (1/2) * (-3 s0 + s1).
    lp = _logp(rows)
    token_adv = torch.tensor([[2.0, 4.0, 0.0], [-1.0, 0.0, 0.0]], dtype=torch.float64)
    loss, _ = gspo_token_policy_loss(lp, old, token_adv, SEQ_MASK, **GSPO_PARAMS)
    assert loss.item() == pytest.approx((-3 * s0 + s1) / 2, rel=F64_REL)
    loss.backward()
    assert lp.grad[0, 0].item() == pytest.approx(-s0 / 2, rel=F64_REL)
    assert lp.grad[0, 1].item() == pytest.approx(-s0, rel=F64_REL)
    assert lp.grad[1, 0].item() == pytest.approx(s1 / 2, rel=F64_REL)


def test_gspo_importance_weights_scale_a_sequence_by_its_tokens_mean_weight():
    from r3_rllib.core.losses import gspo_policy_loss, gspo_token_policy_loss

    rows = [[0.0002, 0.0004, 9.0], [-0.0001, 9.0, 9.0]]
    old = torch.zeros(2, 3, dtype=torch.float64)
    w = torch.tensor(
        [[1.0, 0.5, 7.0], [2.0, 7.0, 7.0]], dtype=torch.float64
    )  # padding weights must not count
    s0, s1 = math.exp(0.0003), math.exp(-0.0001)
    # sequence 0: -2 s0 * mean(1, 0.5); sequence 1: +s1 * 2.
    expected = (-2 * s0 * 0.75 + s1 * 2) / 2
    for fn in (gspo_policy_loss, gspo_token_policy_loss):
        loss, m = fn(_logp(rows), old, SEQ_ADV, SEQ_MASK, is_weights=w, **GSPO_PARAMS)
        assert loss.item() == pytest.approx(expected, rel=F64_REL)
        assert float(m["is_weight_mean"]) == pytest.approx((1 + 0.5 + 2) / 3)


def test_cispo_truncates_the_detached_weight_and_keeps_every_tokens_gradient():
    from r3_rllib.core.losses import cispo_policy_loss, rl_objective

    # Ratios 1.5 and 0.5 (sequence 0, A = 1) and 1.1 (sequence 1, A = -2); clip_high 0.2: weights 1.2, 0.5, 1.1.
    rows = [[math.log(1.5), math.log(0.5), 9.0], [math.log(1.1), 9.0, 9.0]]
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0])
    lp = _logp(rows)
    loss, m = cispo_policy_loss(lp, old, adv, SEQ_MASK, clip_high=0.2, agg_mode="token-mean")
    expected = (-1.2 * math.log(1.5) - 0.5 * math.log(0.5) + 1.1 * 2 * math.log(1.1)) / 3
    assert loss.item() == pytest.approx(expected, rel=F64_REL)
    loss.backward()
    # Gradient -w * A / 3 per token: the token whose ratio passed 1.2 keeps a gradient (PPO's clip would zero it).
    assert lp.grad.tolist()[0][:2] == pytest.approx([-1.2 / 3, -0.5 / 3], rel=F64_REL)
    assert lp.grad[1, 0].item() == pytest.approx(2.2 / 3, rel=F64_REL)
    assert lp.grad[0, 2].item() == 0.0
    assert float(m["clip_frac_high"]) == pytest.approx(1 / 3) and float(m["clip_frac_low"]) == 0.0
    assert float(m["ratio_mean"]) == pytest.approx((1.5 + 0.5 + 1.1) / 3)
    # PPO's clipped surrogate on the same inputs gives the first token no gradient.
    lp_ppo = _logp(rows)
    clipped_policy_loss(lp_ppo, old, adv, SEQ_MASK, clip_low=0.2, clip_high=0.2, agg_mode="token-mean")[
        0
    ].backward()
    assert lp_ppo.grad[0, 0].item() == 0.0
    # With a lower bound 1 - 0.2 the second token's weight becomes 0.8; through rl_objective by name.
    params = {"clip_high": 0.2, "clip_low": 0.2, "agg_mode": "token-mean"}
    loss, m = rl_objective(_logp(rows), old, old, adv, SEQ_MASK, policy_loss="cispo", loss_params=params)
    expected = (-1.2 * math.log(1.5) - 0.8 * math.log(0.5) + 1.1 * 2 * math.log(1.1)) / 3
    assert loss.item() == pytest.approx(expected, rel=F64_REL)
    assert float(m["clip_frac_low"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="clip_low must be in"):
        cispo_policy_loss(lp, old, adv, SEQ_MASK, clip_high=0.2, clip_low=1.0)


def test_new_losses_return_the_keys_the_learner_logs():
    from r3_rllib.core.losses import cispo_policy_loss, gspo_policy_loss, gspo_token_policy_loss

    lp = torch.zeros(2, 3)
    keys = set(
        clipped_policy_loss(lp, lp, SEQ_ADV, SEQ_MASK, clip_low=0.2, clip_high=0.2, agg_mode="token-mean")[1]
    )
    for fn, kw in (
        (gspo_policy_loss, GSPO_PARAMS),
        (gspo_token_policy_loss, GSPO_PARAMS),
        (cispo_policy_loss, {"clip_high": 0.2}),
    ):
        assert set(fn(lp, lp, SEQ_ADV, SEQ_MASK, **kw)[1]) == keys


#: Next-token logits of two rows over a 4-token vocabulary, uniform over 4, 2, 3 and 1 entries (the others -inf):
#: entropies ln 4, ln 2, ln 3 and 0 in closed form. The second row's last two positions are padding (ln 4 each).
_NEG = -math.inf
ENTROPY_LOGITS = torch.tensor(
    [
        [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, _NEG, _NEG], [0.0, 0.0, 0.0, _NEG]],
        [[0.0, _NEG, _NEG, _NEG], [1.0, 1.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0]],
    ],
    dtype=torch.float64,
)
ENTROPY_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "pg", "entropy"),
    [
        # Ratio 1, advantages (1, -0.5): per-token loss -1, -1, -1 and +0.5. Entropies ln 4 + ln 2 + ln 3 + 0 = ln 24.
        ("token-mean", (-3.0 + 0.5) / 4, math.log(24.0) / 4),
        # Per row: mean(-1, -1, -1) = -1 and +0.5; entropies ln 24 / 3 and 0; then the mean over the two rows.
        ("seq-mean-token-mean", (-1.0 + 0.5) / 2, math.log(24.0) / 3 / 2),
    ],
)
def test_rl_objective_subtracts_entropy_coef_times_the_entropy_aggregated_as_the_policy_loss(
    mode, pg, entropy
):
    from r3_rllib.core.losses import entropy_bonus, rl_objective

    zeros = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    params = {"clip_low": 0.2, "clip_high": 0.2, "agg_mode": mode, "norm_len": None}
    ent = entropy_from_logits(ENTROPY_LOGITS).requires_grad_(True)
    tol = f64_tol(4.0, ulps=16)  # float64 sums of a few terms up to ln 4
    assert float(entropy_bonus(ent.detach(), ENTROPY_MASK, mode)) == pytest.approx(entropy, abs=tol)

    loss, m = rl_objective(
        zeros,
        zeros,
        zeros,
        adv,
        ENTROPY_MASK,
        loss_params=params,
        agg_mode=mode,
        entropy=ent,
        entropy_coef=0.1,
    )
    assert float(m["pg_loss"]) == pytest.approx(pg, abs=tol)
    assert float(m["entropy_bonus"]) == pytest.approx(0.1 * entropy, abs=tol)
    assert float(loss.detach()) == pytest.approx(pg - 0.1 * entropy, abs=tol)
    # The bonus's gradient on each entropy: -coef times the token's weight in the aggregate (0 on padding).
    loss.backward()
    per_token = 1 / 4 if mode == "token-mean" else 1 / 3 / 2
    last = 1 / 4 if mode == "token-mean" else 1 / 2
    want = -0.1 * torch.tensor([[per_token] * 3, [last, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(ent.grad, want, atol=tol, rtol=0)

    # Off (the default): no term, no metric, and no entropies needed.
    plain, m = rl_objective(zeros, zeros, zeros, adv, ENTROPY_MASK, loss_params=params, agg_mode=mode)
    assert "entropy_bonus" not in m and float(plain) == pytest.approx(pg, abs=tol)
    with pytest.raises(ValueError, match="entropy_coef=0.1 needs the tokens' entropies"):
        rl_objective(
            zeros, zeros, zeros, adv, ENTROPY_MASK, loss_params=params, agg_mode=mode, entropy_coef=0.1
        )


def test_high_entropy_mask_keeps_the_top_quantile_of_the_valid_tokens_by_hand():
    """TRL's get_high_entropy_mask: the threshold is torch.quantile (linear) of the valid tokens' entropies at
    1 - quantile. Valid entropies 0.1, 0.5, 0.9, 0.3 | 0.7, 0.2 (two padded positions of 5.0 left out)."""
    from r3_rllib.core.losses import high_entropy_mask

    entropy = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    # Sorted: 0.1 0.2 0.3 0.5 0.7 0.9. q = 0.5: position 0.5 x 5 = 2.5, between 0.3 and 0.5: 0.4.
    half = high_entropy_mask(entropy, mask, 0.5)
    assert half.tolist() == [[False, True, True, False], [True, False, False, False]]
    # q = 0.2 (the paper's): position 0.8 x 5 = 4, the fifth value 0.7: 0.7 and 0.9 stay.
    top = high_entropy_mask(entropy, mask, 0.2)
    assert top.tolist() == [[False, False, True, False], [True, False, False, False]]
    # q = 1: the minimum, every valid token; no valid token: nothing.
    assert high_entropy_mask(entropy, mask, 1.0).equal(mask)
    assert not high_entropy_mask(entropy, torch.zeros_like(mask), 0.2).any()
    with pytest.raises(ValueError, match="quantile must be in"):
        high_entropy_mask(entropy, mask, 0.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_top_entropy_quantile_drops_low_entropy_tokens_from_the_policy_term_only(mode):
    """On-policy (ratio 1), advantages 1 and -0.5, a KL term of 0.5 per token at coef 0.1. Entropies put tokens
    (0,2) and (1,0) in the top half; the policy term keeps them and the normaliser keeps all four tokens:
    token-mean pg = -(1 + -0.5) / 4 = -0.125 (all tokens: -(3 x 1 - 0.5) / 4 = -0.625); seq-mean-token-mean
    pg = (-1/3 + 0.5/1) / 2 = 0.0833 (all: (-1 + 0.5) / 2 = -0.25). The KL term is every token's: 0.5."""
    from r3_rllib.core.losses import rl_objective

    zeros = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    entropy = torch.tensor([[0.1, 0.3, 0.9], [0.8, 5.0, 5.0]], dtype=torch.float64)
    params = {"clip_low": 0.2, "clip_high": 0.2, "agg_mode": mode, "norm_len": None}
    ref = torch.full((2, 3), -1.0, dtype=torch.float64)  # k1 of log-probs 0 against -1: 1; k2: 0.5
    common = dict(loss_params=params, agg_mode=mode, ref_logprobs=ref, kl_coef=0.1, kl_type="k2")
    tol = f64_tol(1.0, ulps=16)
    loss, m = rl_objective(
        zeros, zeros, zeros, adv, mask, entropy=entropy, top_entropy_quantile=0.5, **common
    )
    pg = -0.125 if mode == "token-mean" else (-1 / 3 + 0.5) / 2
    assert float(m["pg_loss"]) == pytest.approx(pg, abs=tol)
    assert float(m["kl"]) == pytest.approx(0.5, abs=tol)
    assert float(loss) == pytest.approx(pg + 0.1 * 0.5, abs=tol)
    assert float(m["entropy_mask_frac"]) == pytest.approx(0.5, abs=tol) and "is_weight_mean" not in m
    full, m = rl_objective(zeros, zeros, zeros, adv, mask, **common)
    assert float(m["pg_loss"]) == pytest.approx(-0.625 if mode == "token-mean" else -0.25, abs=tol)
    assert "entropy_mask_frac" not in m
    with pytest.raises(ValueError, match="top_entropy_quantile=0.5 needs the tokens' entropies"):
        rl_objective(zeros, zeros, zeros, adv, mask, top_entropy_quantile=0.5, **common)


def test_gpg_is_minus_advantage_times_log_prob_by_hand():
    """verl's 'gpg': per token -A x log-prob, no ratio, no clip. Log-probs -1, -2 | -0.5 (one padded), advantages
    1 and -2: token-mean (1 + 2 - 1) / 3 = 0.6667; seq-mean-token-mean ((1 + 2) / 2 + -1 / 1) / 2 = 0.25. The
    gradient on each log-prob is -A over the normaliser, whatever the old log-probs (a ratio of e^3 clips nothing)."""
    from r3_rllib.core.losses import get_loss_fn

    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - 3.0
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    tol = f64_tol(3.0, ulps=16)
    loss, m = get_loss_fn("gpg")(logp, old, adv, mask, agg_mode="token-mean")
    assert float(loss.detach()) == pytest.approx(2.0 / 3.0, abs=tol)
    assert float(m["clip_frac_high"]) == float(m["clip_frac_low"]) == 0.0
    assert float(m["ratio_mean"]) == pytest.approx(math.exp(3.0), rel=1e-12)
    loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-1 / 3, -1 / 3], [2 / 3, 0.0]], dtype=torch.float64), atol=tol, rtol=0
    )
    seq, _ = get_loss_fn("gpg")(logp.detach(), old, adv, mask, agg_mode="seq-mean-token-mean")
    assert float(seq) == pytest.approx(0.25, abs=tol)
    weighted, m = get_loss_fn("gpg")(
        logp.detach(), old, adv, mask, is_weights=torch.full((2, 2), 0.5).double()
    )
    assert float(weighted) == pytest.approx(1.0 / 3.0, abs=tol) and float(m["is_weight_mean"]) == 0.5


def test_sapo_gate_by_hand():
    """SAPO: per token -sigmoid(tau (r - 1)) 4 / tau x A, tau 1.0 where A > 0 and 1.05 elsewhere. Row 0 (A = 1):
    ratios 1 and 2, gates 2 and 4 sigmoid(1); row 1 (A = -0.5): ratio 0.5, gate 4 / 1.05 sigmoid(-0.525); a mean
    over sequences of their token means. At r = 1 the gate's slope is 1: the token's gradient is the policy
    gradient's, -A over the normaliser (1/2 of a 2-token row, 1/2 of 2 rows)."""
    from r3_rllib.core.losses import get_loss_fn

    def sig(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = torch.tensor([[0.0, math.log(2.0)], [math.log(0.5), 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    loss, m = get_loss_fn("sapo")(logp, old, adv, mask, agg_mode="seq-mean-token-mean")
    row0 = (-2.0 - 4.0 * sig(1.0)) / 2
    row1 = 0.5 * sig(1.05 * -0.5) * 4.0 / 1.05
    tol = f64_tol(3.0, ulps=16)
    assert float(loss.detach()) == pytest.approx((row0 + row1) / 2, abs=tol)
    assert float(m["clip_frac_high"]) == 0.0
    loss.backward()
    assert float(logp.grad[0, 0]) == pytest.approx(-0.25, abs=tol)
    # r = 2: slope 4 sigmoid'(1) x 2 = 8 sigmoid(1)(1 - sigmoid(1)), a fade from 1, not a clip's 0.
    assert float(logp.grad[0, 1]) == pytest.approx(-8 * sig(1.0) * (1 - sig(1.0)) / 4, abs=tol)
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be finite and > 0"):
        get_loss_fn("sapo")(logp.detach(), old, adv, mask, tau_pos=0.0)


def test_sapo_needs_the_sequence_mean():
    from r3_rllib import R3Config

    with pytest.raises(ValueError, match="policy_loss 'sapo' needs loss_agg_mode 'seq-mean-token-mean'"):
        R3Config().training(policy_loss="sapo", loss_agg_mode="token-mean").validate()
    R3Config().training(policy_loss="sapo", loss_agg_mode="seq-mean-token-mean").validate()


def test_kl_cov_penalises_the_tokens_of_largest_covariance_by_hand():
    """verl's 'kl_cov'. Log-probs -1, -2 | -0.5, -1.5, each 0.1 above the old ones (r = e^0.1), advantages 1 and
    -1. Centred advantages 1, 1, -1, -1 times centred log-probs 0.25, -0.75, 0.75, -0.25: covariances 0.25, -0.75,
    -0.75, 0.25; kl_cov_ratio 0.5 penalises the top int(4 x 0.5) = 2, tokens (0, 0) and (1, 1), by 0.5 x |0.1|.
    Token-mean: (-r + 0.05 - r + r + r + 0.05) / 4 = 0.025; no clip anywhere."""
    from r3_rllib.core.losses import get_loss_fn

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - 0.1
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, m = get_loss_fn("kl_cov")(logp, old, adv, mask, kl_cov_ratio=0.5, kl_coef=0.5)
    tol = f64_tol(2.0, ulps=16)
    assert float(loss.detach()) == pytest.approx(0.025, abs=tol)
    assert float(m["kl_cov_frac"]) == 0.5 and float(m["clip_frac_high"]) == 0.0
    loss.backward()
    r = math.exp(0.1)
    want = torch.tensor([[-r + 0.5, -r], [r, r + 0.5]], dtype=torch.float64) / 4
    torch.testing.assert_close(logp.grad, want, atol=tol, rtol=0)
    # verl's default share (0.0002) still penalises one token; none without a valid token.
    _, m = get_loss_fn("kl_cov")(logp.detach(), old, adv, mask)
    assert float(m["kl_cov_frac"]) == 0.25
    empty, m = get_loss_fn("kl_cov")(logp.detach(), old, adv, torch.zeros_like(mask))
    assert float(empty) == 0.0 and float(m["kl_cov_frac"]) == 0.0
    with pytest.raises(ValueError, match="kl_cov_ratio must be in"):
        get_loss_fn("kl_cov")(logp.detach(), old, adv, mask, kl_cov_ratio=0.0)


def test_clip_cov_drops_the_gradient_of_tokens_in_the_covariance_band_by_hand():
    """verl's 'clip_cov'. On-policy log-probs -1, -2 | -0.5, -1.5, advantages 2 and -1: centred advantages 1.5, 1.5,
    -1.5, -1.5 times centred log-probs 0.25, -0.75, 0.75, -0.25 give covariances 0.375, -1.125, -1.125, 0.375; the
    band (0.1, 1) holds tokens (0, 0) and (1, 1). With clip_cov_ratio 1 every token of the band is drawn (whatever
    the permutation): token-mean (-2 + 1) / 4 = -0.25 (all tokens: -0.5), and those two tokens get no gradient."""
    from r3_rllib.core.losses import get_loss_fn

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    clip_cov = get_loss_fn("clip_cov")
    band = {"clip_low": 0.2, "clip_high": 0.2, "clip_cov_lb": 0.1, "clip_cov_ub": 1.0}
    loss, m = clip_cov(logp, logp.detach(), adv, mask, clip_cov_ratio=1.0, **band)
    tol = f64_tol(2.0, ulps=16)
    assert float(loss.detach()) == pytest.approx(-0.25, abs=tol) and float(m["clip_cov_frac"]) == 0.5
    assert "is_weight_mean" not in m
    loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, -0.5], [0.25, 0.0]], dtype=torch.float64), atol=tol, rtol=0
    )
    # verl's share (0.0002) drops one token of the band; a token PPO already clips is never drawn: with (0, 0)'s
    # ratio at e (> 1.2, A > 0) only (1, 1) is left in the band.
    _, m = clip_cov(logp.detach(), logp.detach(), adv, mask, **band)
    assert float(m["clip_cov_frac"]) == 0.25
    old = logp.detach().clone()
    old[0, 0] -= 1.0
    loss, m = clip_cov(logp.detach(), old, adv, mask, clip_cov_ratio=1.0, **band)
    assert float(m["clip_cov_frac"]) == 0.25 and float(m["clip_frac_high"]) == 0.25
    # A token of weight 0 (top_entropy_quantile's mask) is never drawn: with (0, 0)'s weight 0 and verl's share
    # (one token), the draw is (1, 1) every time, whatever the permutation.
    weights = torch.ones(2, 2, dtype=torch.float64)
    weights[0, 0] = 0.0
    for seed in range(4):
        torch.manual_seed(seed)
        logp_w = logp.detach().clone().requires_grad_(True)
        loss, m = clip_cov(logp_w, logp.detach(), adv, mask, is_weights=weights, **band)
        loss.backward()
        assert (
            float(m["clip_cov_frac"]) == 0.25 and float(logp_w.grad[1, 1]) == 0.0 and logp_w.grad[0, 1] != 0
        )
    with pytest.raises(ValueError, match="clip_cov_lb < clip_cov_ub"):
        clip_cov(logp.detach(), old, adv, mask, clip_low=0.2, clip_high=0.2, clip_cov_lb=1.0, clip_cov_ub=1.0)
    from r3_rllib import R3Config

    with pytest.raises(ValueError, match="policy_loss 'clip_cov' needs clip_cov_lb < clip_cov_ub"):
        R3Config().training(policy_loss="clip_cov", clip_cov_lb=5.0).validate()


@pytest.mark.parametrize("name", sorted(TOKEN_ADVANTAGE_LOSSES))
def test_token_advantages_reach_their_own_token_and_a_sequences_one_is_the_same_as_its_tokens(name):
    """PPO's GAE gives each token its advantage: a loss of TOKEN_ADVANTAGE_LOSSES (at its config defaults) takes
    ``[B, T]``, where a sequence's advantage written on each of its tokens is the ``[B]`` form exactly, and an
    advantage on one token moves only that token's log-prob (the policy at the old policy: ratio 1)."""
    from r3_rllib import R3Config

    sequence_mean = name in ("gspo_token", "sapo")  # their objectives are means over sequences
    agg = {"loss_agg_mode": "seq-mean-token-mean"} if sequence_mean else {}
    params = LOSS_FNS.params_from(name, R3Config().training(policy_loss=name, **agg))
    fn = LOSS_FNS.get_fn(name)
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False

    def loss_and_grad(adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = old.clone().requires_grad_(True)
        torch.manual_seed(0)  # Clip-Cov's draw
        loss, _ = fn(logp, old, adv, mask, **params)
        loss.backward()
        return loss.detach(), logp.grad

    seq = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    loss_seq, grad_seq = loss_and_grad(seq)
    loss_tok, grad_tok = loss_and_grad(seq[:, None].expand(3, 5).clone())
    assert torch.equal(loss_seq, loss_tok) and torch.equal(grad_seq, grad_tok)
    one = torch.zeros(3, 5, dtype=torch.float64)
    one[1, 2] = 1.0
    _, grad = loss_and_grad(one)
    assert grad[1, 2] < 0 and torch.count_nonzero(grad) == 1  # descending raises that token's log-prob only


def test_gspo_takes_one_advantage_per_sequence():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"GSPO needs one advantage per sequence"):
        LOSS_FNS.get_fn("gspo")(
            logp, logp, torch.zeros(2, 3), torch.ones(2, 3), clip_low=3e-4, clip_high=4e-4
        )


def _vespo_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row 0 (A = 1): log-probs -1, -2 at log-ratios 0 and log 2 (sequence weight w = 2); row 1 (A = -0.5): one
    token, log-prob -0.5 at log-ratio log 0.5 (w = 0.5), then padding."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], dtype=torch.float64, requires_grad=True)
    log_ratio = torch.tensor([[0.0, math.log(2.0)], [math.log(0.5), 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    return logp, logp.detach() - log_ratio, mask, adv


def test_vespo_kernel_and_loss_by_hand():
    """VESPO: per token -phi(w) A logp, phi(w) = exp(lambda + k log w - lambda w), w the product of the sequence's
    token ratios. Row 0 (A >= 0: k 2, lambda 3) at w = 2: phi = exp(3 + 2 log 2 - 6) = 4 e^-3; row 1 (A < 0: k 3,
    lambda 2) at w = 0.5: phi = exp(2 + 3 log 0.5 - 1) = e / 8 (the padding's log-ratio 5 does not count). Token
    mean over 3 tokens: (4 e^-3 (1 + 2) - (e / 8) 0.25) / 3; each token's gradient -phi A / 3."""
    logp, old, mask, adv = _vespo_rows()
    loss, m = get_loss_fn("vespo")(logp, old, adv, mask, agg_mode="token-mean")
    phi0, phi1 = 4.0 * math.exp(-3.0), math.e / 8.0
    tol = f64_tol(1.0, ulps=16)
    assert float(loss.detach()) == pytest.approx((3.0 * phi0 - 0.25 * phi1) / 3.0, abs=tol)
    assert float(m["vespo_phi_mean"]) == pytest.approx((2.0 * phi0 + phi1) / 3.0, abs=tol)  # per token
    assert float(m["clip_frac_high"]) == 0.0 and "is_weight_mean" not in m
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-phi0 / 3.0] * 2, abs=tol)
    assert float(logp.grad[1, 0]) == pytest.approx(0.5 * phi1 / 3.0, abs=tol)
    assert float(logp.grad[1, 1]) == 0.0


def test_vespo_kernel_shape():
    """phi(1) = 1 on both sides; its peak is at w = k / lambda; a weight far off either way goes to 0, finite
    (a log-ratio sum past 20 is clamped first, a non-finite phi is 0)."""
    from r3_rllib.core.losses import vespo_sequence_weights

    mask = torch.ones(3, 1, dtype=torch.bool)
    log_w = torch.tensor([[0.0], [-30.0], [30.0]], dtype=torch.float64)
    for sign, (k, lam) in ((1.0, (2.0, 3.0)), (-1.0, (3.0, 2.0))):
        adv = torch.full((3,), sign, dtype=torch.float64)
        phi = vespo_sequence_weights(log_w, mask, adv)
        assert float(phi[0]) == pytest.approx(1.0, abs=f64_tol(1.0, ulps=16))
        peak = vespo_sequence_weights(
            torch.full((1, 1), math.log(k / lam), dtype=torch.float64), mask[:1], adv[:1]
        )
        grid = torch.linspace(-3.0, 3.0, 601, dtype=torch.float64).unsqueeze(-1)
        assert float(
            vespo_sequence_weights(grid, torch.ones_like(grid, dtype=torch.bool), adv[:1].expand(601)).max()
        ) <= float(peak[0])
        assert 0.0 <= float(phi[1]) < 1e-10 and float(phi[2]) == 0.0 and bool(torch.isfinite(phi).all())
    # The docstring's figures for A >= 0: the peak e 4 / 9 at w = 2/3, half weight at w = 0.22 and 1.5.
    pos = torch.ones(3, dtype=torch.float64)
    w = torch.tensor([[math.log(2.0 / 3.0)], [math.log(0.22)], [math.log(1.5)]], dtype=torch.float64)
    assert vespo_sequence_weights(w, mask, pos).tolist() == pytest.approx(
        [math.e * 4 / 9, 0.5, 0.5], abs=3e-3
    )


def test_vespo_on_policy_is_the_policy_gradient_and_folds_the_behaviour_weights():
    """At w = 1 every phi is 1: VESPO's loss and gradient are GPG's (-A logp). Behaviour weights enter w, not the
    token's term: weights 1, 0.5 (row 0) and 2 (row 1) bring rows 0 and 1 of :func:`_vespo_rows` to w = 1, so the
    loss is again GPG's without a weight; TRL folds its vLLM correction the same way."""
    logp, old, mask, adv = _vespo_rows()
    tol = f64_tol(1.0, ulps=16)
    on, _ = get_loss_fn("vespo")(logp, logp.detach(), adv, mask)
    gpg, _ = get_loss_fn("gpg")(logp, logp.detach(), adv, mask)
    g_on = torch.autograd.grad(on, logp)[0]
    g_gpg = torch.autograd.grad(gpg, logp)[0]
    assert float(on.detach()) == pytest.approx(float(gpg.detach()), abs=tol)
    assert torch.allclose(g_on, g_gpg, rtol=0.0, atol=tol)
    is_w = torch.tensor([[1.0, 0.5], [2.0, 1.0]], dtype=torch.float64)
    folded, m = get_loss_fn("vespo")(logp, old, adv, mask, is_weights=is_w)
    assert float(folded.detach()) == pytest.approx(float(gpg.detach()), abs=tol)
    assert float(m["vespo_phi_mean"]) == pytest.approx(1.0, abs=tol)
    assert float(m["is_weight_mean"]) == pytest.approx((1.0 + 0.5 + 2.0) / 3.0, abs=tol)
    # A zero weight (IcePop's token outside its band) all but silences its sequence: w <= 1e-8.
    silenced, m = get_loss_fn("vespo")(logp, logp.detach(), adv, mask, is_weights=torch.zeros_like(is_w))
    assert float(m["vespo_phi_mean"]) < 1e-10


def test_vespo_refusals():
    """One advantage per sequence (the kernel's side is its sign); positive finite shapes and rates; the config
    needs token-level behaviour weights and one advantage per response (no critic)."""
    from r3_rllib import R3Config

    logp, old, mask, adv = _vespo_rows()
    with pytest.raises(ValueError, match="VESPO needs one advantage per sequence"):
        get_loss_fn("vespo")(logp, old, adv.unsqueeze(-1).expand(2, 2), mask)
    with pytest.raises(ValueError, match="VESPO's lambda_neg must be finite and > 0"):
        get_loss_fn("vespo")(logp, old, adv, mask, lambda_neg=0.0)
    with pytest.raises(ValueError, match="needs rollout_is 'token'"):
        R3Config().training(policy_loss="vespo", rollout_is="sequence").validate()
    with pytest.raises(ValueError, match="vespo_k_pos"):
        R3Config().training(vespo_k_pos=1.5).validate()
    with pytest.raises(ValueError, match="'vespo'"):
        R3Config.ppo_preset().training(policy_loss="vespo").validate()
    R3Config().training(policy_loss="vespo", vespo_k_pos=1.5, rollout_rs="icepop").validate()
    R3Config().training(policy_loss="vespo", top_entropy_quantile=0.2).validate()  # TRL takes both too


def test_vespo_folds_the_importance_weights_and_multiplies_by_the_entropy_mask():
    """Through the objective, with a token importance weight and top_entropy_quantile 0.5 together: the weights
    enter each response's w (row 0: 0.5 on its first token, w = 0.5, phi = exp(3 + 2 log 0.5 - 1.5) = e^1.5 / 4;
    row 1: w = 1, phi = 1), the entropy mask multiplies each token's term (entropies 3, 1 | 2, 0.5: the median
    1.5 keeps tokens (0, 0) and (1, 0)) and the normaliser keeps all 4 tokens: (phi_0 x 1 - 0.25) / 4. Had the
    mask's zero entered w as a weight, row 0 would be silenced (phi ~ 1e-16)."""
    from r3_rllib.core.losses import rl_objective
    from r3_rllib.core.mismatch import RolloutCorrection

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=torch.float64, requires_grad=True)
    old = logp.detach().clone()
    behaviour = old.clone()
    behaviour[0, 0] = old[0, 0] - math.log(0.5)  # pi_old / pi_behaviour = 0.5
    mask = torch.ones(2, 2, dtype=torch.bool)
    entropy = torch.tensor([[3.0, 1.0], [2.0, 0.5]], dtype=torch.float64)
    loss, m = rl_objective(
        logp,
        old,
        behaviour,
        torch.tensor([1.0, -0.5], dtype=torch.float64),
        mask,
        policy_loss="vespo",
        loss_params={"agg_mode": "token-mean"},
        correction=RolloutCorrection(is_level="token", is_threshold=2.0),
        entropy=entropy,
        top_entropy_quantile=0.5,
    )
    phi0 = math.exp(1.5) / 4.0
    tol = f64_tol(1.0, ulps=16)
    assert float(loss.detach()) == pytest.approx((phi0 - 0.25) / 4.0, abs=tol)
    assert float(m["vespo_phi_mean"]) == pytest.approx((2 * phi0 + 2) / 4.0, abs=tol)
    assert float(m["is_weight_mean"]) == pytest.approx(0.875, abs=tol)
    assert float(m["entropy_mask_frac"]) == 0.5


def test_vespo_weights_ignore_padding_and_zero_a_non_finite_kernel():
    """A NaN log-ratio at a padding position leaves its row's w alone (row 0: w = 1, phi = 1); one at a trained
    token makes phi NaN, which counts as 0 (TRL's nan_to_num): that response gives no gradient."""
    from r3_rllib.core.losses import vespo_sequence_weights

    log_ratio = torch.tensor([[0.0, float("nan")], [float("nan"), 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False], [True, True]])
    phi = vespo_sequence_weights(log_ratio, mask, torch.ones(2, dtype=torch.float64))
    assert phi.tolist() == [1.0, 0.0]
