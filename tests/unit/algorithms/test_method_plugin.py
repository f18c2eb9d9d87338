"""A training method with its own schedule attaches from outside the package (tests/plugins/toy_method.py): one
registration line and a config field; the settings carry its phases, the learner trains what each phase says (the
frozen parameters bit-identical, the others moved) and its metrics appear."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import torch
from numeric import TORCH_THREADS
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.iteration_settings import iteration_settings
from r3_rllib.core.method import METHODS, method_for, register_method
from r3_rllib.types import TrainingBatch

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


class _Logger:
    """Records what a phase logs (RLlib's MetricsLogger API)."""

    def __init__(self) -> None:
        self.values: dict = {}

    def log_value(self, key, value, **kwargs) -> None:
        self.values[key] = value

    def log_dict(self, values, *, key, **kwargs) -> None:
        self.values[key] = dict(values)


def _split(learner) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(embedding parameters, every other one) of the learner's policy, copied."""
    embedding_ids = {id(p) for p in learner.policy.get_input_embeddings().parameters()}
    emb, rest = {}, {}
    for name, p in learner.policy.named_parameters():
        (emb if id(p) in embedding_ids else rest)[name] = p.detach().clone()
    return emb, rest


def test_a_method_with_its_own_schedule_attaches_from_outside(tiny_random_model, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setattr("r3_rllib.core.method.METHODS", dict(METHODS))  # the registration ends with the test
    register_method("toy", "toy_method:TOY")  # the registration line

    config = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(model_path=tiny_random_model, micro_batch_size=4, gradient_checkpointing=False, lr=1e-2)
    )
    assert method_for(config).name == "default"
    config.toy_schedule = True  # the method's config field
    assert method_for(config).name == "toy"
    phases = [
        iteration_settings(config, dataset_epoch=0, policy_version=0, iteration=i).phase for i in range(4)
    ]
    assert [p.number for p in phases] == [1, 2, 1, 2]

    space = gym.spaces.Text(8)
    learner = config.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )
    batch = TrainingBatch.from_samples(random_samples(8, 0))

    emb0, rest0 = _split(learner)
    metrics = learner.update_from_samples(batch, seed=0, phase=phases[0])  # phase 1: embeddings only
    emb1, rest1 = _split(learner)
    assert all(torch.equal(rest0[k], rest1[k]) for k in rest0), "phase 1 moved a frozen parameter"
    assert any(not torch.equal(emb0[k], emb1[k]) for k in emb0), "phase 1 left the embeddings as they were"
    assert metrics["toy_embedding_norm"] > 0

    learner.update_from_samples(batch, seed=1, phase=phases[1])  # phase 2: everything
    emb2, rest2 = _split(learner)
    assert all(not torch.equal(rest1[k], rest2[k]) for k in rest1), "phase 2 left a parameter frozen"
    assert any(not torch.equal(emb1[k], emb2[k]) for k in emb1)

    logger = _Logger()
    settings = iteration_settings(config, dataset_epoch=0, policy_version=0, iteration=1)
    settings.phase.log_metrics(logger, {}, metrics)  # what R3 calls after every iteration
    assert logger.values[("toy", "phase")] == 2.0
