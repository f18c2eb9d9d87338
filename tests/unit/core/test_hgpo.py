"""HGPO estimator on hand-computed examples (r3_rllib/core/hgpo.py)."""

import numpy as np
import pytest
from numeric import f64_tol

from r3_rllib.core.advantages import grpo_advantages
from r3_rllib.core.hgpo import (
    HGPO_SETTINGS,
    discounted_returns,
    hgpo_advantages,
    hgpo_advantages_by_query,
    hgpo_group_stats,
    hgpo_levels,
    hgpo_settings,
)

# Four trajectories of one query (obs keys per step, returns per step):
#   A: s p q   returns .81 .9 1     (reaches the goal)
#   B: s r q   returns .81 .9 1     (another route to the same q)
#   C: s q     returns 0 0          (q at step 1, truncated)
#   D: s p p   returns 0 0 0        (stuck at p: p twice in one trajectory)
# Level 1 (current obs):  s {A0 .81, B0 .81, C0 0, D0 0} mean .405;  p {A1 .9, D1 0, D2 0} mean .3;
#                         q {A2 1, B2 1, C1 0} mean 2/3;  r {B1} alone.
# Level 2 (last 2 obs):   (s,p) {A1 .9, D1 0} mean .45; every other window is alone.
# Level 0 (base), base_stats "trajectories": first-step returns A .81, B .81, C 0, D 0 (mean .405, pop. std .405).
# Level 0, base_stats "step_rows" (REWARDS, gamma .9 gives RET): every row carries its episode's undiscounted
#   reward, A 1 x3 rows, B 1 x3, C 0 x2, D 0 x3: 11 rows, mean 6/11, so 5/11 and -6/11 after the mean; sample
#   variance (6 * 25 + 5 * 36) / 121 / 10 = 3/11.
TRAJ = ["A"] * 3 + ["B"] * 3 + ["C"] * 2 + ["D"] * 3
STEP = [0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2]
KEYS = ["s", "p", "q", "s", "r", "q", "s", "q", "s", "p", "p"]
RET = [0.81, 0.9, 1.0, 0.81, 0.9, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
REWARDS = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
IDX = {name: i for i, name in enumerate(["A0", "A1", "A2", "B0", "B1", "B2", "C0", "C1", "D0", "D1", "D2"])}


def _adv(**kw):
    args = dict(obs_keys=KEYS, traj_ids=TRAJ, step_indices=STEP, step_returns=RET)
    args.update(kw)
    return hgpo_advantages(**args)


def test_levels_table_groups_of_one_are_nan():
    t = hgpo_levels(
        obs_keys=KEYS, traj_ids=TRAJ, step_indices=STEP, step_returns=RET, history_length=1, mode="mean_norm"
    )
    assert t.levels == (1, 2)
    # level 1
    np.testing.assert_allclose(t.advantages[[IDX["A0"], IDX["C0"]], 0], [0.405, -0.405])
    np.testing.assert_allclose(t.advantages[[IDX["A1"], IDX["D1"], IDX["D2"]], 0], [0.6, -0.3, -0.3])
    np.testing.assert_allclose(t.advantages[[IDX["A2"], IDX["C1"]], 0], [1 / 3, -2 / 3])
    assert np.isnan(t.advantages[IDX["B1"], 0]) and t.sizes[IDX["B1"], 0] == 1
    # level 2: only (s, p) is shared; step 0 has no 2-observation window at all (size 0)
    np.testing.assert_allclose(t.advantages[[IDX["A1"], IDX["D1"]], 1], [0.45, -0.45])
    assert t.sizes[IDX["A0"], 1] == 0 and np.isnan(t.advantages[IDX["A0"], 1])
    assert np.isnan(t.advantages[[IDX["A2"], IDX["B2"], IDX["C1"], IDX["D2"]], 1]).all()
    assert t.sizes[IDX["A1"], 0] == 3 and t.sizes[IDX["A1"], 1] == 2
    stats = hgpo_group_stats(t)
    assert stats["level2/shared_frac"] == pytest.approx(2 / 11)
    assert stats["level1/mean_size"] == pytest.approx((4 * 4 + 3 * 3 + 3 * 3) / 10)


def test_mean_norm_weighted_by_k_plus_one():
    a = _adv(history_length=1, alpha=1.0, mode="mean_norm")
    expected = {
        "A0": 0.405,
        "B0": 0.405,
        "C0": -0.405,
        "D0": -0.405,
        "A1": (2 * 0.6 + 3 * 0.45) / 5,  # 0.51: level 1 weight 2, level 2 weight 3
        "D1": (2 * -0.3 + 3 * -0.45) / 5,  # -0.39
        "D2": -0.3,  # its (p, p) window is alone: level 1 only
        "B1": 0.0,  # alone at every level
        "A2": 1 / 3,
        "B2": 1 / 3,
        "C1": -2 / 3,
    }
    np.testing.assert_allclose(a, [expected[k] for k in IDX], atol=1e-12)


def test_alpha_changes_level_weights():
    a0 = _adv(history_length=1, alpha=0.0, mode="mean_norm")
    assert a0[IDX["A1"]] == pytest.approx((0.6 + 0.45) / 2)
    a2 = _adv(history_length=1, alpha=2.0, mode="mean_norm")
    assert a2[IDX["A1"]] == pytest.approx((4 * 0.6 + 9 * 0.45) / 13)
    # history_length 0: level 1 only, whatever alpha
    np.testing.assert_allclose(_adv(history_length=0, alpha=3.0, mode="mean_norm")[IDX["A1"]], 0.6)


def test_mean_std_norm():
    a = _adv(history_length=1, alpha=1.0, mode="mean_std_norm", eps=0.0)
    # p group [.9, 0, 0]: std sqrt(.18); (s, p) group [.9, 0]: std .45 -> +-1; q group [1, 1, 0]: std sqrt(2)/3
    sp = np.sqrt(0.18)
    assert a[IDX["A1"]] == pytest.approx((2 * 0.6 / sp + 3 * 1.0) / 5)
    assert a[IDX["D1"]] == pytest.approx((2 * -0.3 / sp + 3 * -1.0) / 5)
    assert a[IDX["D2"]] == pytest.approx(-0.3 / sp)
    assert a[IDX["A2"]] == pytest.approx(1 / np.sqrt(2))
    assert a[IDX["C1"]] == pytest.approx(-np.sqrt(2))
    assert a[IDX["A0"]] == pytest.approx(1.0)
    # eps enters the denominator
    b = _adv(history_length=0, mode="mean_std_norm", eps=0.1)
    assert b[IDX["A0"]] == pytest.approx(0.405 / (0.405 + 0.1))


def _adv_rewards(**kw):
    args = dict(obs_keys=KEYS, traj_ids=TRAJ, step_indices=STEP, step_rewards=REWARDS, gamma=0.9)
    args.update(kw)
    return hgpo_advantages(**args)


def test_base_group_step_rows_is_the_default():
    """verl-agent's episode group: undiscounted episode reward on every step row, statistics over the rows."""
    a = _adv_rewards(history_length=1, alpha=1.0, mode="mean_norm", base_group=True)
    assert a[IDX["B1"]] == pytest.approx(5 / 11)  # alone at every step level: the base group alone
    assert a[IDX["A1"]] == pytest.approx((5 / 11 + 2 * 0.6 + 3 * 0.45) / 6)
    assert a[IDX["C1"]] == pytest.approx((-6 / 11 + 2 * -2 / 3) / 3)
    # mean_std_norm: sample std sqrt(3/11) -> 5/11 / sqrt(3/11) = 5/sqrt(33), -6/sqrt(33)
    ep = _adv_rewards(step_groups=False, base_group=True, eps=0.0)
    np.testing.assert_allclose(ep, [5 / np.sqrt(33) if t in "AB" else -6 / np.sqrt(33) for t in TRAJ])
    t = hgpo_levels(
        obs_keys=KEYS,
        traj_ids=TRAJ,
        step_indices=STEP,
        step_rewards=REWARDS,
        base_group=True,
        step_groups=False,
    )
    assert t.levels == (0,) and (t.sizes[:, 0] == 11).all()
    with pytest.raises(ValueError, match="base_stats='step_rows' needs step_rewards"):
        _adv(base_group=True)


def test_base_group_trajectories_option():
    a = _adv(history_length=1, alpha=1.0, mode="mean_norm", base_group=True, base_stats="trajectories")
    assert a[IDX["A1"]] == pytest.approx((0.405 + 2 * 0.6 + 3 * 0.45) / 6)
    assert a[IDX["D1"]] == pytest.approx((-0.405 + 2 * -0.3 + 3 * -0.45) / 6)
    assert a[IDX["B1"]] == pytest.approx(0.405)  # alone everywhere but in its episode's group
    assert a[IDX["C1"]] == pytest.approx((-0.405 + 2 * -2 / 3) / 3)
    assert a[IDX["A0"]] == pytest.approx(0.405)  # base and level 1 agree
    off = _adv(history_length=1, alpha=1.0, mode="mean_norm", base_group=False)
    assert off[IDX["B1"]] == 0.0
    # population std over the 4 trajectories: .405 -> +-1
    ep = _adv(step_groups=False, base_group=True, base_stats="trajectories", eps=0.0)
    np.testing.assert_allclose(ep, [1.0 if t in "AB" else -1.0 for t in TRAJ])


def test_zero_advantages_left_out_of_weighted_sum():
    # X: s u, Y: s u, Z: t u. Level 1 u: {X1 1, Y1 .5, Z1 0}, mean .5 -> Y1 gets exactly 0 there and that level is
    # dropped for Y1; level 2 (s, u): {X1 1, Y1 .5}, mean .75.
    keys, traj, step = ["s", "u", "s", "u", "t", "u"], list("XXYYZZ"), [0, 1, 0, 1, 0, 1]
    ret = [1.0, 1.0, 0.5, 0.5, 0.0, 0.0]
    a = hgpo_advantages(
        obs_keys=keys, traj_ids=traj, step_indices=step, step_returns=ret, history_length=1, mode="mean_norm"
    )
    assert a[3] == pytest.approx(-0.25)  # not 3/5 * -0.25: the zero of level 1 does not dilute it
    assert a[1] == pytest.approx((2 * 0.5 + 3 * 0.25) / 5)
    assert a[5] == pytest.approx(-0.5)
    assert a[4] == 0.0  # t alone


def test_equal_returns_give_exact_zero():
    # 0.9 three times computed as discounted returns: no ulp residue divided by eps
    a = hgpo_advantages(
        obs_keys=["s", "s", "s"],
        traj_ids=[0, 1, 2],
        step_indices=[0, 0, 0],
        step_rewards=[0.9, 0.9, 0.9],
        eps=1e-12,
    )
    np.testing.assert_array_equal(a, [0.0, 0.0, 0.0])


def test_discounted_returns_any_order():
    # trajectory 7: rewards 0 0 1 -> .81 .9 1; trajectory 3: 1 0 2 -> 2.62 1.8 2 (gamma .9); shuffled rows
    traj = [3, 7, 7, 3, 7, 3]
    step = [2, 1, 0, 0, 2, 1]
    rew = [2.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    np.testing.assert_allclose(discounted_returns(rew, traj, step, 0.9), [2.0, 0.9, 0.81, 2.62, 1.0, 1.8])
    np.testing.assert_allclose(discounted_returns(rew, traj, step, 1.0), [2.0, 1.0, 1.0, 3.0, 1.0, 2.0])
    np.testing.assert_allclose(discounted_returns(rew, traj, step, 0.0), rew)


def test_step_rewards_equal_precomputed_returns():
    rewards = [
        0.0,
        0.0,
        1.0,
        0.0,
        0.0,
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]  # A and B reach the goal at their step 2
    got = hgpo_advantages(
        obs_keys=KEYS, traj_ids=TRAJ, step_indices=STEP, step_rewards=rewards, gamma=0.9, history_length=1
    )
    np.testing.assert_allclose(got, _adv(history_length=1))


def test_named_settings():
    # episode GRPO over trajectories: every step gets its trajectory's GRPO advantage on episode returns
    ep = _adv(**hgpo_settings("episode_grpo", mode="mean_std_norm", base_stats="trajectories"))
    traj_adv = dict(zip("ABCD", grpo_advantages([0.81, 0.81, 0.0, 0.0]), strict=True))
    np.testing.assert_allclose(ep, [traj_adv[t] for t in TRAJ])
    hg = _adv(**hgpo_settings("hgpo", mode="mean_norm", history_length=1))
    np.testing.assert_allclose(hg, _adv(history_length=1, mode="mean_norm"))
    assert set(HGPO_SETTINGS) == {"episode_grpo", "gigpo", "hgpo"}
    with pytest.raises(KeyError, match="unknown HGPO setting"):
        hgpo_settings("ppo")
    with pytest.raises(ValueError, match="unknown HGPO option"):
        hgpo_settings("hgpo", history=3)


def test_gigpo_adds_episode_and_step_advantages_one_to_one():
    """GiGPO: A = A_episode + 1 * A_step (not a weighted mean), the step group with the sample std."""
    gi = _adv_rewards(**hgpo_settings("gigpo", mode="mean_norm"))
    # episode (step rows) 5/11 or -6/11; level 1: s {.81 .81 0 0} mean .405, p {.9 0 0} mean .3, q {1 1 0} mean 2/3
    assert gi[IDX["A0"]] == pytest.approx(5 / 11 + 0.405)
    assert gi[IDX["A1"]] == pytest.approx(5 / 11 + 0.6)
    assert gi[IDX["B1"]] == pytest.approx(5 / 11)  # r alone: the step part is 0
    assert gi[IDX["D2"]] == pytest.approx(-6 / 11 - 0.3)
    assert gi[IDX["C1"]] == pytest.approx(-6 / 11 - 2 / 3)
    # mean_std_norm, eps 0: p group sample std sqrt(.54 / 2) = sqrt(.27); episode 5/sqrt(33)
    gs = _adv_rewards(**hgpo_settings("gigpo", mode="mean_std_norm", eps=0.0))
    assert gs[IDX["A1"]] == pytest.approx(5 / np.sqrt(33) + 0.6 / np.sqrt(0.27))
    assert gs[IDX["D1"]] == pytest.approx(-6 / np.sqrt(33) - 0.3 / np.sqrt(0.27))
    # alpha plays no part in a sum
    np.testing.assert_allclose(_adv_rewards(**hgpo_settings("gigpo", mode="mean_norm", alpha=3.0)), gi)
    with pytest.raises(ValueError, match="unknown HGPO combine"):
        _adv(combine="max")
    with pytest.raises(ValueError, match="unknown HGPO base_stats"):
        _adv(base_stats="rows")
    with pytest.raises(ValueError, match="step_std_ddof"):
        _adv(step_std_ddof=2)


def test_by_query_matches_separate_calls():
    other_keys, other_traj, other_step, other_ret = ["x", "x"], ["E", "F"], [0, 0], [1.0, 0.0]
    q = ["q1"] * len(KEYS) + ["q2"] * 2
    a = hgpo_advantages_by_query(
        q,
        setting="hgpo",
        obs_keys=KEYS + other_keys,
        # trajectory ids only need to be unique within a query
        traj_ids=TRAJ + other_traj,
        step_indices=STEP + other_step,
        step_returns=RET + other_ret,
        history_length=1,
        mode="mean_norm",
    )
    np.testing.assert_allclose(a[: len(KEYS)], _adv(history_length=1, mode="mean_norm"))
    np.testing.assert_allclose(a[len(KEYS) :], [0.5, -0.5])
    with pytest.raises(ValueError, match="query 'q2'"):
        hgpo_advantages_by_query(
            q,
            obs_keys=KEYS + ["x", "x"],
            traj_ids=TRAJ + ["E", "E"],
            step_indices=STEP + [0, 0],
            step_returns=RET + other_ret,
        )


def test_base_group_of_one_trajectory_is_skipped():
    a = hgpo_advantages(
        obs_keys=["s", "s"],
        traj_ids=[0, 0],
        step_indices=[0, 1],
        step_returns=[0.9, 1.0],
        base_group=True,
        base_stats="trajectories",
    )
    # one trajectory: no base comparison; s twice in it forms a level-1 group of two
    # (returns 0.9 and 1.0: centred +-0.05 over std 0.05 + eps 1e-6; float64 both sides, 2**12 ulps relative)
    z = 0.05 / (0.05 + 1e-6)
    np.testing.assert_allclose(a, [-z, z], rtol=f64_tol(1.0, ulps=2**12))


def test_bad_input_errors():
    with pytest.raises(ValueError, match="traj_ids has 2 entries"):
        hgpo_advantages(obs_keys=["a"], traj_ids=[0, 1], step_indices=[0], step_returns=[1.0])
    with pytest.raises(ValueError, match="step_returns has 1 entries"):
        hgpo_advantages(obs_keys=["a", "b"], traj_ids=[0, 1], step_indices=[0, 0], step_returns=[1.0])
    with pytest.raises(ValueError, match="step_indices has 1"):
        hgpo_advantages(obs_keys=["a", "b"], traj_ids=[0, 1], step_indices=[0], step_returns=[1.0, 0.0])
    with pytest.raises(ValueError, match="unknown HGPO mode 'z_norm'"):
        _adv(mode="z_norm")
    with pytest.raises(ValueError, match="exactly one of step_returns and step_rewards"):
        hgpo_advantages(obs_keys=KEYS, traj_ids=TRAJ, step_indices=STEP)
    with pytest.raises(ValueError, match="exactly one of"):
        _adv(step_rewards=RET)
    with pytest.raises(
        ValueError, match=r"trajectory 'A' must have step indices 0..2 once each, got \[0, 2, 2\]"
    ):
        hgpo_advantages(
            obs_keys=["a"] * 3, traj_ids=["A"] * 3, step_indices=[0, 2, 2], step_returns=[0.0] * 3
        )
    with pytest.raises(ValueError, match="step index at position 0"):
        hgpo_advantages(obs_keys=["a"], traj_ids=["A"], step_indices=[-1], step_returns=[0.0])
    with pytest.raises(TypeError, match="obs key at position 1 is not hashable"):
        hgpo_advantages(obs_keys=["a", ["b"]], traj_ids=[0, 1], step_indices=[0, 0], step_returns=[0.0, 1.0])
    with pytest.raises(ValueError, match="finite"):
        hgpo_advantages(obs_keys=["a"], traj_ids=[0], step_indices=[0], step_returns=[float("nan")])
    with pytest.raises(ValueError, match="history_length"):
        _adv(history_length=-1)
    with pytest.raises(ValueError, match="alpha"):
        _adv(alpha=-0.5)
    with pytest.raises(ValueError, match="gamma"):
        hgpo_advantages(obs_keys=["a"], traj_ids=[0], step_indices=[0], step_rewards=[1.0], gamma=1.5)
    with pytest.raises(ValueError, match="both off"):
        _adv(base_group=False, step_groups=False)
    with pytest.raises(ValueError, match="at least one step"):
        hgpo_advantages(obs_keys=[], traj_ids=[], step_indices=[], step_returns=[])


def test_registry_call_shape():
    from r3_rllib.core.hgpo import HGPO_SAMPLE_INPUTS, hgpo_group_advantages

    rewards = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    inputs = dict(zip(HGPO_SAMPLE_INPUTS, (KEYS, TRAJ, STEP), strict=True))
    got = hgpo_group_advantages(rewards, gamma=0.9, history_length=1, mode="mean_norm", **inputs)
    np.testing.assert_allclose(got, _adv(history_length=1, mode="mean_norm"))
