"""R^2PO's rarity reward and stage-B skip rule on hand-computed groups."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
from numeric import f64_tol

from r3_rllib.core.advantages import ADVANTAGE_FNS, compute_advantages_by_group, compute_group_advantages
from r3_rllib.r2po.rarity import (
    DEFAULT_SKIP_RANGE,
    RARITY_COUNTS,
    outcome_frequencies,
    rarity_rewards,
    reward_frequencies,
    skip_flat_group,
)

#: The reference code's rule: count exact reward values (the tests below that are about that rule use it).
by_value = partial(rarity_rewards, count="reward")
#: Rarity rewards are float64 numpy on both sides (by hand with math.sqrt): a few divisions, means and square roots
#: give a few float64 ulps; 2**12 ulps relative (~9e-13) leave room and still see a wrong term.
F64_REL = f64_tol(1.0, ulps=2**12)


def test_frequencies_count_equal_values():
    assert reward_frequencies([2.25, 0.25, 0.25, -2.0, -2.0, -2.0]).tolist() == [1, 2, 2, 3, 3, 3]
    assert reward_frequencies([7.0]).tolist() == [1]


def test_one_right_three_wrong():
    # counts [1, 3, 3, 3] -> rarity [1, 1/3, 1/3, 1/3], mean 1/2, deviations [1/2, -1/6 x3],
    # population variance (1/4 + 3/36) / 4 = 1/12, std 1/(2 sqrt 3) -> z = [sqrt 3, -1/sqrt 3 x3].
    z = by_value([1.0, 0.0, 0.0, 0.0], eps=0.0)
    np.testing.assert_allclose(
        z, [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], rtol=F64_REL
    )
    # sample std (the reference code's): variance (1/4 + 3/36) / 3 = 1/9, std 1/3 -> z = [3/2, -1/2 x3].
    np.testing.assert_allclose(by_value([1.0, 0.0, 0.0, 0.0], eps=0.0, ddof=1), [1.5, -0.5, -0.5, -0.5])
    # the reference's eps: 0.5 / (1/3 + 1e-6)
    assert by_value([1.0, 0.0, 0.0, 0.0], ddof=1)[0] == pytest.approx(0.5 / (1 / 3 + 1e-6), rel=F64_REL)


def test_three_reward_values():
    # counts [1, 2, 2, 3, 3, 3] -> rarity [1, 1/2, 1/2, 1/3 x3], mean 1/2, deviations [1/2, 0, 0, -1/6 x3],
    # variance (1/4 + 3/36) / 6 = 1/18, std sqrt(2)/6 -> z = [3/sqrt 2, 0, 0, -1/sqrt 2 x3].
    z = by_value([2.25, 0.25, 0.25, -2.0, -2.0, -2.0], eps=0.0)
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(z, [3 * s, 0.0, 0.0, -s, -s, -s], rtol=F64_REL, atol=f64_tol(1.0, ulps=16))
    # default eps 1e-6 moves the values by a relative eps / std
    eps_shift = 1e-6 / (math.sqrt(2) / 6)  # eps / std, std sqrt(2) / 6
    np.testing.assert_allclose(by_value([2.25, 0.25, 0.25, -2.0, -2.0, -2.0]), z, rtol=eps_shift + F64_REL)


def test_rarest_value_gets_the_most_and_result_is_centred():
    r = np.array([0, 0, 0, 0, 0, 1, 1, 2], dtype=float)
    z = by_value(r)
    assert z[7] > z[5] > z[0]
    assert z.sum() == pytest.approx(0.0, abs=f64_tol(np.abs(z).sum(), ulps=16))  # 8 terms: ulps of their sum
    perm = np.array([3, 7, 0, 5, 1, 6, 2, 4])
    np.testing.assert_allclose(by_value(r[perm]), z[perm], rtol=F64_REL)


@pytest.mark.parametrize(
    "rewards",
    [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 1.0, 1.0], [5.0], [1 / 3, 1 / 3, 1 / 3]],
)
def test_equal_frequencies_give_exact_zeros(rewards):
    z = by_value(rewards)
    assert z.dtype == np.float64 and z.shape == (len(rewards),)
    assert np.array_equal(z, np.zeros(len(rewards)))


def test_decimals_merge_values_that_differ_in_the_last_bit():
    rewards = [0.1 + 0.2, 0.3, 1.0]  # 0.1 + 0.2 != 0.3 in floating point
    assert np.array_equal(by_value(rewards), np.zeros(3))
    # counts [2, 2, 1] -> rarity [1/2, 1/2, 1], mean 2/3, deviations [-1/6, -1/6, 1/3], variance 1/18, std sqrt(2)/6
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(by_value(rewards, eps=0.0, decimals=6), [-s, -s, 2 * s], rtol=F64_REL)


def test_registered_as_an_advantage_estimator():
    assert ADVANTAGE_FNS["rarity"] is rarity_rewards
    np.testing.assert_array_equal(
        compute_group_advantages("rarity", [1.0, 0.0, 0.0], count="reward"), by_value([1.0, 0.0, 0.0])
    )
    out = compute_advantages_by_group(
        "rarity", [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], ["a"] * 4 + ["b"] * 4, count="reward"
    )
    np.testing.assert_allclose(out[:4], by_value([1.0, 0.0, 0.0, 0.0]))
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
        by_value(rewards, **kwargs)


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


def test_outcomes_not_reward_values_with_a_length_bonus():
    """6 correct answers with distinct rewards 1 + bonus, 2 wrong with reward 0 (the math env with its length bonus)."""
    rewards = [1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 0.0, 0.0]
    correct = [True] * 6 + [False] * 2
    # By outcome: counts [6 x6, 2 x2] -> rarity [1/6 x6, 1/2 x2], mean (1 + 1) / 8 = 1/4, deviations [-1/12 x6,
    # 1/4 x2], population variance (6/144 + 2/16) / 8 = 1/48, std 1/sqrt(48) -> correct -sqrt(48)/12 = -1/sqrt(3)
    # (the common outcome, pushed down), wrong sqrt(48)/4 = sqrt(3) (the rare outcome, pushed up).
    z = rarity_rewards(rewards, outcomes=correct, eps=0.0)
    np.testing.assert_allclose(z, [-1 / math.sqrt(3)] * 6 + [math.sqrt(3)] * 2, rtol=F64_REL)
    assert outcome_frequencies(correct).tolist() == [6] * 6 + [2] * 2
    # By value (count="reward"): every correct reward is its own value: counts [1 x6, 2 x2] -> rarity [1 x6, 1/2 x2],
    # mean 7/8, deviations [1/8 x6, -3/8 x2], variance (6 + 18) / 64 / 8 = 3/64, std sqrt(3)/8 -> correct
    # +1/sqrt(3), wrong -sqrt(3): the sign flips.
    np.testing.assert_allclose(
        by_value(rewards, eps=0.0), [1 / math.sqrt(3)] * 6 + [-math.sqrt(3)] * 2, rtol=F64_REL
    )
    # the outcome count ignores the reward values altogether
    np.testing.assert_array_equal(
        rarity_rewards([0.0] * 8, outcomes=correct), rarity_rewards(rewards, outcomes=correct)
    )
    assert RARITY_COUNTS == ("outcome", "reward")


def test_outcome_count_needs_the_outcomes():
    with pytest.raises(ValueError, match="needs each sample's discrete outcome"):
        rarity_rewards([1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="outcomes has 2 entries but there are 3 rewards"):
        rarity_rewards([1.0, 0.0, 0.0], outcomes=[True, False])
    with pytest.raises(ValueError, match="rarity count must be one of"):
        rarity_rewards([1.0, 0.0, 0.0], count="values")
