"""DAPO's soft overlong penalty and dynamic-sampling filter (hand-computed)."""

import numpy as np
import pytest

from r3_rllib.core.reward_shaping import OverlongShaping, keep_group, overlong_penalty


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    # L_max = 20, L_cache = 4: free up to 16 tokens, then -1/4 per token, -1 at 20, and -1 beyond.
    lengths = [0, 10, 16, 17, 18, 19, 20, 25]
    got = overlong_penalty(lengths, max_length=20, buffer_length=4)
    np.testing.assert_allclose(got, [0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])
    # The factor scales the whole curve (DAPO's penalty_factor).
    np.testing.assert_allclose(
        overlong_penalty([17, 20], max_length=20, buffer_length=4, penalty_factor=0.5), [-0.125, -0.5]
    )


def test_overlong_penalty_at_dapo_values():
    # DAPO: L_max = 20480, L_cache = 4096: 16384 tokens are free, 18432 is half-way, 20480 gets -1.
    shaping = OverlongShaping(max_length=20480, buffer_length=4096)
    np.testing.assert_allclose(shaping.penalties([16384, 18432, 20480]), [0.0, -0.5, -1.0])


def test_overlong_penalty_rejects_a_buffer_outside_the_budget():
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty([1], max_length=8, buffer_length=9)
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty([1], max_length=8, buffer_length=0)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_penalty([1], max_length=8, buffer_length=2, penalty_factor=-1)


def test_keep_group_on_accuracy_ignores_reward_differences():
    # All correct with a length bonus (rewards differ): dropped on accuracy, kept on reward.
    assert not keep_group([True, True], [1.5, 1.2], "accuracy")
    assert keep_group([True, True], [1.5, 1.2], "reward")
    # All wrong, equal rewards: dropped by both; mixed: kept by both.
    assert not keep_group([False, False], [0.0, 0.0], "accuracy")
    assert not keep_group([False, False], [0.0, 0.0], "reward")
    assert keep_group([True, False], [1.0, 0.0], "accuracy") and keep_group(
        [True, False], [1.0, 0.0], "reward"
    )
    assert keep_group([False], [0.0], "accuracy")  # one response: kept, as in verl
    with pytest.raises(ValueError, match="metric"):
        keep_group([True], [1.0], "std")


def test_another_gen_batch_follows_verls_count():
    from r3_rllib.core.reward_shaping import another_gen_batch, shortfall_message

    # verl's DAPO trainer: the first batch counts; another while fewer than max were drawn; <= 0: no limit.
    assert [another_gen_batch(n, 3) for n in (1, 2, 3, 4)] == [True, True, False, False]
    assert not another_gen_batch(1, 1)
    assert all(another_gen_batch(n, limit) for n in (1, 10, 1000) for limit in (0, -1))
    message = shortfall_message(kept=3, needed=4, gen_batches=3, max_num_gen_batches=3)
    assert message.startswith("dynamic sampling kept 3 of the 4 groups an iteration needs")
    assert "after 3 generation batches (max_num_gen_batches=3)" in message
