"""Training health checks (r3_rllib.core.health) on hand-made metric sequences: each check fires at its threshold
and not short of it, is unmeasured without its metric, and warns once per episode of its condition."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
from numeric import f64_tol

from r3_rllib.config import default_values
from r3_rllib.core.health import (
    CHECK_NAMES,
    Finding,
    HealthThresholds,
    baseline_means,
    check_entropy,
    check_health,
    check_length,
    check_mismatch,
    check_nonfinite,
    check_reward_hacking,
    check_zero_advantage,
    health_metrics,
    nonfinite_stop_message,
    trend_rise,
    update_episodes,
)

DEFAULTS = HealthThresholds.from_config(SimpleNamespace(**default_values()))


def _past(value: float, direction: float) -> float:
    """The next float after ``value`` toward ``direction``: the closest value that is not the threshold."""
    return math.nextafter(value, direction)


def _t(**changes) -> HealthThresholds:
    return dataclasses.replace(DEFAULTS, **changes)


def test_defaults_come_from_the_config_and_pick_the_learners_entropy():
    assert DEFAULTS.entropy_metric == "learner/entropy"
    assert (DEFAULTS.entropy_min, DEFAULTS.entropy_drop, DEFAULTS.mismatch_k3_max) == (0.01, 0.1, 0.01)
    assert (DEFAULTS.zero_adv_frac_max, DEFAULTS.zero_adv_iterations) == (0.95, 3)
    assert (DEFAULTS.length_growth, DEFAULTS.truncated_frac_max) == (3.0, 0.5)
    assert (DEFAULTS.reward_rise, DEFAULTS.accuracy_rise_max, DEFAULTS.window) == (0.1, 0.02, 10)
    assert DEFAULTS.is_weight_max is None
    no_learner_entropy = SimpleNamespace(**(default_values() | {"learner_entropy": False}))
    assert HealthThresholds.from_config(no_learner_entropy).entropy_metric == "rollout/entropy_mean"


def test_entropy_floor_fires_at_the_threshold_not_above():
    at = check_entropy([{"learner/entropy": 0.01}], None, DEFAULTS)
    assert at.fired and at.threshold == 0.01 and at.value == 0.01
    assert "learner/entropy" in at.message and "health_entropy_min" in at.message
    above = check_entropy([{"learner/entropy": _past(0.01, 1.0)}], None, DEFAULTS)
    assert above.measured and not above.fired and above.message == ""


def test_entropy_drop_is_relative_to_the_first_iterations():
    baseline = baseline_means([{"learner/entropy": v} for v in (0.8, 1.0, 1.2)])
    assert baseline["learner/entropy"] == np.mean([0.8, 1.0, 1.2])
    threshold = 0.1 * baseline["learner/entropy"]  # the same product the check computes: exact
    at = check_entropy([{"learner/entropy": threshold}], baseline, DEFAULTS)
    assert at.fired and at.threshold == threshold and "health_entropy_drop" in at.message
    assert not check_entropy([{"learner/entropy": _past(threshold, 1.0)}], baseline, DEFAULTS).fired
    # Without the baseline only the floor applies.
    assert not check_entropy([{"learner/entropy": threshold}], None, DEFAULTS).fired


def test_entropy_unmeasured_without_its_metric_or_any_threshold():
    missing = check_entropy([{"rollout/entropy_mean": 0.0}], None, DEFAULTS)
    assert not missing.measured and not missing.fired and math.isnan(missing.value)
    nan = check_entropy([{"learner/entropy": float("nan")}], None, DEFAULTS)
    assert not nan.measured
    off = _t(entropy_min=None)
    assert not check_entropy([{"learner/entropy": 0.0}], None, off).measured  # drop only, no baseline yet
    assert all(
        f.name != "entropy_collapse"
        for f in check_health([{}], None, _t(entropy_min=None, entropy_drop=None))
    )


def test_mismatch_kl_and_is_weight_spike():
    at = check_mismatch([{"learner/mismatch_k3": 0.01}], DEFAULTS)
    assert [f.name for f in at] == ["mismatch_kl"]  # is_weight_max is off by default
    assert at[0].fired and "learner/mismatch_k3" in at[0].message
    assert not check_mismatch([{"learner/mismatch_k3": _past(0.01, 0.0)}], DEFAULTS)[0].fired
    both = check_mismatch(
        [{"learner/mismatch_k3": 0.0, "learner/mismatch_is_weight_max": 1.5}], _t(is_weight_max=1.5)
    )
    assert [(f.name, f.fired) for f in both] == [("mismatch_kl", False), ("is_weight_spike", True)]
    below = check_mismatch([{"learner/mismatch_is_weight_max": _past(1.5, 0.0)}], _t(is_weight_max=1.5))
    assert not below[1].fired and not below[0].measured  # no k3 in that iteration


def test_zero_advantage_needs_its_iterations_in_a_row():
    key = "rollout/zero_adv_frac"
    three = [{key: 0.95}, {key: 1.0}, {key: 0.95}]
    fired = check_zero_advantage(three, DEFAULTS)
    assert fired.fired and fired.value == 0.95 and "3 iterations" in fired.message
    assert not check_zero_advantage([{key: _past(0.95, 0.0)}, *three[1:]], DEFAULTS).fired
    assert not check_zero_advantage(three[:2], DEFAULTS).measured  # fewer iterations than its patience
    assert not check_zero_advantage([*three[:2], {key: float("nan")}], DEFAULTS).measured  # no group
    # Only the last zero_adv_iterations count.
    assert check_zero_advantage([{key: 0.0}, *three], DEFAULTS).fired


def test_length_blowup_against_the_baseline_and_truncation():
    baseline = {"rollout/response_len_mean": 10.0}
    threshold = 3.0 * 10.0
    blowup, truncation = check_length(
        [{"rollout/response_len_mean": threshold, "rollout/truncated_frac": 0.5}], baseline, DEFAULTS
    )
    assert blowup.fired and blowup.threshold == threshold and "blow-up" in blowup.message
    assert truncation.fired and truncation.threshold == 0.5 and "max_new_tokens" in truncation.message
    blowup, truncation = check_length(
        [{"rollout/response_len_mean": _past(threshold, 0.0), "rollout/truncated_frac": _past(0.5, 0.0)}],
        baseline,
        DEFAULTS,
    )
    assert blowup.measured and not blowup.fired and truncation.measured and not truncation.fired
    no_baseline = check_length([{"rollout/response_len_mean": 1e6}], None, DEFAULTS)
    assert [(f.name, f.measured) for f in no_baseline] == [("length_blowup", False), ("truncation", False)]


def test_trend_rise_is_the_least_squares_rise():
    # A straight line: its rise exactly, up to float64 rounding of the fit's sums over 10 points (a few ulps of 1).
    assert trend_rise(np.linspace(0.2, 0.5, 10)) == pytest.approx(0.3, abs=f64_tol(1.0, 64))
    assert trend_rise([0.3] * 10) == pytest.approx(0.0, abs=f64_tol(1.0, 64))
    assert trend_rise([1.0]) == 0.0


def _window(rewards, accuracy):
    return [{"rollout/reward_mean": r, "rollout/accuracy": a} for r, a in zip(rewards, accuracy, strict=True)]


def test_reward_up_accuracy_flat_fires_at_its_thresholds():
    rng = np.random.default_rng(0)
    rewards = list(np.linspace(0.1, 0.3, 10) + rng.normal(0, 0.01, 10))
    accuracy = list(0.2 + rng.normal(0, 0.005, 10))
    rise, accuracy_rise = trend_rise(rewards), trend_rise(accuracy)
    assert rise > 0.1 and abs(accuracy_rise) < 0.02
    fired = check_reward_hacking(_window(rewards, accuracy), DEFAULTS)
    assert fired.fired and fired.value == rise and "format hacking" in fired.message
    # At the thresholds (the same fits the check makes), and one float past them.
    assert check_reward_hacking(_window(rewards, accuracy), _t(reward_rise=rise)).fired
    assert not check_reward_hacking(_window(rewards, accuracy), _t(reward_rise=_past(rise, 1.0))).fired
    assert check_reward_hacking(
        _window(rewards, accuracy), _t(accuracy_rise_max=max(accuracy_rise, 0.0))
    ).fired
    rising = list(np.asarray(accuracy) + np.linspace(0.0, 0.2, 10))
    assert not check_reward_hacking(_window(rewards, rising), DEFAULTS).fired
    # A reward that is the accuracy rises with it: never fires.
    assert not check_reward_hacking(_window(rewards, rewards), DEFAULTS).fired


def test_reward_hacking_reads_a_full_window_only():
    flat = [0.2] * 10
    assert not check_reward_hacking(_window(np.linspace(0, 1, 9), flat[:9]), DEFAULTS).measured
    assert not check_reward_hacking(
        _window(np.linspace(0, 1, 10), [*flat[:9], float("nan")]), DEFAULTS
    ).measured
    # Only the last `window` iterations count: an old rise is forgotten.
    old_rise = _window(np.linspace(0, 1, 10), flat) + _window([1.0] * 10, flat)
    assert not check_reward_hacking(old_rise, DEFAULTS).fired


@pytest.mark.parametrize(
    "metrics, metric",
    [
        ({"learner/loss": float("nan"), "learner/grad_norm": 1.0}, "learner/loss"),
        ({"learner/loss": 0.5, "learner/grad_norm": float("inf")}, "learner/grad_norm"),
        ({"learner/pg_loss": float("-inf")}, "learner/pg_loss"),
        ({"learner/loss": 0.5, "learner/grad_norm": 1.0, "learner/nonfinite_grad_steps": 1.0}, None),
    ],
)
def test_nonfinite_names_the_metric(metrics, metric):
    finding = check_nonfinite([metrics])
    assert finding.fired and finding.measured
    assert finding.metric == (metric or "learner/nonfinite_grad_steps")
    assert finding.metric in finding.message


def test_nonfinite_quiet_when_finite_and_unmeasured_without_an_update():
    ok = check_nonfinite(
        [{"learner/loss": 0.5, "learner/grad_norm": 1e6, "learner/nonfinite_grad_steps": 0.0}]
    )
    assert ok.measured and not ok.fired
    assert not check_nonfinite([{"rollout/reward_mean": float("nan")}]).measured


def test_check_health_returns_every_switched_on_check_in_order():
    findings = check_health([{}], {}, _t(is_weight_max=1.0))
    assert [f.name for f in findings] == list(CHECK_NAMES)
    assert all(not f.fired and not f.measured for f in findings)
    assert check_health([], None, DEFAULTS) == []


def _finding(name: str, fired: bool, measured: bool = True) -> Finding:
    return Finding(name, "m", 1.0 if measured else math.nan, 0.0, fired, measured, "msg" if fired else "")


def test_a_warning_once_per_episode():
    active = frozenset()
    active, new = update_episodes(active, [_finding("truncation", True), _finding("mismatch_kl", False)])
    assert [f.name for f in new] == ["truncation"] and active == {"truncation"}
    active, new = update_episodes(active, [_finding("truncation", True)])
    assert new == [] and active == {"truncation"}  # still firing: no second warning
    active, new = update_episodes(active, [_finding("truncation", False, measured=False)])
    assert new == [] and active == {"truncation"}  # unmeasured: the episode goes on
    active, new = update_episodes(active, [_finding("truncation", True)])
    assert new == []
    active, new = update_episodes(active, [_finding("truncation", False)])
    assert new == [] and active == frozenset()  # the episode ended
    active, new = update_episodes(active, [_finding("truncation", True)])
    assert [f.name for f in new] == ["truncation"]  # a new episode warns again


def test_health_metrics_are_flags_values_and_thresholds():
    metrics = health_metrics([_finding("truncation", True), _finding("nonfinite", False, measured=False)])
    assert (
        metrics["truncation"] == 1.0
        and metrics["truncation_value"] == 1.0
        and metrics["truncation_threshold"] == 0
    )
    # Unmeasured: its flag, but no value or threshold (absent, not NaN).
    assert metrics["nonfinite"] == 0.0 and not {"nonfinite_value", "nonfinite_threshold"} & set(metrics)
    assert metrics["firing"] == 1.0


def test_the_stop_message_names_metric_iteration_and_checkpoint():
    finding = check_nonfinite([{"learner/loss": float("nan"), "learner/grad_norm": float("nan")}])
    message = nonfinite_stop_message(finding, 7, ("/runs/x/checkpoint_000002", 6), "unused")
    assert "iteration 7" in message and "learner/loss is nan" in message
    assert "/runs/x/checkpoint_000002 (iteration 6)" in message
    assert "no checkpoint" in nonfinite_stop_message(finding, 3, None, "no checkpoint was saved in this run")
