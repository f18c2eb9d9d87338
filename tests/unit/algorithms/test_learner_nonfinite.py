"""A NaN/inf gradient never reaches the weights: the learner skips that optimizer step (AdamW's moments untouched),
counts it as learner/nonfinite_grad_steps, and steps normally again on the next finite gradient."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from numeric import TORCH_THREADS
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import learner as learner_module
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)


def _learner(model_path: str) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(
            model_path=model_path,
            micro_batch_size=4,
            gradient_checkpointing=False,
            lr=1e-2,
            num_minibatches=2,
        )
    )
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _params(learner: R3Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.policy.parameters()]


def test_a_nonfinite_gradient_skips_the_step_and_the_next_finite_one_steps(tiny_random_model, monkeypatch):
    learner = _learner(tiny_random_model)
    before = _params(learner)
    objective = learner_module.rl_objective

    def poisoned(*args, **kwargs):
        loss, metrics = objective(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(learner_module, "rl_objective", poisoned)
    metrics = learner.update_from_samples(TrainingBatch.from_samples(random_samples(8)), seed=0)
    assert metrics["optimizer_steps"] == 2.0 and metrics["nonfinite_grad_steps"] == 2.0
    assert math.isnan(metrics["grad_norm"]) and math.isnan(metrics["loss"])
    # Exact: a skipped step leaves every weight bit-identical, AdamW holds no state and no gradient is left over.
    for a, b in zip(_params(learner), before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not learner._optimizer.state
    assert all(p.grad is None for p in learner.policy.parameters())

    monkeypatch.setattr(learner_module, "rl_objective", objective)
    metrics = learner.update_from_samples(TrainingBatch.from_samples(random_samples(8)), seed=0)
    assert metrics["nonfinite_grad_steps"] == 0.0 and math.isfinite(metrics["grad_norm"])
    after = _params(learner)
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(torch.isfinite(p).all() for p in after)
