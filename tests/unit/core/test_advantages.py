import numpy as np
import pytest

from r3_rllib.core.advantages import (
    ADVANTAGE_FNS,
    compute_advantages_by_group,
    compute_group_advantages,
    drgrpo_advantages,
    expand_to_tokens,
    group_is_degenerate,
    grpo_advantages,
    mixed_group_advantages,
    register_advantage,
)


def test_mixed_hand_computed():
    # rewards [1, 0, 0, 1]: mean 0.5, population std 0.5 -> denom 2*0.5 + 0.5 = 1.5
    a = mixed_group_advantages([1.0, 0.0, 0.0, 1.0], alpha=2.0, lam=0.5)
    np.testing.assert_allclose(a, [0.5 / 1.5, -0.5 / 1.5, -0.5 / 1.5, 0.5 / 1.5])


def test_mixed_uses_population_std():
    # [0, 0, 3]: mean 1, population std sqrt(2) (sample std would be sqrt(3))
    a = mixed_group_advantages([0.0, 0.0, 3.0], alpha=1.0, lam=0.0)
    np.testing.assert_allclose(a, np.array([-1.0, -1.0, 2.0]) / np.sqrt(2.0))


def test_mixed_degenerate_group_is_zero():
    np.testing.assert_array_equal(
        mixed_group_advantages([1.0, 1.0, 1.0], alpha=1.0, lam=0.0), [0.0, 0.0, 0.0]
    )
    np.testing.assert_array_equal(mixed_group_advantages([0.3, 0.3], alpha=1.0, lam=0.1), [0.0, 0.0])


def test_mixed_bad_params():
    with pytest.raises(ValueError, match="alpha"):
        mixed_group_advantages([1.0, 0.0], alpha=-1.0, lam=0.1)
    with pytest.raises(ValueError, match="lam"):
        mixed_group_advantages([1.0, 0.0], alpha=1.0, lam=float("nan"))
    with pytest.raises(ValueError, match="both be 0"):
        mixed_group_advantages([1.0, 0.0], alpha=0.0, lam=0.0)


def test_grpo_equals_mixed_alpha1_lam_eps():
    r = np.array([0.0, 1.0, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(grpo_advantages(r, eps=1e-4), mixed_group_advantages(r, alpha=1.0, lam=1e-4))


def test_grpo_hand_computed_and_ddof1():
    # [1, 0]: mean 0.5; population std 0.5; sample std sqrt(0.5)
    np.testing.assert_allclose(grpo_advantages([1.0, 0.0], eps=0.0), [1.0, -1.0])
    np.testing.assert_allclose(
        grpo_advantages([1.0, 0.0], eps=0.0, ddof=1), [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5)]
    )
    np.testing.assert_array_equal(grpo_advantages([1.0], ddof=1), [0.0])
    with pytest.raises(ValueError, match="ddof"):
        grpo_advantages([1.0, 0.0], ddof=2)


def test_drgrpo():
    np.testing.assert_allclose(drgrpo_advantages([1.0, 0.0, 0.0, 0.0]), [0.75, -0.25, -0.25, -0.25])


@pytest.mark.parametrize("bad, msg", [([], "empty"), ([1.0, float("nan")], "index 1"), ([[1.0]], "1-D")])
def test_invalid_groups(bad, msg):
    with pytest.raises(ValueError, match=msg):
        grpo_advantages(bad)


def test_degenerate():
    assert group_is_degenerate([1.0, 1.0, 1.0])
    assert not group_is_degenerate([1.0, 1.0, 0.0])
    assert group_is_degenerate([1.0, 1.05], atol=0.1)
    assert group_is_degenerate([0.7])


def test_registry_and_dispatch():
    assert {"grpo", "drgrpo", "mixed"} <= set(ADVANTAGE_FNS)
    np.testing.assert_allclose(compute_group_advantages("mixed", [1.0, 0.0], alpha=1.0, lam=0.0), [1.0, -1.0])
    with pytest.raises(KeyError, match="unknown advantage estimator 'nope'"):
        compute_group_advantages("nope", [1.0])
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda r: r)

    @register_advantage("test_sign")
    def sign_adv(rewards):
        return np.sign(np.asarray(rewards) - np.mean(rewards))

    try:
        np.testing.assert_array_equal(compute_group_advantages("test_sign", [2.0, 0.0]), [1.0, -1.0])
    finally:
        del ADVANTAGE_FNS["test_sign"]


def test_by_group():
    r = [1.0, 0.0, 5.0, 5.0, 0.0]
    g = ["a", "a", "b", "b", "a"]
    # group a = [1, 0, 0] -> mean 1/3 ; group b = [5, 5] -> zeros
    np.testing.assert_allclose(compute_advantages_by_group("drgrpo", r, g), [2 / 3, -1 / 3, 0.0, 0.0, -1 / 3])
    with pytest.raises(ValueError, match="group_ids has 1 entries"):
        compute_advantages_by_group("drgrpo", r, ["a"])
    with pytest.raises(ValueError, match="group 'b'"):
        compute_advantages_by_group("drgrpo", [1.0, float("nan")], ["a", "b"])


def test_expand_to_tokens():
    out = expand_to_tokens([2.0, -1.0], np.array([[1, 1, 0], [1, 0, 0]]))
    np.testing.assert_array_equal(out, [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="advantages"):
        expand_to_tokens([1.0], np.ones((2, 3)))
