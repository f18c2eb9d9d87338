"""The learner's distillation term (learner_distill.py, DistillTerm): its value and metrics on tiny tensors, the task
advantages it zeroes, the teacher coverage it counts, and an R3Learner (full and LoRA) that distills: updates on
the teacher's signal alone bring the student's log-probs of the sampled tokens toward the teacher's."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, f32_tol
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner_distill import DistillTerm
from r3_rllib.algorithms.r3.rl_module import pack_batch
from r3_rllib.core.logprobs import token_logprobs
from r3_rllib.distill.teacher import TeacherScorer
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)


def _term(**fields) -> DistillTerm:
    base = dict(
        distill_teacher="teacher",
        distill_mode="loss",
        distill_coef=2.0,
        distill_task_reward=True,
        loss_agg_mode="token-mean",
        max_new_tokens=8,
        log_ratio_clamp=20.0,
    )
    return DistillTerm(SimpleNamespace(**(base | fields)))


PACKED = {
    "response_mask": torch.tensor([[False, True, True]]),
    "behavior_logprobs": torch.tensor([[0.0, -1.0, -2.0]]),
    "teacher_logprobs": torch.tensor([[0.0, -1.5, -1.0]]),
    "teacher_mask": torch.tensor([[False, True, True]]),
}


def test_term_by_hand_in_both_modes():
    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    metrics: dict = {}
    loss = _term().add(torch.tensor(1.0), metrics, PACKED, logp)
    # 1 + 2 * (0.5 * (0.5^2 + 1^2)) / 2 tokens
    assert loss.item() == pytest.approx(1.0 + 0.625)
    assert metrics["distill_reverse_kl"].item() == pytest.approx(-0.25)
    assert metrics["distill_loss"].item() == pytest.approx(0.625)
    metrics = {}
    loss = _term(distill_mode="advantage", distill_coef=0.5).add(torch.tensor(1.0), metrics, PACKED, logp)
    # ratio 1: 1 - mean(-0.5 * [0.5, -1.0])
    assert loss.item() == pytest.approx(1.0 - 0.125)
    assert metrics["distill_advantage_mean"].item() == pytest.approx(0.125)


def test_no_teacher_column_reports_zeros_and_no_teacher_adds_nothing():
    packed = {k: PACKED[k] for k in ("response_mask", "behavior_logprobs")}
    metrics: dict = {}
    loss = torch.tensor(0.5)
    assert _term().add(loss, metrics, packed, torch.zeros(1, 3)) is loss
    assert set(metrics) == {"distill_reverse_kl", "distill_loss"}  # the same keys in every pass
    metrics = {}
    assert _term(distill_teacher=None).add(loss, metrics, PACKED, torch.zeros(1, 3)) is loss and not metrics


def test_task_advantages_and_coverage():
    adv = torch.tensor([1.0, -1.0])
    assert torch.equal(_term().task_advantages(adv), adv)
    assert torch.equal(_term(distill_task_reward=False).task_advantages(adv), torch.zeros(2))
    samples = random_samples(3, 0, min_response_len=2)
    samples[0] = dataclasses.replace(samples[0], teacher_logprobs=np.full(len(samples[0].response_ids), -1.0))
    batch = TrainingBatch.from_samples(samples)
    counted = _term().update_metrics(batch)
    assert counted["distill_teacher_tokens"] == len(samples[0].response_ids)
    assert counted["distill_teacher_token_frac"] == pytest.approx(
        len(samples[0].response_ids) / batch.trained_tokens.sum()
    )
    assert _term(distill_teacher=None).update_metrics(batch) == {}


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory) -> str:
    """Another tiny model with the same vocabulary (another seed): a teacher the student is far from."""
    path = tmp_path_factory.mktemp("tiny_teacher")
    tok = build_tiny_tokenizer()
    save_tiny(build_tiny_model(tok, seed=7), tok, path)
    return str(path)


def _learner(model_path: str, **training):
    space = gym.spaces.Text(8)
    spaces = {"__env__": (space, space), "default_policy": (space, space)}
    settings = dict(
        model_path=model_path,
        micro_batch_size=4,
        gradient_checkpointing=False,
        lr=1e-3,
        distill_teacher="teacher",  # the learner reads the samples' teacher log-probs, never the model
        distill_task_reward=False,
    )
    config = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(**(settings | training))
    )
    return config.build_learner(env=None, spaces=spaces)


def _distance(learner, batch: TrainingBatch) -> float:
    """Mean squared gap between the student's and the teacher's log-probs of the sampled tokens."""
    packed = pack_batch(batch, np.arange(len(batch)), 0, "cpu")
    with torch.no_grad():
        logp = token_logprobs(
            learner.policy,
            packed["input_ids"],
            packed["attention_mask"],
            response_mask=packed["response_mask"],
        )[0]
    m = packed["teacher_mask"]
    return float(((logp - packed["teacher_logprobs"])[m] ** 2).mean())


def _on_policy_batch(student_path: str, teacher_path: str) -> tuple[TrainingBatch, np.ndarray]:
    """Samples whose sampler log-probs are the student's own (on-policy: scored as the teacher is) with the
    teacher's log-probs attached; and the per-token sampler-minus-teacher gaps."""
    rows = [(s.prompt_ids, s.response_ids, None) for s in random_samples(8, 0, min_response_len=2)]
    teacher = TeacherScorer(teacher_path, temperature=1.0, micro_batch_size=8).score(rows)
    student = TeacherScorer(student_path, temperature=1.0, micro_batch_size=8).score(rows)
    samples = [
        dataclasses.replace(s, behavior_logprobs=b, teacher_logprobs=t)
        for s, b, t in zip(random_samples(8, 0, min_response_len=2), student, teacher, strict=True)
    ]
    return TrainingBatch.from_samples(samples), np.concatenate(student) - np.concatenate(teacher)


@pytest.mark.parametrize(
    "training",
    [
        {"distill_mode": "loss", "lr": 1e-4},
        {"distill_mode": "advantage", "lr": 1e-4},
        {"distill_mode": "loss", "lora_rank": 4, "lr": 1e-3},
    ],
    ids=["loss", "advantage", "lora"],
)
def test_a_learner_distills_toward_the_teacher(tiny_random_model, tiny_teacher, training):
    if training.get("lora_rank"):
        pytest.importorskip("peft")
    learner = _learner(tiny_random_model, **training)
    batch, gaps = _on_policy_batch(tiny_random_model, tiny_teacher)
    before = _distance(learner, batch)
    metrics = learner.update_from_samples(batch, seed=0)
    # The reverse KL estimate: the sampler's log-probs minus the teacher's, over every trained token.
    # float32 sums of the same numbers in another order: a few ulps of the sum of their magnitudes.
    tolerance = f32_tol(float(np.abs(gaps).sum()), 4)
    assert metrics["distill_reverse_kl"] == pytest.approx(float(gaps.mean()), rel=0, abs=tolerance)
    assert metrics["distill_teacher_tokens"] == batch.trained_tokens.sum()
    assert _distance(learner, batch) < 0.5 * before


def test_the_entropy_bonus_adds_to_the_distillation_term(tiny_random_model, tiny_teacher):
    """Distillation with verl's entropy bonus on: the objective is the (zero) task term plus the k2 term minus the
    bonus, each logged, and the student still moves toward the teacher."""
    learner = _learner(tiny_random_model, distill_mode="loss", lr=1e-4, entropy_coef=0.01)
    batch, _ = _on_policy_batch(tiny_random_model, tiny_teacher)
    before = _distance(learner, batch)
    metrics = learner.update_from_samples(batch, seed=0)
    assert metrics["entropy_bonus"] > 0 and metrics["distill_loss"] > 0
    # float32 sums of a few dozen tokens' terms of order 1 (k2 of gaps ~1, entropies ~4 x 0.01).
    expected = metrics["pg_loss"] + metrics["distill_loss"] - metrics["entropy_bonus"]
    assert metrics["loss"] == pytest.approx(expected, rel=0, abs=f32_tol(8.0, 64))
    assert _distance(learner, batch) < 0.5 * before


def test_both_modes_take_the_same_first_step_on_policy(tiny_random_model, tiny_teacher):
    """On the student's own samples, the advantage mode's importance-sampling term and the k2 loss have the same
    gradient (both the reverse KL's): (b - q) grad log p per token, with b = log p."""
    batch, _ = _on_policy_batch(tiny_random_model, tiny_teacher)
    norms = [
        _learner(tiny_random_model, distill_mode=mode).update_from_samples(batch, seed=0)["grad_norm"]
        for mode in ("loss", "advantage")
    ]
    assert norms[0] > 0 and norms[1] == pytest.approx(norms[0], rel=1e-4)


def test_zero_advantage_groups_with_teacher_log_probs_stay_in_the_batch():
    """A group whose rewards are all equal carries no task gradient and leaves the batch, unless the teacher scored
    its samples: their tokens then carry the teacher's signal (groups.py)."""
    from r3_rllib.algorithms.r3.groups import build_training_batch
    from r3_rllib.core.iteration import IterationSettings
    from r3_rllib.types.samples import Group

    plain = random_samples(4, 0, min_response_len=2)
    plain = [dataclasses.replace(s, reward=0.0, correct=False) for s in plain]
    scored = [dataclasses.replace(s, teacher_logprobs=np.full(len(s.response_ids), -1.0)) for s in plain]
    groups = [Group("plain", plain[:2]), Group("scored", scored[2:])]
    batch, metrics = build_training_batch(groups, IterationSettings())
    assert [s.query_id for s in batch] == [s.query_id for s in scored[2:]]
    assert all(s.advantage == 0.0 and s.teacher_logprobs is not None for s in batch)
    assert metrics["zero_adv_frac"] == 1.0 and metrics["train_zero_adv_samples"] == 2


def test_distillation_rules_refuse_what_would_not_train_as_asked():
    from types import SimpleNamespace

    from r3_rllib import R3Config
    from r3_rllib.config.rules import distill_settings_need_a_teacher, distillation_has_no_rejection

    alone = SimpleNamespace(distill_teacher=None, distill_task_reward=False)
    assert "set distill_teacher" in distill_settings_need_a_teacher(alone)
    assert (
        distill_settings_need_a_teacher(SimpleNamespace(distill_teacher="t", distill_task_reward=False))
        is None
    )
    rejecting = SimpleNamespace(distill_teacher="t", rollout_rs="token")
    assert "rollout_rs='token' is not supported" in distillation_has_no_rejection(rejecting)
    assert distillation_has_no_rejection(SimpleNamespace(distill_teacher="t", rollout_rs=None)) is None
    assert distillation_has_no_rejection(SimpleNamespace(distill_teacher=None, rollout_rs="token")) is None
    with pytest.raises(ValueError, match="distill_teacher with rollout_rs='sequence' is not supported"):
        R3Config().training(
            distill_teacher="teacher", rollout_rs="sequence", rollout_rs_threshold=2.0
        ).validate()
