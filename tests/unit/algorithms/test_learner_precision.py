"""Mixed precision of an unsharded learner (one learner, or replicated ones): fp32 master weights, bf16 forwards.

Casting the parameters to bf16 instead (what the learner did before) rounds every small AdamW step away: at lr 1e-6
a weight of the tiny model (|w| ~ 0.02, bf16 ulp ~1.2e-4) never moves, so a GPU run with one learner trained
nothing. The CPU runs the same autocast path with dtype='bfloat16'.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from numeric import TORCH_THREADS
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.types import TrainingBatch

torch.set_num_threads(TORCH_THREADS)


def _learner(model_path: str, dtype: str) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(
            model_path=model_path,
            dtype=dtype,
            lr=1e-6,  # the 1.5B recipes' learning rate
            num_minibatches=1,
            num_epochs=1,
            gradient_checkpointing=True,  # the recompute must run under the same autocast as the forward
        )
    )
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def test_bf16_learner_keeps_fp32_master_weights_and_moves_them_at_lr_1e_minus_6(tiny_random_model):
    learner = _learner(tiny_random_model, "bfloat16")
    params = [p for p in learner.policy.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in params)
    compute_dtypes: set[torch.dtype] = set()
    hook = learner.policy.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda _m, _i, out: compute_dtypes.add(out.dtype)
    )
    before = [p.detach().clone() for p in params]
    metrics = learner.update_from_samples(TrainingBatch.from_samples(random_samples(6, 0)), seed=0)
    hook.remove()

    assert compute_dtypes == {torch.bfloat16}  # forwards (and checkpoint recomputes) in bf16
    assert metrics["optimizer_steps"] == 1.0
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(params, before, strict=True))
    total = sum(b.numel() for b in before)
    # AdamW's first step moves every weight with a non-zero gradient by ~lr (plus weight decay): in fp32 (ulp of
    # 0.02 is 1.9e-9) all of them change. Cast to bf16 the same step changed only weights within ~1e-4 of zero
    # (2.1 % of the tiny model's, measured), so a bar of one half cannot pass on the old behaviour.
    assert moved / total > 0.5, f"only {moved} of {total} weights changed"


def test_fp32_learner_runs_without_autocast(tiny_random_model):
    learner = _learner(tiny_random_model, "float32")
    seen: set[torch.dtype] = set()
    hook = learner.policy.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda _m, _i, out: seen.add(out.dtype)
    )
    learner.update_from_samples(TrainingBatch.from_samples(random_samples(4, 1)), seed=0)
    hook.remove()
    assert seen == {torch.float32}
