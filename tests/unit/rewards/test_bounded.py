"""Reward code the package does not own gets a time limit: past it, a graded failure with a reason, not a hang."""

from __future__ import annotations

import threading

import pytest

from r3_rllib.rewards.bounded import DEFAULT_REWARD_TIMEOUT_S, bounded_call


def test_a_call_in_time_returns_its_value():
    result = bounded_call(lambda a, b=0: a + b, 1, b=2, timeout_s=5)
    assert result.ok and result.value == 3 and result.reason == "ok"


def test_a_hanging_call_is_graded_as_a_timeout(caplog):
    release = threading.Event()

    def hang():
        release.wait()  # a scorer that never returns on its own
        return 1.0

    try:
        result = bounded_call(hang, timeout_s=0.05)
    finally:
        release.set()
    assert not result.ok and result.value is None and result.reason == "timeout"
    assert "hang did not return within 0.1 s" in caplog.text


def test_an_exception_is_the_callables_own():
    def broken():
        raise KeyError("entry")

    with pytest.raises(KeyError, match="entry"):
        bounded_call(broken, timeout_s=5)


def test_the_default_is_finite_and_the_timeout_must_be_positive():
    assert 0 < DEFAULT_REWARD_TIMEOUT_S < 1800  # below the rollout timeout: a hung scorer costs one sample
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        bounded_call(print, timeout_s=0)
