"""core/reductions.py: whole-tensor sums that are the same to the last bit for every torch thread count, and that
are plain ``sum()`` below ATen's grain size (so small results did not change)."""

from __future__ import annotations

import pytest
import torch
from numeric import f32_tol

from r3_rllib.core.losses import aggregate_loss
from r3_rllib.core.reductions import SERIAL_ELEMENTS, invariant_masked_mean, invariant_sum

THREADS = (1, 2, 3)


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def per_thread(fn):
    out = {}
    for t in THREADS:
        torch.set_num_threads(t)
        out[t] = fn()
    return out


def _data(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g) * 100.0 + 0.5


def test_a_plain_sum_of_a_large_tensor_follows_the_thread_count():
    """Why the module exists: ATen splits a whole-tensor sum of more than its grain size among the threads, so the
    last bits of the same seeded data's sum can follow the thread count. Whether they do depends on the data (one
    draw may round alike in both orders), so five draws: at least one differs."""
    g = torch.Generator().manual_seed(1)
    draws = [torch.randn(40, 2000, generator=g) * 100.0 + 0.5 for _ in range(5)]
    assert any(len({float(s) for s in per_thread(lambda x=x: x.sum()).values()}) > 1 for x in draws)


@pytest.mark.parametrize("shape", [(40, 2000), (200_001,), (7, 33, 500), (SERIAL_ELEMENTS + 1,), (3, 4)])
def test_invariant_sum_is_the_same_for_every_thread_count_and_is_the_sum(shape):
    x = _data(*shape)
    sums = per_thread(lambda: invariant_sum(x))
    assert all(torch.equal(sums[1], s) for s in sums.values())
    exact = float(x.double().sum())
    # Error of a float32 sum of N terms: <= N eps32 sum |x| (tests/numeric.py); checked against float64.
    assert abs(float(sums[1]) - exact) <= f32_tol(float(x.abs().sum()), x.numel())


def test_small_tensors_keep_plain_sum():
    x = _data(SERIAL_ELEMENTS)
    assert torch.equal(invariant_sum(x), x.sum())


def test_invariant_sum_has_the_gradient_of_a_sum():
    x = _data(50, 1000).requires_grad_(True)
    invariant_sum(x * 3.0).backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))


def test_masked_mean_and_token_mean_loss_are_thread_invariant_with_their_gradients():
    """A micro-batch of 40 x 2,000 = 80,000 tokens: the loss and its gradient are bit-identical at 1, 2, 3 threads."""
    per_token = _data(40, 2000)
    mask = (_data(40, 2000) > 0).float()

    def loss_and_grad():
        x = per_token.clone().requires_grad_(True)
        loss = aggregate_loss(x * 0.01, mask, "token-mean")
        loss.backward()
        return loss.detach(), x.grad, invariant_masked_mean(per_token, mask)

    out = per_thread(loss_and_grad)
    for t in THREADS:
        assert all(torch.equal(a, b) for a, b in zip(out[1], out[t], strict=True)), t
