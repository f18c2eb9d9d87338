"""The learner's side of verl's KL penalty in the reward (use_kl_in_reward): each row's summed KL to the reference.

The driver asks for it before the advantages (``RewardKL`` in reward_kl.py) through
``collective_results(learner_group, lambda learner: reward_kl_sums(learner, sent))``: a no-grad pass over every
row, as ``R3Learner.score_entropies`` makes (every rank scores every row, so a sharded policy's collectives see the
same passes on all ranks). It reads the learner's scoring (``_score``: the rollout temperature, as verl scores
``old_log_prob`` and ``ref_log_prob``), its policy before the update (verl's ``old_log_prob``) and its frozen
reference (``_reference``, loaded when use_kl_in_reward is on: ``Method.needs_reference_model``; with LoRA the base
with the adapter off).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
import torch

from r3_rllib.algorithms.r3.learner_memory import tokens_per_pass
from r3_rllib.algorithms.r3.rl_module import pack_batch
from r3_rllib.core.batching import entropy_chunks
from r3_rllib.core.kl_reward import sequence_kl
from r3_rllib.types import TrainingBatch


@torch.no_grad()
def reward_kl_sums(learner: Any, batch: TrainingBatch | ray.ObjectRef) -> np.ndarray:
    """Each row's ``kl_penalty`` estimate of KL(policy || reference) summed over its trained response tokens
    (``[B]``, float64), for the ``R3Learner`` ``learner``; ``batch``: a ``TrainingBatch`` or an ObjectRef to one.
    Scored in micro-batches of the learner's budget (micro_batch_max_tokens / micro_batch_size)."""
    if isinstance(batch, ray.ObjectRef):
        batch = ray.get(batch)
    cfg = learner.config
    reference = learner._reference
    if reference.model is None:
        raise RuntimeError(
            "use_kl_in_reward: the learner holds no reference model (Method.needs_reference_model)"
        )
    budget = tokens_per_pass(cfg.micro_batch_max_tokens, cfg.model_path)
    out = np.zeros(len(batch), dtype=np.float64)
    for chunk in entropy_chunks(batch.lengths, budget, cfg.micro_batch_size):
        if not len(chunk):
            continue
        packed = pack_batch(batch, chunk, learner._pad_id, learner._device)
        logp = learner._score(learner.policy, packed)[0]
        ref = reference.logprobs(packed)
        sums = sequence_kl(logp.float(), ref.float(), packed["response_mask"], cfg.kl_penalty)
        out[chunk] = sums.double().cpu().numpy()
    return out
