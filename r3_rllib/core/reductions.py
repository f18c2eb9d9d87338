"""Sums whose float result does not depend on torch's CPU thread count (pure, no Ray).

The runners and learners change their torch thread count from phase to phase (``cpu_threads='auto'``,
core/threads.py), and with the machine's load. That is only safe if the numbers do not follow: a seeded run must
give the same numbers to the last bit however many threads each phase got.

Most of what a learner computes already is thread-invariant on CPU: matrix products (MKL/oneDNN split the output,
not the sum), element-wise ops, and reductions along a dimension with several outputs (each output is summed by one
thread in a fixed order). One kind is not: a reduction of a whole tensor to a single number with more than ATen's
grain size (32,768) elements. ATen then gives each thread a chunk and adds the partial sums, so the order of the
additions, and so the last bits of the result, can follow the thread count (whether they do depends on the data;
bench/bench_thread_invariance.py). A loss's token-mean over a micro-batch of more than 32,768 tokens is such a sum.

:func:`invariant_sum` sums rows of :data:`ROW` elements along a dimension (thread-invariant) until what is left is
small enough for one thread, so the result is the same for every thread count; below the grain size it is plain
``sum()``, so results of small tensors are the ones every earlier version gave.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: ATen's grain size (``at::internal::GRAIN_SIZE``): a whole-tensor reduction of at most this many elements runs on
#: one thread.
SERIAL_ELEMENTS = 32768

#: Row length of the partial sums of a larger tensor.
ROW = 1024


def invariant_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of all elements of ``x`` (a 0-dim tensor, differentiable), the same whatever ``torch.get_num_threads()``.

    Tensors of at most :data:`SERIAL_ELEMENTS` elements: ``x.sum()``. Larger ones: zero-padded to whole rows of
    :data:`ROW` elements, each row summed, repeated until at most :data:`SERIAL_ELEMENTS` partial sums are left.
    (Adding zeros is exact, so the padding does not change the result.) On CUDA, where torch's reductions do not
    depend on CPU threads, this is ``x.sum()``.
    """
    if x.device.type != "cpu":
        return x.sum()
    while x.numel() > SERIAL_ELEMENTS:
        flat = x.reshape(-1)
        x = F.pad(flat, (0, (-flat.numel()) % ROW)).view(-1, ROW).sum(dim=-1)
    return x.sum()


def invariant_masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(x * mask) / max(sum(mask), 1)`` with thread-invariant sums (``mask`` of x's shape, 0/1 entries)."""
    m = mask.to(x.dtype)
    return invariant_sum(x * m) / invariant_sum(m).clamp(min=1.0)
