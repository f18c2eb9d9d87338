"""`R3`'s health monitor (algorithms/r3/health_monitor.py) on a stand-in algorithm: health/* metrics in the result,
one warning per episode, the NaN stop naming the iteration and the last checkpoint, the driver's warning callback,
and the config's health_* validation."""

from __future__ import annotations

import io
import logging
import math

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import health_monitor
from r3_rllib.algorithms.r3.checkpoint_files import build_manifest, write_manifest
from r3_rllib.algorithms.r3.health_monitor import HealthWarningCallback, observe_health
from r3_rllib.config import config_errors
from r3_rllib.core.health import CHECK_NAMES, NonFiniteTrainingError


class _Algo:
    """What observe_health reads of an `R3`: its config, MetricsLogger and iteration (and checkpoint attributes)."""

    def __init__(self, config: R3Config) -> None:
        self.config = config
        self.metrics = MetricsLogger()
        self.iteration = 0

    def step(self, rollout: dict, learner: dict) -> dict:
        """One training_step's worth: log the rollout metrics, observe, reduce; returns the health results."""
        self.metrics.log_dict(rollout, key="rollout")
        observe_health(self, learner)
        self.iteration += 1
        return {k: v.peek() for k, v in self.metrics.reduce()["health"].items()}


ROLLOUT = {"accuracy": 0.5, "reward_mean": 0.5, "response_len_mean": 10.0, "truncated_frac": 0.1}
LEARNER = {"loss": 0.1, "pg_loss": 0.1, "grad_norm": 1.0, "entropy": 1.0, "mismatch_k3": 1e-4}


def test_health_metrics_are_logged_every_iteration_and_a_warning_once_per_episode(caplog):
    algo = _Algo(R3Config())
    caplog.set_level(logging.WARNING, logger=health_monitor.__name__)
    healthy = algo.step(ROLLOUT | {"zero_adv_frac": 0.2}, LEARNER)
    assert {name for name in CHECK_NAMES if name != "is_weight_spike"} <= set(healthy)
    assert healthy["firing"] == 0.0 and healthy["entropy_collapse_value"] == 1.0
    assert healthy["truncation_threshold"] == 0.5 and "length_blowup_value" not in healthy  # no baseline yet
    for _ in range(3):
        truncated = algo.step(ROLLOUT | {"truncated_frac": 0.7}, LEARNER)
        assert truncated["truncation"] == 1.0 and truncated["truncation_value"] == 0.7
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("health warning at iteration 2 (truncation): ")
    assert "rollout/truncated_frac = 0.7 >= 0.5" in warnings[0]
    assert algo.step(ROLLOUT, LEARNER)["truncation"] == 0.0
    algo.step(ROLLOUT | {"truncated_frac": 0.6}, LEARNER)
    assert len(caplog.records) == 2 and "iteration 6 (truncation)" in caplog.records[1].getMessage()


def test_relative_checks_start_after_the_baseline_iterations():
    algo = _Algo(R3Config())
    for _ in range(3):
        assert "length_blowup_threshold" not in algo.step(ROLLOUT, LEARNER)
    blown = algo.step(ROLLOUT | {"response_len_mean": 30.0}, LEARNER | {"entropy": 0.1})
    assert blown["length_blowup"] == 1.0 and blown["length_blowup_threshold"] == 30.0
    assert blown["entropy_collapse"] == 1.0 and blown["entropy_collapse_threshold"] == 0.1


def test_an_iteration_without_an_update_leaves_the_learner_checks_unmeasured():
    algo = _Algo(R3Config())
    quiet = algo.step(ROLLOUT, {})
    assert quiet["nonfinite"] == 0.0 and "nonfinite_value" not in quiet


def test_a_check_measured_before_and_unmeasured_now_reports_no_value_rather_than_nan():
    """RLlib would report the value and threshold of the iteration before as NaN; a measured NaN loss stays NaN."""
    algo = _Algo(R3Config().training(health_stop_on_nonfinite=False))
    trained = algo.step(ROLLOUT, LEARNER)
    assert trained["entropy_collapse_value"] == 1.0 and trained["nonfinite_value"] == 0.0
    quiet = algo.step(ROLLOUT, {})  # nothing trained: the learner's checks are unmeasured
    learner_checks = ("entropy_collapse", "mismatch_kl", "nonfinite")
    assert not {f"{name}_{part}" for name in learner_checks for part in ("value", "threshold")} & set(quiet)
    assert [quiet[name] for name in learner_checks] == [0.0, 0.0, 0.0]
    assert not any(math.isnan(v) for v in quiet.values()), quiet
    nan_loss = algo.step(ROLLOUT, LEARNER | {"loss": float("nan")})
    assert nan_loss["nonfinite"] == 1.0 and math.isnan(nan_loss["nonfinite_value"])


def test_nan_loss_stops_naming_iteration_and_that_no_checkpoint_was_saved():
    algo = _Algo(R3Config())
    algo.step(ROLLOUT, LEARNER)
    with pytest.raises(NonFiniteTrainingError) as err:
        algo.step(
            ROLLOUT, LEARNER | {"loss": float("nan"), "grad_norm": float("nan"), "nonfinite_grad_steps": 1.0}
        )
    message = str(err.value)
    assert "iteration 2" in message and "learner/loss is nan" in message
    assert "no checkpoint was saved in this run" in message and "algo.save()" in message


def test_nan_stop_names_the_last_saved_checkpoint(tmp_path):
    algo = _Algo(R3Config())
    algo.step(ROLLOUT, LEARNER)
    saved = tmp_path / "ckpt"
    saved.mkdir()
    (saved / "state.bin").write_bytes(b"x")
    write_manifest(str(saved), build_manifest(str(saved), {"iteration": 1}))
    algo._checkpoint_target = str(saved)  # what R3.save_checkpoint records
    with pytest.raises(NonFiniteTrainingError, match=r"iteration 2: .*inf") as err:
        algo.step(ROLLOUT, LEARNER | {"grad_norm": float("inf")})
    assert f"the last good checkpoint is {saved} (iteration 1)" in str(err.value)
    # A directory save_checkpoint wrote but whose save did not complete (no manifest) is not named.
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    algo._checkpoint_target = str(unfinished)
    assert health_monitor.last_checkpoint(algo) is None


def test_a_tune_trial_names_its_newest_complete_checkpoint(tmp_path, monkeypatch):
    class Storage:
        trial_fs_path = str(tmp_path)

    class Choice:
        path = str(tmp_path / "checkpoint_000003")
        manifest = build_manifest(str(tmp_path), {"iteration": 9})

    seen = {}

    def newest(trial_dir, *, set_aside, hashes):
        seen.update(trial_dir=trial_dir, set_aside=set_aside, hashes=hashes)
        return Choice

    monkeypatch.setattr(health_monitor, "newest_complete_checkpoint", newest)
    algo = _Algo(R3Config())
    algo._storage = Storage()
    assert health_monitor.last_checkpoint(algo) == (Choice.path, 9)
    assert seen == {"trial_dir": str(tmp_path), "set_aside": False, "hashes": False}  # a look, nothing moved
    Choice.path = None
    with pytest.raises(NonFiniteTrainingError, match="this trial has no complete checkpoint yet"):
        algo.step(ROLLOUT, LEARNER | {"loss": float("inf")})


def test_stop_off_warns_instead(caplog):
    algo = _Algo(R3Config().training(health_stop_on_nonfinite=False))
    caplog.set_level(logging.WARNING, logger=health_monitor.__name__)
    result = algo.step(ROLLOUT, LEARNER | {"loss": float("nan")})
    assert result["nonfinite"] == 1.0
    assert "learner/loss is nan" in caplog.records[0].getMessage()


def test_health_checks_off_logs_nothing():
    algo = _Algo(R3Config().training(health_checks=False))
    algo.metrics.log_dict(ROLLOUT, key="rollout")
    assert observe_health(algo, LEARNER | {"loss": float("nan")}) == []
    assert "health" not in algo.metrics.reduce()


def test_the_driver_callback_prints_each_episode_once():
    stream = io.StringIO()
    callback = HealthWarningCallback(stream=stream)
    firing = {"truncation": 1.0, "truncation_value": 0.8, "truncation_threshold": 0.5}
    quiet = {"truncation": 0.0, "truncation_value": 0.1, "truncation_threshold": 0.5}
    unmeasured = {"truncation": 0.0, "truncation_value": math.nan, "truncation_threshold": math.nan}
    for i, health in enumerate([firing, firing, unmeasured, firing, quiet, firing], start=1):
        callback.on_trial_result(i, ["t"], "t", {"training_iteration": i, "health": health})
    lines = stream.getvalue().splitlines()
    assert lines == [
        f"health warning at iteration {i} (truncation): health/truncation_value 0.8, threshold 0.5"
        for i in (1, 6)
    ]
    # Flattened results (health/<key>) and several trials: each line names its trial.
    stream.truncate(0)
    stream.seek(0)
    flat = {"training_iteration": 2, **{f"health/{k}": v for k, v in firing.items()}}
    callback.on_trial_result(2, ["a", "b"], "b", flat)
    assert stream.getvalue().startswith("b: health warning at iteration 2 (truncation)")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"health_entropy_drop": 1.5}, "health_entropy_drop must be in (0, 1)"),
        ({"health_truncated_frac_max": 0.0}, "health_truncated_frac_max must be in (0, 1]"),
        ({"health_window": 1}, "health_window must be >= 2"),
        ({"health_zero_adv_iterations": 2.5}, "health_zero_adv_iterations must be an int"),
        ({"health_length_growth": 1.0}, "health_length_growth must be finite and > 1"),
        ({"health_mismatch_k3_max": float("inf")}, "health_mismatch_k3_max must be finite and > 0"),
        ({"health_checks": "yes"}, "health_checks must be true or false"),
        (
            {"health_is_weight_max": 3.0},
            "health_is_weight_max=3.0 can never fire: the importance weight is truncated at is_cap=2.0",
        ),
        (
            {"health_is_weight_max": 6.0, "rollout_rs": "icepop", "rollout_rs_threshold": 5.0},
            "truncated at rollout_rs_threshold=5.0",
        ),
    ],
)
def test_invalid_health_settings_are_named(settings, message):
    errors = config_errors(R3Config().training(**settings))
    assert any(message in e for e in errors), errors


def test_valid_health_settings_pass():
    config = R3Config().training(
        health_is_weight_max=2.0,
        health_entropy_min=None,
        health_reward_rise=None,
        health_zero_adv_iterations=1,
    )
    assert config_errors(config) == []
