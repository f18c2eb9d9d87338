"""sync_ref_model with a sharded policy: two FSDP2 ranks over gloo (what two learners run) gather each parameter to
move their full, unsharded reference, and a DCP checkpoint of the two ranks restores the moved reference and its
clock on both."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from r3_rllib.algorithms.r3.distributed import shard_policy
from r3_rllib.algorithms.r3.learner_kl import KLReference, ReferenceSync
from r3_rllib.algorithms.r3.learner_state import PolicyState
from r3_rllib.models import default_tiny_model_path, load_tiny

WORLD = 2

pytestmark = pytest.mark.slow  # two processes that import torch and transformers: ~10 s


def _state(policy, reference: KLReference, rank: int) -> PolicyState:
    config = types.SimpleNamespace(use_fsdp=True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    return PolicyState(
        policy, optimizer, rank=rank, world=WORLD, config=config, lora=None, reference=reference
    )


def _rank(rank: int, init_file: str, ckpt: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        policy, _ = load_tiny(default_tiny_model_path())
        shard_policy(policy, "cpu", WORLD, torch.float32)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1.0)  # each rank moves its own shard: the policy is now initial + 1 everywhere
        ref_model, _ = load_tiny(default_tiny_model_path())
        initial = {n: p.detach().clone() for n, p in ref_model.named_parameters()}
        reference = KLReference(ref_model, score=None, sync=ReferenceSync(alpha=0.25, every=1))
        reference.after_optimizer_step(policy)  # every=1: this step syncs (collective over the two ranks)
        moved = {n: p.detach().clone() for n, p in ref_model.named_parameters()}
        _state(policy, reference, rank).save_dcp(ckpt)

        fresh_model, _ = load_tiny(default_tiny_model_path())
        fresh_policy, _ = load_tiny(default_tiny_model_path())
        shard_policy(fresh_policy, "cpu", WORLD, torch.float32)
        fresh = KLReference(fresh_model, score=None, sync=ReferenceSync(alpha=0.25, every=1))
        _state(fresh_policy, fresh, rank).load_dcp(ckpt)
        restored = {n: p.detach().clone() for n, p in fresh_model.named_parameters()}
        torch.save(
            {
                "initial": initial,
                "moved": moved,
                "restored": restored,
                "clock": (fresh.sync.steps, fresh.sync.syncs),
            },
            f"{out}.{rank}",
        )
    finally:
        dist.destroy_process_group()


def test_two_fsdp_ranks_move_their_whole_reference_and_restore_it(tmp_path):
    out = str(tmp_path / "rank")
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path / "ckpt"), out), nprocs=WORLD)
    for rank in range(WORLD):
        r = torch.load(f"{out}.{rank}")
        assert r["clock"] == (1, 1)
        for name, start in r["initial"].items():
            # 0.25 * (initial + 1) + 0.75 * initial = initial + 0.25: fp32 rounding at the weights' scale (~1).
            torch.testing.assert_close(r["moved"][name], start + 0.25, rtol=0, atol=1e-6)
            assert torch.equal(r["restored"][name], r["moved"][name]), name
