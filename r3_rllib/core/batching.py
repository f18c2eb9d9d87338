"""Micro-batch planning for the learner (pure numpy): which rows form each minibatch and each forward/backward pass."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def minibatch_plan(n: int, num_minibatches: int, seed: int) -> list[np.ndarray]:
    """Deterministic shuffled split of n sample indices into minibatches (same on every rank). At most ``n``
    minibatches: the config refuses more minibatches than a full batch holds (``minibatches_fit_the_batch``), so
    fewer happen only to a batch that shrank at run time (groups filtered or dropped), to one whose size the config
    cannot know (the steps of multi-step episodes), or to units fewer than the samples (:func:`unit_minibatch_plan`,
    a deferred ranking's groups kept whole)."""
    perm = np.random.default_rng(seed).permutation(n)
    return [mb for mb in np.array_split(perm, min(num_minibatches, n)) if len(mb)]


def token_budget_chunks(lengths: Sequence[int], max_tokens: int) -> list[np.ndarray]:
    """Split rows ``0..n-1`` into micro-batches whose padded size (rows x longest row) is at most ``max_tokens``.

    Rows are taken longest first and packed greedily, so each micro-batch is padded to its first row and rows of
    similar length share one; a row longer than the budget gets a micro-batch of its own. Returns index arrays.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    chunks: list[np.ndarray] = []
    current: list[int] = []
    width = 0
    for i in order:
        if current and (len(current) + 1) * width > max_tokens:
            chunks.append(np.asarray(current, dtype=np.int64))
            current = []
        if not current:
            width = int(lengths[i])
        current.append(int(i))
    if current:
        chunks.append(np.asarray(current, dtype=np.int64))
    return chunks


def row_count_chunks(
    rows: np.ndarray, minibatch_size: int, world: int, micro_batch_size: int
) -> list[np.ndarray]:
    """Split one rank's `rows` of a minibatch of `minibatch_size` rows into micro-batches of at most
    `micro_batch_size` rows; the count depends only on the minibatch's size, so every one of the `world` ranks gets
    the same number (FSDP's collectives line up without a count exchange)."""
    per_rank = math.ceil(minibatch_size / world)
    n_chunks = max(1, math.ceil(per_rank / micro_batch_size))
    return list(np.array_split(rows, n_chunks))  # empty chunks where a rank has fewer rows


def entropy_chunks(lengths: Sequence[int], budget: int | None, micro_batch_size: int) -> list[np.ndarray]:
    """Micro-batches of rows ``0..n-1`` for a no-grad pass over all of them: the token `budget` when set, else
    `micro_batch_size` rows each."""
    if budget:
        return token_budget_chunks(lengths, budget)
    n = len(lengths)
    return list(np.array_split(np.arange(n), max(1, -(-n // micro_batch_size))))


def rank_share(chunks: Sequence[np.ndarray], rank: int, world: int) -> list[np.ndarray]:
    """Rank ``rank``'s part of a no-grad pass that ``world`` ranks split: chunk ``i`` goes to rank ``i % world``,
    and a rank with fewer gets empty chunks up to ``ceil(len(chunks) / world)``, the count every rank makes (a
    sharded policy's forwards are collectives, pass by pass)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} ranks")
    mine = list(chunks[rank::world])
    return mine + [np.zeros(0, dtype=np.int64)] * (-(-len(chunks) // world) - len(mine))


def unit_minibatch_plan(units: Sequence[np.ndarray], num_minibatches: int, seed: int) -> list[np.ndarray]:
    """:func:`minibatch_plan` over units of rows that must stay together (a ranked group): the units are shuffled
    and split, each minibatch the concatenation of its units. With one row per unit (rows ``0..n-1`` in order)
    it is :func:`minibatch_plan` exactly."""
    n = len(units)
    perm = np.random.default_rng(seed).permutation(n)
    return [
        np.concatenate([units[u] for u in part]).astype(np.int64)
        for part in np.array_split(perm, min(num_minibatches, n))
        if len(part)
    ]


def unit_chunks(
    units: Sequence[np.ndarray], lengths: Sequence[int], budget: int | None, micro_batch_size: int
) -> list[np.ndarray]:
    """Micro-batches of whole units (one rank's units of a minibatch, in order), packed greedily: at most
    ``micro_batch_size`` rows, or with a token ``budget`` a padded size (rows x longest row) of at most
    ``budget``. A unit over the limit gets a micro-batch of its own."""
    chunks: list[np.ndarray] = []
    current: list[np.ndarray] = []
    rows, width = 0, 0
    for unit in units:
        unit_width = int(max(lengths[int(i)] for i in unit))
        wider = max(width, unit_width)
        over = (rows + len(unit)) * wider > budget if budget else rows + len(unit) > micro_batch_size
        if current and over:
            chunks.append(np.concatenate(current))
            current, rows, width = [], 0, 0
            wider = unit_width
        current.append(np.asarray(unit, dtype=np.int64))
        rows, width = rows + len(unit), wider
    if current:
        chunks.append(np.concatenate(current))
    return chunks
