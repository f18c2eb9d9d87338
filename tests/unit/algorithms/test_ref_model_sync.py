"""TRL's sync_ref_model: the KL term's reference moves toward the policy every ref_model_sync_steps optimizer steps
(``ref <- alpha * policy + (1 - alpha) * ref``), counted over the run, and checkpoints keep the moved reference."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from numeric import TORCH_THREADS
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.algorithms.r3.learner_kl import mix_toward
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)


def _learner(model_path: str, **training) -> R3Learner:
    settings = dict(
        kl_coef=0.1, sync_ref_model=True, lr=1e-2, micro_batch_size=3, gradient_checkpointing=False
    )
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(model_path=model_path, **{**settings, **training})
    )
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _batch(seed: int = 0) -> TrainingBatch:
    return TrainingBatch.from_samples(random_samples(6, seed))


def test_mix_toward_moves_each_parameter_alpha_of_the_way_by_hand():
    ref, policy = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[1.0, -2.0]]))
        ref.bias.fill_(0.5)
        policy.weight.copy_(torch.tensor([[2.0, 3.0]]))
        policy.bias.fill_(-0.5)
    mix_toward(ref, policy, 0.6)
    # 0.6 * policy + 0.4 * ref: 0.6*2 + 0.4*1 = 1.6, 0.6*3 - 0.4*2 = 1.0, -0.3 + 0.2 = -0.1 (fp32 rounding only).
    torch.testing.assert_close(ref.weight, torch.tensor([[1.6, 1.0]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(ref.bias, torch.tensor([-0.1]), rtol=0, atol=1e-6)
    bf16 = torch.nn.Linear(2, 1).to(torch.bfloat16)
    mix_toward(bf16, policy, 1.0)  # alpha 1: a copy, stored in the reference's dtype
    assert bf16.weight.dtype == torch.bfloat16 and bf16.weight.float().tolist() == [[2.0, 3.0]]
    with pytest.raises(RuntimeError, match="no parameter 'extra.weight'"):
        policy.extra = torch.nn.Linear(1, 1)
        mix_toward(ref, policy, 0.5)


def test_the_reference_moves_every_n_optimizer_steps_counted_over_updates(tiny_random_model):
    # 2 optimizer steps per update, a sync every 3: none in the first update, one at the second update's first step.
    learner = _learner(tiny_random_model, num_minibatches=2, ref_model_sync_steps=3)
    initial = _weights(learner._reference.model)
    m1 = learner.update_from_samples(_batch(0), seed=0)
    assert m1["ref_model_syncs"] == 0.0
    for n, t in _weights(learner._reference.model).items():
        assert torch.equal(t, initial[n]), n
    policy_at_step_3: dict[str, torch.Tensor] = {}
    step = learner._reference.after_optimizer_step

    def recorded(policy):
        if learner._reference.sync.steps == 2:  # the step about to be counted is the third
            policy_at_step_3.update(_weights(policy))
        step(policy)

    learner._reference.after_optimizer_step = recorded
    m2 = learner.update_from_samples(_batch(1), seed=1)
    assert m2["ref_model_syncs"] == 1.0 and learner._reference.sync.steps == 4
    moved = _weights(learner._reference.model)
    for n, t in moved.items():
        # fp32 lerp vs the same mix written out: rounding of values of order 1 (the tiny model's weights).
        expected = 0.6 * policy_at_step_3[n] + 0.4 * initial[n]
        torch.testing.assert_close(t, expected, rtol=1e-6, atol=1e-6)
    assert any(not torch.equal(moved[n], initial[n]) for n in moved)


def test_a_reference_copied_onto_the_policy_makes_the_next_kl_zero(tiny_random_model):
    learner = _learner(tiny_random_model, ref_model_mixup_alpha=1.0, ref_model_sync_steps=1)
    first = learner.update_from_samples(_batch(0), seed=0)
    assert first["kl"] == 0.0  # the first step's forward: the policy is still the reference
    second = learner.update_from_samples(_batch(1), seed=1)
    # The reference became the policy after step 1: the same weights through the same forward, so KL exactly 0;
    # without the sync the policy has moved away from it (lr 1e-2).
    assert second["kl"] == 0.0 and second["ref_model_syncs"] == 2.0
    unsynced = _learner(tiny_random_model, sync_ref_model=False)
    unsynced.update_from_samples(_batch(0), seed=0)
    assert unsynced.update_from_samples(_batch(1), seed=1)["kl"] > 1e-6


def test_a_checkpoint_keeps_the_moved_reference_and_its_clock(tiny_random_model, tmp_path):
    trained = _learner(tiny_random_model, ref_model_sync_steps=1)
    trained.update_from_samples(_batch(0), seed=0)
    trained.save_dcp(str(tmp_path / "ckpt"))
    fresh = _learner(tiny_random_model, ref_model_sync_steps=1)
    fresh.load_dcp(str(tmp_path / "ckpt"))
    saved, restored = _weights(trained._reference.model), _weights(fresh._reference.model)
    for n in saved:
        assert torch.equal(saved[n], restored[n]), n
    assert (fresh._reference.sync.steps, fresh._reference.sync.syncs) == (1, 1)
    # Saved without sync_ref_model: the reference restarts from the initial policy, and says so.
    plain = _learner(tiny_random_model, sync_ref_model=False)
    plain.update_from_samples(_batch(0), seed=0)
    plain.save_dcp(str(tmp_path / "plain"))
    synced = _learner(tiny_random_model)
    initial = _weights(synced._reference.model)
    with pytest.warns(UserWarning, match="saved without sync_ref_model"):
        synced.load_dcp(str(tmp_path / "plain"))
    assert all(torch.equal(t, initial[n]) for n, t in _weights(synced._reference.model).items())
    assert synced._reference.sync.steps == 0


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (dict(sync_ref_model=True), "sync_ref_model needs kl_coef > 0 or use_kl_in_reward"),
        (dict(sync_ref_model=True, kl_coef=0.1, lora_rank=4), "sync_ref_model with lora_rank > 0"),
        (dict(sync_ref_model=True, kl_coef=0.1, rollout_head=True), "sync_ref_model with rollout_head"),
        (dict(kl_coef=0.1, ref_model_sync_steps=64), "ref_model_sync_steps"),
        (dict(kl_coef=0.1, ref_model_mixup_alpha=0.9), "ref_model_mixup_alpha"),
    ],
)
def test_sync_ref_model_is_refused_where_it_would_not_act(settings, error):
    with pytest.raises(ValueError, match=error):
        R3Config().training(**settings).validate()
    R3Config().training(sync_ref_model=True, kl_coef=0.1, ref_model_sync_steps=64).validate()
    R3Config().training(sync_ref_model=True, use_kl_in_reward=True).validate()


def test_loading_the_reference_draws_no_progress_bar(tiny_random_model, capfd):
    """transformers 5 draws a "Loading weights" bar at each from_pretrained; the policy's load in every learner shows
    none (rl_module.py), and the reference's neither (models/progress_bars.py)."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    _learner(tiny_random_model)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # restored after the load
