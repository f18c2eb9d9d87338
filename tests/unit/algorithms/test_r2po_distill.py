"""R^2PO's rollout head with a teacher (on-policy distillation, learner_distill.py): the teacher is distilled into
the base policy. Stage A (the head alone, on its rarity reward) gets no distillation term and keeps its rarity
advantages even with distill_task_reward=False; stage B (the base) gets the term with the base's own proximal
log-probs as the student's, each token weighted by the stage's behaviour weight (rollout_head_stage_b_weight), not
with the head-on sampler's log-probs."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, forward_atol
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.algorithms.r3.rl_module import pack_samples
from r3_rllib.core.method import DEFAULT_PHASE
from r3_rllib.models.rollout_head import get_rollout_head, rollout_token_logprobs
from r3_rllib.r2po.method import R2POPhase
from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)

IS_CAP = 1.5  # some of the batch's base-to-sampler ratios above it, some below (asserted in the stage B test)


def _learner(model_path: str, **training) -> R3Learner:
    settings = dict(
        model_path=model_path,
        micro_batch_size=8,
        gradient_checkpointing=False,
        lr=1e-2,
        num_minibatches=1,
        num_epochs=1,  # one optimizer step: the proximal policy is the current one (every ratio to it is 1)
        loss_agg_mode="token-mean",
        kl_coef=0.0,
        rollout_head=True,
        rollout_head_kl_coef=0.0,  # no KL term in either stage: the update is the task and teacher terms only
        is_cap=IS_CAP,
        distill_teacher="teacher",  # the learner reads the samples' teacher log-probs, never the model
        distill_coef=0.5,
    )
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(**(settings | training))
    )
    space = gym.spaces.Text(8)
    learner = cfg.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a head far from its ~0 init: the head-on sampler and the base differ visibly
        for p in get_rollout_head(learner.policy).parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return learner


def _batch(learner: R3Learner, *, task_advantages: bool) -> tuple[TrainingBatch, dict[str, torch.Tensor]]:
    """Samples drawn with the head on (behaviour log-probs: the rollout distribution's, head on) and scored by a
    teacher; the task advantages +-1 or all 0. Also the packed tensors and the base's log-probs (``base``)."""
    samples = random_samples(6, 0, min_response_len=2)
    packed = pack_samples(samples, learner._pad_id, "cpu")
    m = packed["response_mask"]
    with torch.no_grad():
        roll, base = rollout_token_logprobs(
            learner.policy, packed["input_ids"], packed["attention_mask"], m, temperature=1.0
        )
    rng = np.random.default_rng(1)
    scored = [
        dataclasses.replace(
            s,
            behavior_logprobs=roll[i][m[i]].numpy(),
            teacher_logprobs=rng.normal(-3.0, 1.0, len(s.response_ids)).astype(np.float32),
            advantage=s.advantage if task_advantages else 0.0,
        )
        for i, s in enumerate(samples)
    ]
    batch = TrainingBatch.from_samples(scored)
    return batch, pack_samples(scored, learner._pad_id, "cpu") | {"base": base}


def _snapshot(learner: R3Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}


def _moved(before: dict[str, torch.Tensor], learner: R3Learner, head: bool) -> bool:
    after = learner.policy.state_dict()
    return any(
        not torch.equal(v, after[k]) for k, v in before.items() if k.startswith("rollout_head.") == head
    )


def test_the_term_is_off_in_stage_a_and_on_in_stage_b_and_plain_training():
    from r3_rllib.algorithms.r3.learner_distill import DistillTerm

    assert not R2POPhase(HEAD_STAGE).distills
    assert R2POPhase(BASE_STAGE).distills and DEFAULT_PHASE.distills
    term = DistillTerm(
        R3Config().training(distill_teacher="teacher", distill_task_reward=False, max_new_tokens=8)
    )
    adv = torch.tensor([1.0, -1.0])
    term.start(R2POPhase(HEAD_STAGE), sampled_by_trained=True)
    assert torch.equal(term.task_advantages(adv), adv)  # the head's rarity advantages stay
    metrics: dict = {}
    loss = torch.tensor(0.5)
    packed = {
        "response_mask": torch.tensor([[True, True]]),
        "behavior_logprobs": torch.tensor([[-1.0, -2.0]]),
        "teacher_logprobs": torch.tensor([[-3.0, -1.0]]),
        "teacher_mask": torch.tensor([[True, True]]),
    }
    assert term.add(loss, metrics, packed, torch.zeros(1, 2, requires_grad=True)) is loss
    assert metrics == {}  # no term, hence no metric of one (not a term of 0)
    term.start(R2POPhase(BASE_STAGE), sampled_by_trained=False)
    assert torch.equal(term.task_advantages(adv), torch.zeros(2))
    with pytest.raises(ValueError, match="old_logp and correction"):
        term.add(loss, {}, packed, torch.zeros(1, 2))


@pytest.mark.parametrize("mode", ["advantage", "loss"])
def test_stage_a_trains_the_head_on_its_rarity_reward_not_toward_the_teacher(tiny_random_model, mode):
    # Distilling without the task reward: stage A's rarity advantages are still what trains the head.
    learner = _learner(tiny_random_model, distill_mode=mode, distill_task_reward=False)
    batch, packed = _batch(learner, task_advantages=True)
    before = _snapshot(learner)
    metrics = learner.update_from_samples(batch, seed=0, phase=R2POPhase(HEAD_STAGE))
    # By hand: behaviour = rollout log-probs and one step, so every ratio is 1 and the policy term is -A per token.
    m = packed["response_mask"]
    pg = float((-packed["advantages"][:, None].expand_as(m))[m].mean())
    assert metrics["pg_loss"] == pytest.approx(pg, abs=1e-6) and pg != 0.0
    assert metrics["loss"] == pytest.approx(pg, abs=1e-6)  # no distillation term
    # No distillation term, so none of its metrics (the teacher's coverage of the batch is a measurement: kept).
    assert not {"distill_reverse_kl", "distill_loss", "distill_advantage_mean"} & set(metrics), metrics
    assert _moved(before, learner, head=True) and not _moved(before, learner, head=False)
    # No task signal at all: nothing trains the head (the teacher's term would).
    learner = _learner(tiny_random_model, distill_mode=mode)
    batch, _ = _batch(learner, task_advantages=False)
    before = _snapshot(learner)
    metrics = learner.update_from_samples(batch, seed=0, phase=R2POPhase(HEAD_STAGE))
    assert metrics["grad_norm"] == 0.0 and metrics["loss"] == 0.0
    assert not _moved(before, learner, head=True) and not _moved(before, learner, head=False)


def _expected_stage_b(packed: dict[str, torch.Tensor], weighted: bool, mode: str, coef: float):
    """The stage B term by hand (one step: the current log-probs are the proximal ones ``s``): its value, the
    base's k1 mean and their tolerances."""
    m = packed["response_mask"] & packed["teacher_mask"]
    s, q, b = (
        packed["base"][m].double(),
        packed["teacher_logprobs"][m].double(),
        packed["behavior_logprobs"][m],
    )
    ratio = torch.exp(s - b.double())
    assert (ratio > IS_CAP).any() and (ratio < IS_CAP).any()  # the truncation is exercised
    w = ratio.clamp(max=IS_CAP) if weighted else torch.ones_like(s)
    d = s - q
    lp_tol = forward_atol(packed["base"][m])
    if mode == "advantage":  # -w * exp(logp - s) * coef * (q - s), ratio 1
        per_token, slope = w * coef * d, w * coef * (1 + d.abs())
    else:  # coef * w * 0.5 * (logp - q)^2
        per_token, slope = coef * w * 0.5 * d**2, coef * w * (d.abs() + 0.5 * d**2)
    return float(per_token.mean()), float(d.mean()), lp_tol * float(slope.max()), lp_tol


@pytest.mark.parametrize("stage_b_weight", ["truncated_is", "none"])
def test_stage_b_distills_the_base_with_its_own_log_probs(tiny_random_model, stage_b_weight):
    norms = {}
    for mode in ("advantage", "loss"):
        learner = _learner(tiny_random_model, distill_mode=mode, rollout_head_stage_b_weight=stage_b_weight)
        batch, packed = _batch(learner, task_advantages=False)
        before = _snapshot(learner)
        metrics = learner.update_from_samples(batch, seed=0, phase=R2POPhase(BASE_STAGE))
        term, k1, tol, k1_tol = _expected_stage_b(packed, stage_b_weight == "truncated_is", mode, 0.5)
        # The base's reverse KL estimate (base minus teacher log-probs), not the head-on sampler's.
        assert metrics["distill_reverse_kl"] == pytest.approx(k1, abs=k1_tol)
        assert metrics["pg_loss"] == 0.0 and metrics["loss"] == pytest.approx(term, abs=tol)
        assert _moved(before, learner, head=False) and not _moved(before, learner, head=True)
        norms[mode] = metrics["grad_norm"]
    # Both modes' first step is the base's weighted reverse-KL gradient, w * (s - q) * grad log p per token.
    assert norms["advantage"] > 0 and norms["advantage"] == pytest.approx(norms["loss"], rel=1e-4)


@pytest.mark.parametrize("stage, kept", [(HEAD_STAGE, 0), (BASE_STAGE, 2)])
def test_zero_advantage_groups_stay_for_the_teacher_only_where_the_phase_distills(stage, kept):
    """A teacher-scored group with all-zero advantages is kept in stage B's batch (its tokens carry the teacher's
    term) and dropped from stage A's, where no term trains (it would only dilute the head's token mean)."""
    from r3_rllib.algorithms.r3.groups import build_training_batch
    from r3_rllib.core.iteration import IterationSettings
    from r3_rllib.types.samples import Group

    samples = [
        dataclasses.replace(s, reward=0.0, correct=False) for s in random_samples(2, 0, min_response_len=2)
    ]
    scored = [dataclasses.replace(s, teacher_logprobs=np.full(len(s.response_ids), -1.0)) for s in samples]
    batch, metrics = build_training_batch(
        [Group("scored", scored)], IterationSettings(phase=R2POPhase(stage))
    )
    assert len(batch) == kept and metrics["train_zero_adv_samples"] == kept
