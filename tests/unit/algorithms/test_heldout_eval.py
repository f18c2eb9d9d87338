"""Held-out evaluation split over runners: the parts cover the queries once, in order; counts merge into the same
numbers one runner would report."""

from __future__ import annotations

import pytest

from r3_rllib.algorithms.r3.heldout import eval_seed, eval_shard, merge_eval_counts


@pytest.mark.parametrize("n,count", [(64, 2), (7, 3), (2, 4), (0, 2), (500, 1)])
def test_shards_cover_the_first_n_queries_once_in_order(n, count):
    parts = [eval_shard(n, i, count) for i in range(count)]
    assert [q for p in parts for q in p] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shard_index_out_of_range_is_an_error():
    with pytest.raises(ValueError, match="outside 0..1"):
        eval_shard(10, 2, 2)


def test_eval_seeds_are_fixed_and_differ_per_part():
    assert eval_seed(0, 0) == eval_seed(0, 0)
    assert len({eval_seed(s, i) for s in (0, 1) for i in (0, 1, 2)}) == 6


def test_single_step_counts_merge_to_accuracy():
    parts = [
        {"queries": 3.0, "samples": 12.0, "correct": 3.0},
        {"queries": 2.0, "samples": 8.0, "correct": 7.0},
    ]
    assert merge_eval_counts(parts) == {"accuracy": 0.5, "num_queries": 5.0}


def test_episode_counts_merge_to_success_length_and_steps_to_goal():
    # Runner 1: 4 trajectories, lengths 3, 5, 20, 20, the first two reach the goal; runner 2: 2 trajectories of
    # 20 steps, none reaches it. One runner over all six: success 2/6, mean length 88/6, steps to goal 8/2.
    parts = [
        {"queries": 1.0, "samples": 4.0, "correct": 2.0, "length_sum": 48.0, "goal_steps_sum": 8.0},
        {"queries": 1.0, "samples": 2.0, "correct": 0.0, "length_sum": 40.0, "goal_steps_sum": 0.0},
    ]
    out = merge_eval_counts(parts)
    assert out["accuracy"] == pytest.approx(2 / 6)
    assert out["episode_len_mean"] == pytest.approx(88 / 6)
    assert out["steps_to_goal"] == 4.0 and out["num_queries"] == 2.0
    assert "steps_to_goal" not in merge_eval_counts(parts[1:])  # nothing succeeded: absent, not NaN
    with pytest.raises(ValueError, match="no evaluation results"):
        merge_eval_counts([])
