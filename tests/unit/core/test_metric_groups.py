"""A metric group logged with ``log_group`` (core/metric_groups.py) holds the iteration's own values: a key of an
earlier iteration that this one did not measure is absent from its result, not NaN (which RLlib's MetricsLogger
would report for it), while a measured NaN stays NaN."""

from __future__ import annotations

import math

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from r3_rllib.core.metric_groups import clear_groups, log_group


def _result(logger: MetricsLogger) -> dict:
    return MetricsLogger.peek_results(logger.reduce())


def test_a_key_the_iteration_did_not_log_is_absent_and_its_values_are_reported_as_logged():
    logger = MetricsLogger()
    log_group(logger, "eval", {"accuracy": 0.25, "num_queries": 8.0})
    assert _result(logger)["eval"] == {"accuracy": 0.25, "num_queries": 8.0}
    log_group(logger, "eval", {})  # an iteration that did not evaluate
    assert "eval" not in _result(logger)
    log_group(logger, "eval", {"accuracy": 0.5})
    assert _result(logger)["eval"] == {"accuracy": 0.5}


def test_a_subgroup_of_the_other_stage_is_absent_and_a_measured_nan_stays_nan():
    logger = MetricsLogger()
    log_group(logger, "r2po", {"stage": 0.0, "A": {"loss": 0.5}})
    log_group(logger, "r2po", {"stage": 1.0, "B": {"loss": math.nan}})
    result = _result(logger)["r2po"]
    assert set(result) == {"stage", "B"} and result["stage"] == 1.0 and math.isnan(result["B"]["loss"])


def test_clear_groups_drops_nested_and_missing_groups_and_leaves_the_others():
    logger = MetricsLogger()
    logger.log_value(("distill", "scored_samples"), 32.0, reduce="mean", window=1)
    logger.log_value(("r2po", "A", "loss"), 0.5, reduce="mean", window=1)
    logger.log_value(("r2po", "stage"), 0.0, reduce="mean", window=1)
    logger.log_value(("rollout", "accuracy"), 0.5, reduce="mean", window=1)
    _result(logger)
    clear_groups(logger, "distill", ("r2po", "A"), "reward", ("eval", "accuracy"))
    logger.log_value(("rollout", "accuracy"), 0.75, reduce="mean", window=1)
    logger.log_value(("r2po", "stage"), 0.0, reduce="mean", window=1)
    assert _result(logger) == {"r2po": {"stage": 0.0}, "rollout": {"accuracy": 0.75}}


def test_without_clearing_rllib_reports_the_key_an_iteration_did_not_log_as_nan():
    """Why: the same logger, logged into with ``log_dict`` alone."""
    logger = MetricsLogger()
    logger.log_dict({"A": {"loss": 0.5}}, key="r2po", reduce="mean", window=1)
    _result(logger)
    logger.log_dict({"B": {"loss": 0.25}}, key="r2po", reduce="mean", window=1)
    assert math.isnan(_result(logger)["r2po"]["A"]["loss"])
