"""The learners' no-grad scoring passes (R^3's ranking entropies, the in-reward KL) split over two ranks
(learner_scoring.py): two learner processes over gloo, FSDP2-sharded and replicated, each score their share of the
micro-batches and both return every row's result, the same as each rank scoring every row and as one learner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from numeric import FORWARD_ULPS, f32_tol, forward_atol, logprob_bound
from random_samples import random_samples

from r3_rllib.algorithms.r3.learner_reward_kl import reward_kl_sums
from r3_rllib.algorithms.r3.learner_scoring import RankShare
from r3_rllib.models import default_tiny_model_path
from r3_rllib.types import TrainingBatch

WORLD = 2
#: 5 rows in micro-batches of 2: 3 chunks, so rank 0 scores two and rank 1 one, plus a dummy pass when sharded.
ROWS, MICRO_BATCH = 5, 2

pytestmark = pytest.mark.slow  # two processes that import torch and transformers, two learners each: ~15 s


def _learner(num_learners: int, fsdp: bool):
    import gymnasium as gym

    from r3_rllib import R3Config

    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=num_learners, num_cpus_per_learner=1)
        .training(
            model_path=default_tiny_model_path(),
            gradient_checkpointing=False,
            use_kl_in_reward=True,
            micro_batch_size=MICRO_BATCH,
            micro_batch_max_tokens=None,
            fsdp=fsdp,
        )
    )
    cfg.validate()
    space = gym.spaces.Text(8)
    learner = cfg.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )
    with torch.no_grad():  # move the policy off its reference, the same on every rank (a shard's part of it)
        for p in learner.policy.parameters():
            p.add_(0.01)
    return learner


def _batch() -> TrainingBatch:
    return TrainingBatch.from_samples(random_samples(ROWS, seed=3, max_response_len=6))


def _scored(learner, share: RankShare) -> dict:
    """Both passes under ``share``, and the rows of each forward of the policy this rank made."""
    passes: list[int] = []
    score = learner._score

    def counting(model, packed, **kwargs):
        if model is learner.policy:
            passes.append(int(packed["input_ids"].shape[0]))
        return score(model, packed, **kwargs)

    learner._score, learner._share = counting, share
    entropies = learner.score_entropies(_batch())
    kl = reward_kl_sums(learner, _batch())
    del learner._score
    return {"entropies": entropies, "kl": kl, "passes": passes}


def _rank(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = {}
        for fsdp in (True, False):
            learner = _learner(WORLD, fsdp)
            assert learner._share == RankShare(rank, WORLD, sharded=fsdp)
            results[fsdp] = {
                "split": _scored(learner, learner._share),
                "everything": _scored(learner, RankShare()),  # every rank scores every row: the old pass
            }
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_two_ranks_split_the_scoring_passes_and_return_every_row(tmp_path):
    out = str(tmp_path / "rank")
    mp.spawn(_rank, args=(str(tmp_path / "init"), out), nprocs=WORLD)
    single = _learner(0, False)
    alone, model = _scored(single, RankShare()), single.policy
    assert alone["passes"] == [2, 2, 1, 2, 2, 1]  # entropies, then the KL: 3 chunks each
    for rank in range(WORLD):
        results = torch.load(f"{out}.{rank}", weights_only=False)
        for fsdp, got in results.items():
            split, everything = got["split"], got["everything"]
            # Rank 0 scores chunks 0 and 2 (2 + 1 rows), rank 1 chunk 1 and, sharded, a dummy pass on one row.
            mine = [2, 1] if rank == 0 else ([2, 1] if fsdp else [2])
            assert split["passes"] == mine * 2, (rank, fsdp)
            assert everything["passes"] == alone["passes"]
            # A chunk is scored as by one rank alone: the split results are the old pass's to the bit.
            assert np.array_equal(split["kl"], everything["kl"]), (rank, fsdp)
            for a, b in zip(split["entropies"], everything["entropies"], strict=True):
                assert np.array_equal(a, b), (rank, fsdp)
            # And one learner's (no sharding), to float32 forward rounding: entropies at their scale, each KL sum
            # over at most 6 tokens of two log-prob differences at the model's log-prob bound.
            for a, b in zip(split["entropies"], alone["entropies"], strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=forward_atol(a, b))
            kl_tol = 6 * 2 * f32_tol(logprob_bound(model), FORWARD_ULPS)
            np.testing.assert_allclose(split["kl"], alone["kl"], rtol=0, atol=kl_tol)
            # The policy moved off its reference: the largest sum was 28.0 on 2026-11-29, the tolerance 0.011.
            assert np.abs(split["kl"]).max() > 1e3 * kl_tol
