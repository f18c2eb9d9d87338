"""The learner's learning rate: `lr` as a number or as RLlib's schedule (core/schedules.py). The algorithm reads the
schedule at the run's samples so far and hands each update its value (`update_from_samples(lr=...)`); the learner
sets it on the parameter groups without a rate of their own and reports it as learner/lr."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from numeric import TORCH_THREADS
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)

SCHEDULE = [[0, 1e-2], [64, 1e-3], [128, 0.0]]


def _learner(model_path: str, **training) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(model_path=model_path, gradient_checkpointing=False, **training)
    )
    cfg.validate()
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _weights(learner: R3Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.policy.parameters()]


def test_a_schedule_starts_at_its_first_value_and_each_update_takes_the_value_it_is_given(tiny_random_model):
    learner = _learner(tiny_random_model, lr=SCHEDULE)
    assert [g["lr"] for g in learner._optimizer.param_groups] == [1e-2]
    batch = TrainingBatch.from_samples(random_samples(8))
    assert learner.update_from_samples(batch, seed=0, lr=5.5e-3)["lr"] == 5.5e-3
    assert learner._optimizer.param_groups[0]["lr"] == 5.5e-3
    # None keeps the last rate (a caller that does not schedule).
    assert learner.update_from_samples(batch, seed=1)["lr"] == 5.5e-3
    # The schedule's end, 0: AdamW moves nothing at all (its decoupled weight decay is scaled by lr too).
    before = _weights(learner)
    assert learner.update_from_samples(batch, seed=2, lr=0.0)["lr"] == 0.0
    for a, b in zip(_weights(learner), before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert learner.update_from_samples(batch, seed=3, lr=1e-3)["lr"] == 1e-3
    assert any(not torch.equal(a, b) for a, b in zip(_weights(learner), before, strict=True))


def test_a_fixed_lr_is_reported_as_it_is(tiny_random_model):
    learner = _learner(tiny_random_model, lr=3e-4)
    metrics = learner.update_from_samples(TrainingBatch.from_samples(random_samples(8)), seed=0)
    assert metrics["lr"] == 3e-4


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([[0, 1e-5], [10, -1e-6]], "values must be >= 0"),
        ([[5, 1e-5], [10, 1e-6]], "start at timestep 0"),
        ([[0, 1e-5], [10, 1e-6], [5, 0.0]], "nondecreasing"),
        ([[0, "1e-5"], [10, 1e-6]], "finite numbers"),
        ([[0, 1e-5], [10, float("nan")]], "finite numbers"),
        ([[0, 1e-5]], "at least two"),
    ],
)
def test_a_malformed_schedule_is_refused_naming_lr(schedule, message):
    with pytest.raises(ValueError, match=rf"lr.*{message}"):
        R3Config.grpo_preset().training(lr=schedule).validate()
