"""The learner's rollout correction: diagnostics logged by every update, and rejected samples leaving the loss and
its normaliser (the tiny model, one CPU learner)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, f32_tol, forward_atol
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.algorithms.r3.rl_module import pack_samples
from r3_rllib.types import TrainingBatch
from r3_rllib.types.samples import Sample

torch.set_num_threads(TORCH_THREADS)

DIAGNOSTICS = (
    "k1",
    "k3",
    "ppl_ratio",
    "token_masked_frac",
    "seq_masked_frac",
    "token_zeroed_frac",
    "veto_frac",
    "is_weight_mean",
    "is_weight_max",
)


def _learner(model_path: str, **training) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(
            model_path=model_path,
            micro_batch_size=3,
            gradient_checkpointing=False,
            lr=1e-2,
            num_minibatches=1,
            num_epochs=1,
            **training,
        )
    )
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _samples(n: int, seed: int = 0) -> list[Sample]:
    return random_samples(n, seed, min_response_len=2)


def _on_policy(learner: R3Learner, samples: list[Sample]) -> list[Sample]:
    """`samples` with behaviour log-probs equal to the learner's own (at its temperature)."""
    packed = pack_samples(samples, learner._pad_id, "cpu")
    with torch.no_grad():
        lp, _ = learner._score(learner.policy, packed)
    rows = [lp[i][packed["response_mask"][i]].numpy().astype(np.float32) for i in range(len(samples))]
    return [Sample(**{**s.__dict__, "behavior_logprobs": row}) for s, row in zip(samples, rows, strict=True)]


def test_an_update_logs_the_mismatch_diagnostics_and_on_policy_samples_show_none(tiny_random_model):
    learner = _learner(tiny_random_model, rollout_rs="token", rollout_token_veto_threshold=1e-4)
    samples = _on_policy(learner, _samples(6))
    metrics = learner.update_from_samples(TrainingBatch.from_samples(samples), seed=0)
    for name in DIAGNOSTICS:
        assert np.isfinite(metrics[f"mismatch_{name}"]), name
    # The behaviour log-probs came from one batch of 6, the update scores micro-batches of 3: each log-prob may
    # differ by forward_atol (tests/numeric.py: FORWARD_ULPS of their scale), so k1 = mean(lp_b - lp_t), log of the
    # perplexity ratio and of each weight e^(lp_t - lp_b) stay within it; k3 = e^d - d - 1 ~ d^2 / 2 within its
    # square, plus 8 float32 ulps of 1 for the cancelling terms of size ~1.
    tol = forward_atol(*(s.behavior_logprobs for s in samples))
    assert metrics["mismatch_k1"] == pytest.approx(0.0, abs=tol)
    assert metrics["mismatch_k3"] == pytest.approx(0.0, abs=tol**2 + f32_tol(1.0, ulps=8))
    assert metrics["mismatch_ppl_ratio"] == pytest.approx(1.0, abs=2 * tol)
    for name in ("token_masked_frac", "seq_masked_frac", "token_zeroed_frac", "veto_frac"):
        assert metrics[f"mismatch_{name}"] == 0.0, name
    assert metrics["mismatch_is_weight_mean"] == pytest.approx(1.0, abs=2 * tol)
    assert metrics["mismatch_is_weight_max"] == pytest.approx(1.0, abs=2 * tol)


def test_off_policy_samples_show_the_gap_and_the_max_is_a_max(tiny_random_model):
    """Behaviour log-prob -3 everywhere (the tiny model's are near -log(vocab)): a measurable gap; the weight's
    maximum is the largest token weight (at most is_cap), not a mean over passes."""
    learner = _learner(tiny_random_model)
    metrics = learner.update_from_samples(TrainingBatch.from_samples(_samples(6)), seed=0)
    assert metrics["mismatch_k3"] > 0.0
    assert metrics["mismatch_is_weight_mean"] <= metrics["mismatch_is_weight_max"] <= 2.0
    assert metrics["mismatch_token_masked_frac"] == 0.0  # no rejection by default


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_rejected_samples_leave_the_loss_and_its_normaliser(tiny_random_model, agg_mode):
    """Half the samples' behaviour log-probs are far from the learner's (rejected by 'sequence' rejection): the
    gradient equals the one of the kept half alone, so the rejected ones left the loss and the token (or
    sequence) count alike; micro-batches split the two batches differently. (Gradients, not parameters: Adam's
    first step is ~lr * sign(g) and turns rounding noise of near-zero entries into lr-sized differences.)"""
    probe = _learner(tiny_random_model)
    samples = _on_policy(probe, _samples(8))
    far = [Sample(**{**s.__dict__, "behavior_logprobs": s.behavior_logprobs - 5.0}) for s in samples[::2]]
    mixed = [x for pair in zip(far, samples[1::2], strict=True) for x in pair]
    # No gradient clipping: it would rescale both gradients to one norm and hide a wrong normaliser.
    rejecting = _learner(tiny_random_model, rollout_rs="sequence", loss_agg_mode=agg_mode, grad_clip=None)
    metrics = rejecting.update_from_samples(TrainingBatch.from_samples(mixed), seed=0)
    assert metrics["mismatch_seq_masked_frac"] == pytest.approx(0.5)
    kept_only = _learner(tiny_random_model, loss_agg_mode=agg_mode, grad_clip=None)
    kept = kept_only.update_from_samples(TrainingBatch.from_samples(samples[1::2]), seed=0)
    # The reported loss is the objective's value too, not a function of how the passes split the batch. The same
    # per-token terms (-A x ratio, ratio ~1: size max |A|) summed in other micro-batches: like the gradients below,
    # 2**10 float32 ulps of the largest term.
    adv_scale = max(abs(float(s.advantage)) for s in samples)
    assert metrics["loss"] == pytest.approx(kept["loss"], abs=f32_tol(adv_scale, ulps=2**10))
    # The two learners sum the same per-token terms in different micro-batches and orders: float32 rounding gives
    # each entry an error of a few ulps of the largest terms, not of the entry itself (an entry near zero can
    # differ by 100 % of its size). So atol is 2**10 float32 ulps of the largest gradient entry (~1.2e-4 of it:
    # room for the ~1e3 terms summed, in any order, on any CPU's kernels), and rtol is float32 eps * 2**10 as well.
    grads = [
        (a.grad, b.grad)
        for a, b in zip(rejecting.policy.parameters(), kept_only.policy.parameters(), strict=True)
    ]
    scale = max(float(b.abs().max()) for _, b in grads)
    tol = 2**10 * torch.finfo(torch.float32).eps
    for a, b in grads:
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * scale)
