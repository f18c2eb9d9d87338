"""The R^3 schedule (algorithms/r3/r3_schedule.py) with hand-computed numbers, and the checks built on it."""

from __future__ import annotations

import pytest

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.r3_schedule import (
    compute_schedule,
    default_max_age,
    revisit_kept_fraction,
    schedule_for_config,
)


def _schedule(**overrides):
    settings = dict(
        dataset_size=100,
        queries_per_iteration=8,
        replay=True,
        replay_start_epoch=1,
        reflection=True,
        reflection_start_epoch=1,
        ranking=True,
        ranking_start_epoch=2,
        replay_max_age=50,
    )
    return compute_schedule(**{**settings, **overrides})


def test_iterations_per_epoch_and_first_active_iterations():
    s = _schedule()
    # 100 // 8 = 12 iterations per epoch; 100 - 96 = 4 queries sit out each epoch.
    assert (s.iterations_per_epoch, s.skipped_per_epoch) == (12, 4)
    # start epoch e -> iteration e * 12 + 1: the first batch drawn from epoch e.
    assert s.parts["replay"].first_iteration == 13
    assert s.parts["reflection"].first_iteration == 13
    assert s.parts["ranking"].first_iteration == 25
    assert [s.epoch_trained_in(j) for j in (1, 12, 13, 24, 25)] == [0, 0, 1, 1, 2]
    # The logged rollout/dataset_epoch counts completed epochs after the iteration's rollout.
    assert [s.reported_epoch(j) for j in (11, 12, 13)] == [0, 1, 1]
    assert (s.revisit_mean, s.revisit_max) == (12, 23)
    assert s.revisit_kept_fraction == 1.0 and not s.warnings and not s.errors


def test_parts_off_or_from_epoch_zero():
    s = _schedule(replay=False, ranking_start_epoch=0)
    assert s.parts["replay"].first_iteration is None and not s.parts["replay"].enabled
    assert s.parts["ranking"].first_iteration == 1


def test_start_epoch_past_the_stop_warns():
    s = _schedule(stop_iteration=20)
    assert len(s.warnings) == 1
    assert "ranking never switches on" in s.warnings[0] and "iteration 25" in s.warnings[0]
    assert "after the stop at iteration 20" in s.warnings[0]
    assert not _schedule(stop_iteration=25).warnings  # iteration 25 runs: ranking is on in it


def test_staleness_shorter_than_the_revisit_interval():
    # T = 12, staleness 12: a revisit lag 12 + d is kept for d <= 0: (12 + 11 + ... + 1) / 144 = 78 / 144.
    assert revisit_kept_fraction(12, 12) == pytest.approx(78 / 144)
    assert revisit_kept_fraction(12, 23) == 1.0 and revisit_kept_fraction(12, 22) == pytest.approx(143 / 144)
    # With overlap_generation samples are one update older: lag 13 + d <= 12 needs d <= -1: 66 / 144.
    assert revisit_kept_fraction(12, 12, extra_lag=1) == pytest.approx(66 / 144)
    s = _schedule(replay_max_age=12)
    assert s.revisit_kept_fraction == pytest.approx(78 / 144)
    assert (
        len(s.warnings) == 1 and "only 54.2% of revisits" in s.warnings[0] and "(23 updates" in s.warnings[0]
    )
    assert not s.errors


def test_the_shipped_paper_config_numbers():
    """DeepScaleR-40k (40,315 rows), 128 queries per iteration, R^3 from epoch 1, stop at 1040."""
    s = _schedule(dataset_size=40_315, queries_per_iteration=128, ranking_start_epoch=1, stop_iteration=1040)
    assert (s.iterations_per_epoch, s.skipped_per_epoch) == (314, 123)  # 40,315 = 314 * 128 + 123
    assert {p.first_iteration for p in s.parts.values()} == {315}
    assert default_max_age(40_315, 128) == 628
    # The former replay_max_age of 50: lags 314 + d <= 50 need d <= -264: (1 + ... + 50) / 314**2.
    assert s.revisit_kept_fraction == pytest.approx(1275 / 314**2)
    assert "only 1.3% of revisits" in s.warnings[0]


def test_errors_and_bad_input():
    assert any("dynamic_sampling" in e for e in _schedule(dynamic_sampling=True).errors)
    ranking_only = _schedule(replay=False, reflection=False, dynamic_sampling=True)
    assert not ranking_only.errors and "epochs end earlier" in ranking_only.warnings[0]
    assert any("can never use a past sample" in e for e in _schedule(replay_max_age=0).errors)
    with pytest.raises(ValueError, match="smaller than one iteration's 8 queries"):
        _schedule(dataset_size=7)
    with pytest.raises(ValueError, match="stop_iteration must be >= 1"):
        _schedule(stop_iteration=0)
    with pytest.raises(ValueError, match="ranking_start_epoch must be >= 0"):
        _schedule(ranking_start_epoch=-1)


def test_schedule_for_config_derives_the_staleness():
    config = R3Config.r3_preset().training(queries_per_iteration=8)
    assert config.replay_max_age is None
    s = schedule_for_config(config, 100, stop_iteration=30)
    assert s.max_age == 24 and s.revisit_kept_fraction == 1.0  # 2 epochs of 12 updates
    config.r3(replay_max_age=10)
    assert schedule_for_config(config, 100).max_age == 10


def test_validate_rejects_replay_with_dynamic_sampling_and_bad_staleness():
    with pytest.raises(ValueError, match="replay with dynamic_sampling"):
        R3Config.r3_preset().training(dynamic_sampling=True).validate()
    R3Config.dapo_preset().validate()  # dynamic sampling without replay is fine
    with pytest.raises(ValueError, match="replay_max_age must be >= 1 or None"):
        R3Config.r3_preset().r3(replay_max_age=0).validate()
    with pytest.raises(ValueError, match="reflection_start_epoch must be >= 0"):
        R3Config.r3_preset().r3(reflection_start_epoch=-1).validate()


def test_late_start_warnings_name_the_iteration_when_no_stop_is_known():
    """A run with no stop: 1,000 queries / 32 per iteration puts replay at iteration 32."""
    from r3_rllib.algorithms.r3.r3_schedule import late_start_warnings

    def schedule(stop, start=1):
        return compute_schedule(
            dataset_size=1000,
            queries_per_iteration=32,
            replay=True,
            replay_start_epoch=start,
            reflection=False,
            reflection_start_epoch=0,
            ranking=True,
            ranking_start_epoch=0,
            replay_max_age=None,
            stop_iteration=stop,
        )

    (warning,) = late_start_warnings(schedule(None))
    assert warning.startswith("replay switches on only at iteration 32 (replay_start_epoch=1;")
    assert late_start_warnings(schedule(None, start=0)) == []
    assert late_start_warnings(schedule(20)) == []  # a known stop: compute_schedule's own warning says it
    assert late_start_warnings(None) == []
