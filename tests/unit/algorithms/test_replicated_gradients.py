"""Replicated learners (fsdp=False): `average_gradients` buckets, averages in fp32 and writes back, with the
collective replaced by a stand-in for a second rank (the two-process run is tests/e2e/test_distributed_and_checkpoint)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import r3_rllib.algorithms.r3.distributed as distributed_module
from r3_rllib.algorithms.r3.distributed import _buckets, average_gradients


def test_buckets_split_at_the_element_budget():
    sizes = [3, 2, 4, 7, 1]
    buckets = _buckets([torch.zeros(n) for n in sizes], 5)
    assert [[t.numel() for t in b] for b in buckets] == [[3, 2], [4], [7], [1]]


def _other_rank(monkeypatch, bounds: list[int]) -> list[torch.Tensor]:
    """Stand in for a second rank whose gradients are twice ours and whose [count, numel] is `bounds`."""
    sent: list[torch.Tensor] = []

    def all_reduce(t, op=dist.ReduceOp.SUM):
        if op == dist.ReduceOp.MAX:
            other = torch.tensor(bounds + [-b for b in bounds], dtype=t.dtype)
            t.copy_(torch.maximum(t, other))
        else:
            sent.append(t.clone())
            t.mul_(3.0)  # ours + the other rank's (2 x ours)

    monkeypatch.setattr(
        distributed_module, "dist", SimpleNamespace(all_reduce=all_reduce, ReduceOp=dist.ReduceOp)
    )
    return sent


def test_gradients_are_averaged_in_fp32_buckets_and_written_back_in_their_dtype(monkeypatch):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (6, 2, 2)]
    params.append(torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16)))
    params.append(torch.nn.Parameter(torch.zeros(4)))  # frozen: no gradient, skipped
    for i, p in enumerate(params[:4]):
        p.grad = torch.full_like(p, float(i + 1))
    sent = _other_rank(monkeypatch, [4, 13])
    average_gradients(params, 2, bucket_numel=4)
    # 6 | 2 + 2 | 3 elements: three all-reduces, all in fp32.
    assert [t.numel() for t in sent] == [6, 4, 3] and all(t.dtype == torch.float32 for t in sent)
    for i, p in enumerate(params[:4]):
        assert torch.equal(p.grad, torch.full_like(p, 1.5 * (i + 1)))  # (ours + 2 x ours) / 2
    assert params[3].grad.dtype == torch.bfloat16 and params[4].grad is None


def test_ranks_with_gradients_on_different_parameters_are_refused(monkeypatch):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
    params[0].grad = torch.ones(2)
    sent = _other_rank(monkeypatch, [2, 4])  # the other rank has a gradient on both
    with pytest.raises(RuntimeError, match="gradients on different parameters"):
        average_gradients(params, 2)
    assert sent == []  # nothing mixed
