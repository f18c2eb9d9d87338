import numpy as np
import pytest

from r3_rllib.core.ranking import (
    dominance_counts,
    entropy_structure,
    rank_rewards,
    structural_entropy_rewards,
)


def test_entropy_structure_hand_computed():
    h = [0.1, 0.9, 0.5, 0.3]
    assert entropy_structure(h, 0.5) == pytest.approx((0.7, 0.45))  # top 2: 0.9, 0.5
    assert entropy_structure(h, 0.0) == pytest.approx((0.9, 0.45))  # k = max(1, 0) = 1
    assert entropy_structure(h, 1.0) == pytest.approx((0.45, 0.45))
    assert entropy_structure([0.2, 0.8, 0.5], 0.5) == pytest.approx((0.8, 0.5))  # floor(1.5) = 1


def test_entropy_structure_floor_is_robust_to_float_error():
    # 0.29 * 100 == 28.999999999999996 in floating point; k must be 29
    h = np.arange(100, dtype=np.float64)
    peak, _ = entropy_structure(h, 0.29)
    assert peak == pytest.approx(np.arange(71, 100).mean())


def test_entropy_structure_empty_and_invalid():
    assert entropy_structure([], 0.3) == (0.0, 0.0)
    with pytest.raises(ValueError, match="p must be in"):
        entropy_structure([1.0], 1.5)
    with pytest.raises(ValueError, match="token 1"):
        entropy_structure([1.0, float("inf")], 0.5)
    with pytest.raises(ValueError, match="1-D"):
        entropy_structure([[1.0]], 0.5)


def test_dominance_is_strict_in_both_criteria():
    peaks = [3.0, 3.0, 2.0]
    globs = [1.0, 2.0, 1.0]
    # 0 vs 1: equal peak -> no; 0 vs 2: equal global -> no; 1 vs 2: peak higher but global higher -> no
    np.testing.assert_array_equal(dominance_counts(peaks, globs), [0, 0, 0])
    np.testing.assert_array_equal(dominance_counts([3.0, 2.0], [1.0, 2.0]), [1, 0])
    with pytest.raises(ValueError, match="equal length"):
        dominance_counts([1.0], [1.0, 2.0])


def test_strict_chain():
    # (peak, global) with p = 0 (peak = max): A (3, 1) > B (2.5, 1.5) > C (2, 1.9)
    ents = [[3.0, 0.0, 0.0], [2.5, 1.0, 1.0], [2.0, 1.8, 1.9]]
    np.testing.assert_allclose(structural_entropy_rewards(ents, p=0.0, r_max=1.0), [1.0, 0.5, 0.0])
    # order of the inputs does not matter
    np.testing.assert_allclose(structural_entropy_rewards(ents[::-1], p=0.0, r_max=2.0), [0.0, 1.0, 2.0])


def test_all_incomparable_share_the_mean():
    # higher peak always comes with higher global entropy -> nobody dominates
    ents = [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    np.testing.assert_allclose(structural_entropy_rewards(ents, p=0.5, r_max=1.0), [0.5, 0.5, 0.5])


def test_partial_order_with_ties():
    # A (3, 1) dominates B (2, 1.2) and C (2.5, 1.5); B, C incomparable; D (5, 4) incomparable with all.
    # S = [2, 0, 0, 0]; N = 4 rank rewards 1, 2/3, 1/3, 0 -> A 1, B/C/D share mean(2/3, 1/3, 0) = 1/3
    ents = [[3.0, 0.0, 0.0], [2.0, 0.4, 1.2], [2.5, 1.0, 1.0], [5.0, 3.5, 3.5]]
    np.testing.assert_allclose(structural_entropy_rewards(ents, p=0.0, r_max=1.0), [1.0, 1 / 3, 1 / 3, 1 / 3])


def test_two_ties_at_top_and_bottom():
    # A (3, 1) > C (2, 2); B (6, 4) > D (5, 5); others incomparable -> S = [1, 1, 0, 0]
    ents = [[3.0, 0.0, 0.0], [6.0, 3.0, 3.0], [2.0, 2.0, 2.0], [5.0, 5.0, 5.0]]
    np.testing.assert_allclose(
        structural_entropy_rewards(ents, p=0.0, r_max=1.0), [5 / 6, 5 / 6, 1 / 6, 1 / 6]
    )


def test_sizes_zero_and_one():
    assert structural_entropy_rewards([], p=0.2, r_max=1.0).shape == (0,)
    np.testing.assert_allclose(structural_entropy_rewards([[0.3, 0.1]], p=0.2, r_max=0.8), [0.4])


def test_empty_response_is_incomparable():
    np.testing.assert_allclose(structural_entropy_rewards([[], [1.0, 1.0]], p=0.5, r_max=1.0), [0.5, 0.5])


def test_mean_reward_is_half_r_max_for_every_n():
    rng = np.random.default_rng(0)
    for n in range(1, 12):
        ents = [rng.random(int(rng.integers(1, 20))) for _ in range(n)]
        r = structural_entropy_rewards(ents, p=0.3, r_max=0.6)
        assert r.mean() == pytest.approx(0.3)
        assert (r >= 0).all() and (r <= 0.6 + 1e-12).all()


def test_rank_rewards_direct():
    np.testing.assert_allclose(rank_rewards([5, 1, 5, 0], 1.0), [5 / 6, 1 / 3, 5 / 6, 0.0])


def test_validation():
    with pytest.raises(ValueError, match="r_max"):
        structural_entropy_rewards([[1.0]], p=0.5, r_max=-1.0)
    with pytest.raises(ValueError, match="p must be in"):
        structural_entropy_rewards([[1.0]], p=-0.1, r_max=1.0)
    with pytest.raises(ValueError, match="response 1: entropies: token 0"):
        structural_entropy_rewards([[1.0], [float("nan")]], p=0.5, r_max=1.0)
