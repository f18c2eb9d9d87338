"""R^2PO's rarity reward and stage-B skip rule on hand-computed groups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from r3_rllib.core.advantages import ADVANTAGE_FNS, compute_advantages_by_group, compute_group_advantages
from r3_rllib.core.rarity import DEFAULT_SKIP_RANGE, rarity_rewards, reward_frequencies, skip_flat_group


def test_frequencies_count_equal_values():
    assert reward_frequencies([2.25, 0.25, 0.25, -2.0, -2.0, -2.0]).tolist() == [1, 2, 2, 3, 3, 3]
    assert reward_frequencies([7.0]).tolist() == [1]


def test_one_right_three_wrong():
    # counts [1, 3, 3, 3] -> rarity [1, 1/3, 1/3, 1/3], mean 1/2, deviations [1/2, -1/6 x3],
    # population variance (1/4 + 3/36) / 4 = 1/12, std 1/(2 sqrt 3) -> z = [sqrt 3, -1/sqrt 3 x3].
    z = rarity_rewards([1.0, 0.0, 0.0, 0.0], eps=0.0)
    np.testing.assert_allclose(
        z, [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], rtol=1e-12
    )
    # sample std (the reference code's): variance (1/4 + 3/36) / 3 = 1/9, std 1/3 -> z = [3/2, -1/2 x3].
    np.testing.assert_allclose(rarity_rewards([1.0, 0.0, 0.0, 0.0], eps=0.0, ddof=1), [1.5, -0.5, -0.5, -0.5])
    # the reference's eps: 0.5 / (1/3 + 1e-6)
    assert rarity_rewards([1.0, 0.0, 0.0, 0.0], ddof=1)[0] == pytest.approx(0.5 / (1 / 3 + 1e-6), rel=1e-12)


def test_three_reward_values():
    # counts [1, 2, 2, 3, 3, 3] -> rarity [1, 1/2, 1/2, 1/3 x3], mean 1/2, deviations [1/2, 0, 0, -1/6 x3],
    # variance (1/4 + 3/36) / 6 = 1/18, std sqrt(2)/6 -> z = [3/sqrt 2, 0, 0, -1/sqrt 2 x3].
    z = rarity_rewards([2.25, 0.25, 0.25, -2.0, -2.0, -2.0], eps=0.0)
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(z, [3 * s, 0.0, 0.0, -s, -s, -s], rtol=1e-12, atol=1e-15)
    # default eps 1e-6 moves the values by a relative eps / std
    np.testing.assert_allclose(rarity_rewards([2.25, 0.25, 0.25, -2.0, -2.0, -2.0]), z, rtol=1e-5)


def test_rarest_value_gets_the_most_and_result_is_centred():
    r = np.array([0, 0, 0, 0, 0, 1, 1, 2], dtype=float)
    z = rarity_rewards(r)
    assert z[7] > z[5] > z[0]
    assert z.sum() == pytest.approx(0.0, abs=1e-12)
    perm = np.array([3, 7, 0, 5, 1, 6, 2, 4])
    np.testing.assert_allclose(rarity_rewards(r[perm]), z[perm], rtol=1e-12)


@pytest.mark.parametrize(
    "rewards",
    [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 1.0, 1.0], [5.0], [1 / 3, 1 / 3, 1 / 3]],
)
def test_equal_frequencies_give_exact_zeros(rewards):
    z = rarity_rewards(rewards)
    assert z.dtype == np.float64 and z.shape == (len(rewards),)
    assert np.array_equal(z, np.zeros(len(rewards)))


def test_decimals_merge_values_that_differ_in_the_last_bit():
    rewards = [0.1 + 0.2, 0.3, 1.0]  # 0.1 + 0.2 != 0.3 in floating point
    assert np.array_equal(rarity_rewards(rewards), np.zeros(3))
    # counts [2, 2, 1] -> rarity [1/2, 1/2, 1], mean 2/3, deviations [-1/6, -1/6, 1/3], variance 1/18, std sqrt(2)/6
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(rarity_rewards(rewards, eps=0.0, decimals=6), [-s, -s, 2 * s], rtol=1e-12)


def test_registered_as_an_advantage_estimator():
    assert ADVANTAGE_FNS["rarity"] is rarity_rewards
    np.testing.assert_array_equal(
        compute_group_advantages("rarity", [1.0, 0.0, 0.0]), rarity_rewards([1.0, 0.0, 0.0])
    )
    out = compute_advantages_by_group(
        "rarity", [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], ["a"] * 4 + ["b"] * 4
    )
    np.testing.assert_allclose(out[:4], rarity_rewards([1.0, 0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(out[4:], np.zeros(4))


@pytest.mark.parametrize(
    ("rewards", "kwargs", "match"),
    [
        ([], {}, "empty"),
        ([1.0, float("nan")], {}, "finite"),
        ([[1.0, 0.0]], {}, "1-D"),
        ([1.0, 0.0], {"eps": -1.0}, "eps"),
        ([1.0, 0.0], {"ddof": 2}, "ddof"),
        ([1.0, 0.0], {"decimals": 1.5}, "decimals"),
    ],
)
def test_bad_input_is_refused(rewards, kwargs, match):
    with pytest.raises(ValueError, match=match):
        rarity_rewards(rewards, **kwargs)


def test_skip_rule_on_the_reward_range():
    assert DEFAULT_SKIP_RANGE == 0.01
    assert skip_flat_group([1.0, 1.0, 1.0])
    assert skip_flat_group([1.0, 1.005, 1.002])  # range 0.005
    assert not skip_flat_group([0.0, 0.0, 0.5])  # range 0.5
    assert not skip_flat_group([0.0, 0.25])
    assert skip_flat_group([0.0, 0.25], min_range=0.3)
    assert not skip_flat_group([2.0, 2.0], min_range=0.0)  # 0 never skips
    with pytest.raises(ValueError, match="min_range"):
        skip_flat_group([0.0, 1.0], min_range=-0.1)
    with pytest.raises(ValueError, match="finite"):
        skip_flat_group([0.0, float("inf")])
