"""The learner's pass for verl's KL penalty in the reward (learner_reward_kl.py): each row's summed KL of the
policy to the reference over its response tokens, the reference loaded for use_kl_in_reward alone (kl_coef 0)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.algorithms.r3.learner_reward_kl import reward_kl_sums
from r3_rllib.algorithms.r3.rl_module import pack_batch
from r3_rllib.core.losses import kl_penalty
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)


def _learner(model_path: str, **training) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(model_path=model_path, gradient_checkpointing=False, use_kl_in_reward=True, **training)
    )
    cfg.validate()
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _row_by_row(learner: R3Learner, batch: TrainingBatch, kind: str) -> np.ndarray:
    """Each row scored alone (no packing with others), its tokens' KL summed by hand."""
    out = []
    for i in range(len(batch)):
        packed = pack_batch(batch, np.array([i]), learner._pad_id, learner._device)
        mask = packed["response_mask"][0]
        with torch.no_grad():
            lp = learner._score(learner.policy, packed)[0][0][mask]
            ref = learner._score(learner._reference.model, packed)[0][0][mask]
        out.append(float(kl_penalty(lp, ref, kind).sum()))
    return np.array(out)


@pytest.mark.parametrize(
    ("kind", "lora"),
    [("k1", {}), ("k3", {}), pytest.param("k1", {"lora_rank": 4, "lora_alpha": 8.0}, id="k1-lora")],
)
def test_each_rows_kl_sum_is_its_tokens_kl_to_the_reference(tiny_random_model, kind, lora):
    if lora:
        pytest.importorskip("peft")
    # micro_batch_size 3: 7 rows in passes of 3 + 2 + 2, padded to each pass's longest row.
    learner = _learner(tiny_random_model, kl_penalty=kind, micro_batch_size=3, lr=1e-2, **lora)
    # Loaded for the reward's KL with kl_coef 0; with LoRA, the policy with its adapter off.
    assert learner._reference.model is not None
    assert (type(learner._reference.model).__name__ == "AdapterOff") == bool(lora)
    batch = TrainingBatch.from_samples(random_samples(7, max_response_len=6))
    # Before any update the policy is the reference: no KL.
    np.testing.assert_allclose(reward_kl_sums(learner, batch), 0.0, atol=1e-6)
    for seed in range(2):
        learner.update_from_samples(batch, seed=seed)
    got = reward_kl_sums(learner, batch)
    assert np.abs(got).max() > 1e-3  # the policy moved
    np.testing.assert_allclose(got, _row_by_row(learner, batch, kind), rtol=1e-4, atol=1e-5)
