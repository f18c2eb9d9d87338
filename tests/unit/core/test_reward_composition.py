"""The composed reward (core/reward_composition.py), by hand-computed numbers."""

import math

import pytest

from r3_rllib.core.reward_composition import Term, compose_reward, term_value


def test_weighted_sum_of_env_reward_and_terms():
    terms = [Term("judge", weight=0.5), Term("length", weight=-0.25)]
    # 2 * 1.0 + 0.5 * 0.8 - 0.25 * 0.4 = 2.0 + 0.4 - 0.1 = 2.3
    assert compose_reward(1.0, terms, [0.8, 0.4], env_reward_weight=2.0) == pytest.approx(2.3)
    # env weight 0: the terms alone; 0.5 * 0.8 - 0.25 * 0.4 = 0.3
    assert compose_reward(1.0, terms, [0.8, 0.4], env_reward_weight=0.0) == pytest.approx(0.3)
    assert compose_reward(0.7, [], []) == pytest.approx(0.7)


def test_a_gate_below_its_threshold_gives_its_reward_whatever_the_others_say():
    terms = [Term("format", gate=True, gate_threshold=0.5, gate_reward=-1.0), Term("judge", weight=1.0)]
    assert compose_reward(1.0, terms, [0.4, 0.9]) == -1.0
    # At or above the threshold the gate adds nothing: 1.0 + 0.9 = 1.9
    assert compose_reward(1.0, terms, [0.5, 0.9]) == pytest.approx(1.9)
    assert compose_reward(1.0, terms, [1.0, 0.9]) == pytest.approx(1.9)


def test_the_first_failing_gate_decides():
    terms = [
        Term("a", gate=True, gate_threshold=0.5, gate_reward=-1.0),
        Term("b", gate=True, gate_threshold=0.5, gate_reward=-2.0),
    ]
    assert compose_reward(1.0, terms, [0.0, 0.0]) == -1.0
    assert compose_reward(1.0, terms, [1.0, 0.0]) == -2.0
    assert compose_reward(1.0, terms, [1.0, 1.0]) == 1.0


def test_a_failed_term_scores_zero():
    assert term_value(0.9, "timeout") == 0.0
    assert term_value(math.nan, None) == 0.0
    assert term_value(0.9, None) == 0.9
    terms = [Term("judge", weight=0.5), Term("format", gate=True, gate_threshold=0.5, gate_reward=0.0)]
    # judge failed (0), gate passed: 1.0 + 0.5 * 0 = 1.0
    assert compose_reward(1.0, terms, [term_value(0.8, "judge_error"), 1.0]) == 1.0
    # the gate failed (0 < 0.5): its reward
    assert compose_reward(1.0, terms, [0.8, term_value(1.0, "timeout")]) == 0.0


def test_scores_must_match_terms():
    with pytest.raises(ValueError, match="2 scores for 1 reward terms"):
        compose_reward(1.0, [Term("a")], [0.1, 0.2])
