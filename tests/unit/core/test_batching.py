"""Micro-batch planning (core/batching.py), on hand-computed splits."""

from __future__ import annotations

import numpy as np
import pytest

from r3_rllib.core.batching import (
    entropy_chunks,
    minibatch_plan,
    rank_share,
    row_count_chunks,
    token_budget_chunks,
)


def test_minibatch_plan_is_a_seeded_partition():
    plan = minibatch_plan(10, 3, seed=4)
    assert [len(mb) for mb in plan] == [4, 3, 3]
    assert sorted(np.concatenate(plan).tolist()) == list(range(10))
    assert all(np.array_equal(a, b) for a, b in zip(plan, minibatch_plan(10, 3, seed=4), strict=True))
    assert len(minibatch_plan(2, 5, seed=0)) == 2  # never an empty minibatch


def test_token_budget_packs_longest_first_within_the_budget():
    chunks = token_budget_chunks([3, 9, 4, 2, 8], 16)
    # Longest first, each chunk padded to its first row: 9 alone (9 + 8 pads to 18), 8 + 4 pad to 16, 3 + 2 to 6.
    assert [c.tolist() for c in chunks] == [[1], [4, 2], [0, 3]]


def test_row_count_chunks_give_every_rank_the_same_count():
    rows = np.arange(0, 10, 2)  # rank 0's 5 rows of a 10-row minibatch over 2 ranks
    chunks = row_count_chunks(rows, 10, 2, 2)  # ceil(ceil(10 / 2) / 2) = 3 chunks
    assert [c.tolist() for c in chunks] == [[0, 2], [4, 6], [8]]
    no_rows = row_count_chunks(np.arange(0), 10, 2, 2)  # a rank with no rows still runs 3 (padding) passes
    assert [c.tolist() for c in no_rows] == [[], [], []]


def test_entropy_chunks_use_the_budget_or_rows():
    assert [c.tolist() for c in entropy_chunks([2, 2, 2, 2, 2], None, 2)] == [[0, 1], [2, 3], [4]]
    assert [c.tolist() for c in entropy_chunks([2, 5, 2], 6, 2)] == [[1], [0, 2]]


def test_rank_share_splits_chunks_round_robin_with_the_same_count_on_every_rank():
    chunks = [np.array([0, 1]), np.array([2]), np.array([3, 4]), np.array([5])]
    by_rank = [[c.tolist() for c in rank_share(chunks, r, 3)] for r in range(3)]
    # 4 chunks over 3 ranks: two passes each, rank 0 both real, ranks 1 and 2 one real and one empty.
    assert by_rank == [[[0, 1], [5]], [[2], []], [[3, 4], []]]
    assert [c.tolist() for c in rank_share(chunks, 0, 1)] == [c.tolist() for c in chunks]
    assert rank_share([], 1, 2) == []  # nothing to score: no pass on any rank
    assert [c.tolist() for c in rank_share([np.array([0])], 1, 2)] == [[]]  # still one pass, empty
    with pytest.raises(ValueError, match="rank 2 is not one of 2 ranks"):
        rank_share(chunks, 2, 2)
