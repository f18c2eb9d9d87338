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


def test_lr_factor_by_hand():
    """verl's warm-up (update k of W at k / W, the first at 0) then 'constant' 1, 'cosine' m + (1 - m)(1 + cos(pi
    p)) / 2, 'linear' m + (1 - m)(1 - p), p the share of the updates between the warm-up and the horizon; held at m
    past the horizon."""
    import math

    from r3_rllib.core.schedules import lr_factor

    constant = [lr_factor(u, warmup=4) for u in range(6)]
    assert constant == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    cosine = [
        lr_factor(u, scheduler_type="cosine", warmup=2, total_updates=6, min_lr_ratio=0.1) for u in range(10)
    ]
    expected = [0.0, 0.5, 1.0, 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2, 0.55]
    expected += [0.1 + 0.9 * (1 + math.cos(3 * math.pi / 4)) / 2, 0.1, 0.1, 0.1, 0.1]
    assert cosine == pytest.approx(expected, rel=1e-12)
    linear = [lr_factor(u, scheduler_type="linear", total_updates=4) for u in range(6)]
    assert linear == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0], abs=1e-15)
    with pytest.raises(ValueError, match="needs the run's number of updates"):
        lr_factor(0, scheduler_type="cosine")
    with pytest.raises(ValueError, match="scheduler_type must be one of"):
        lr_factor(0, scheduler_type="cosine_with_restarts")


def test_the_warmup_length_is_the_steps_or_verls_ratio_of_the_total():
    from r3_rllib.core.schedules import warmup_updates

    assert warmup_updates(5, 0.5, 100) == 5  # the steps win, as verl's lr_warmup_steps >= 0
    assert warmup_updates(None, 0.1, 100) == 10 and warmup_updates(None, 0.15, 10) == 1  # int(), verl's
    assert warmup_updates(None, 0.0, None) == 0 and warmup_updates(0, 0.3, 10) == 0


def test_the_lr_shape_is_refused_where_it_is_incomplete_or_doubled():
    from r3_rllib import R3Config

    def error(**training) -> str:
        with pytest.raises(ValueError) as info:
            R3Config().training(**training).validate()
        return str(info.value)

    assert "lr_scheduler_type 'cosine' needs lr_total_steps" in error(lr_scheduler_type="cosine")
    assert "lr_warmup_steps_ratio needs lr_total_steps" in error(lr_warmup_steps_ratio=0.1)
    assert "longer than lr_total_steps=5" in error(
        lr_scheduler_type="linear", lr_total_steps=5, lr_warmup_steps=6
    )
    assert "shapes it again" in error(lr=SCHEDULE, lr_warmup_steps=2)
    assert "min_lr_ratio=0.1 only applies with the learning rate's decay" in error(min_lr_ratio=0.1)
    assert "lr_total_steps=10 is read by" in error(lr_total_steps=10)
    assert "both set the warm-up" in error(lr_warmup_steps=2, lr_warmup_steps_ratio=0.1, lr_total_steps=10)
    R3Config().training(lr=SCHEDULE).validate()
    R3Config().training(lr_scheduler_type="cosine", lr_total_steps=10, lr_warmup_steps_ratio=0.1).validate()


def test_r3_train_ends_the_decay_at_the_run_files_stop(tmp_path):
    """A run file's decay without lr_total_steps ends at stop.training_iteration (verl's total_training_steps);
    one given is kept, and a constant rate is left without one."""
    from r3_rllib.train_config import load_run_file

    def total(training: str) -> int | None:
        path = tmp_path / "run.yaml"
        path.write_text(f"preset: grpo\ntraining: {{{training}}}\nstop: {{training_iteration: 40}}\n")
        return load_run_file(path).config.lr_total_steps

    assert total("lr_scheduler_type: cosine") == 40
    assert total("lr_scheduler_type: linear, lr_total_steps: 100") == 100
    assert total("lr_warmup_steps_ratio: 0.1") == 40
    assert total("lr_warmup_steps: 3") is None
    # R^2PO: the base's updates in 40 iterations of 1 head + 3 base iterations.
    r2po = "lr_scheduler_type: cosine, rollout_head: true, rollout_head_head_iters: 1, rollout_head_base_iters: 3"
    assert total(r2po) == 30


def test_shaped_lr_reads_the_settings_and_counts_the_policys_updates():
    """A config's shape applied to a rate (the driver's call); PPO's critic warm-up leaves its first N - 1
    iterations out of the count (verl's actor scheduler starts with the actor)."""
    from r3_rllib import R3Config
    from r3_rllib.core.schedules import policy_updates, shaped_lr

    cfg = R3Config().training(
        lr_scheduler_type="linear", lr_warmup_steps=1, lr_total_steps=3, min_lr_ratio=0.5
    )
    assert [shaped_lr(2e-3, u, cfg) for u in range(5)] == pytest.approx(
        [0.0, 2e-3, 1.5e-3, 1e-3, 1e-3], rel=1e-12
    )
    assert [policy_updates(i, 0) for i in range(3)] == [0, 1, 2] == [policy_updates(i, 1) for i in range(3)]
    assert [policy_updates(i, 3) for i in range(5)] == [0, 0, 0, 1, 2]
