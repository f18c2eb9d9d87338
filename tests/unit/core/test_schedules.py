"""RLlib's ``[[timestep, value], ...]`` schedules (core/schedules.py): hand-computed values."""

from __future__ import annotations

import pytest

from r3_rllib.core.schedules import schedule_error, scheduled_value

SCHEDULE = [[0, 1e-6], [100, 1e-6], [300, 0.0]]


@pytest.mark.parametrize(
    ("timestep", "value"),
    [
        (0, 1e-6),
        (50, 1e-6),  # the hold
        (100, 1e-6),
        (150, 0.75e-6),  # a quarter of the way from 1e-6 to 0
        (200, 0.5e-6),
        (300, 0.0),
        (10_000, 0.0),  # after the last point: its value
    ],
)
def test_values_interpolate_linearly_and_hold_past_the_last_point(timestep, value):
    assert scheduled_value(SCHEDULE, timestep) == pytest.approx(value, rel=1e-12, abs=1e-21)


def test_a_fixed_value_is_itself_at_every_timestep():
    assert scheduled_value(3e-4, 0) == 3e-4 and scheduled_value(3e-4, 1e9) == 3e-4


def test_a_warmup_rises_from_zero():
    warmup = [(0, 0.0), (10, 1e-5)]  # tuples too, as RLlib's docs write them
    assert [scheduled_value(warmup, t) for t in (0, 5, 10, 20)] == pytest.approx([0.0, 5e-6, 1e-5, 1e-5])


def test_usable_schedules_and_fixed_values_have_no_error():
    assert schedule_error("lr", SCHEDULE) is None
    assert schedule_error("lr", [(0, 0.0), (10, 1e-5), (10, 1e-5)]) is None
    assert schedule_error("lr", 1e-5) is None


@pytest.mark.parametrize(
    ("schedule", "says"),
    [
        ([[0, 1e-5]], "at least two"),
        ([[0, 1e-5], [10]], "pairs of finite numbers"),
        ([[0, 1e-5], [10, True]], "pairs of finite numbers"),
        ([[0, 1e-5], [float("inf"), 0.0]], "pairs of finite numbers"),
        ([[1, 1e-5], [10, 0.0]], "start at timestep 0"),
        ([[0, 1e-5], [10, 0.0], [9, 0.0]], "nondecreasing"),
        ([[0, 1e-5], [10, -1.0]], ">= 0"),
        (["ab", "cd"], "pairs of finite numbers"),
    ],
)
def test_malformed_schedules_name_what_is_wrong(schedule, says):
    error = schedule_error("lr", schedule)
    assert error is not None and says in error and error.startswith("lr ")
