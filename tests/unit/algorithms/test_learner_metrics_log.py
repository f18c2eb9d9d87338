"""An iteration that trains nothing (every group filtered: all tied, DAPO's filter, any kind) reports
``trained_tokens`` 0 and none of the earlier iterations' learner metrics, not NaN (RLlib reports a key logged in an
earlier iteration but not in this one as NaN)."""

from __future__ import annotations

import math

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from r3_rllib.algorithms.r3.r3 import log_learner_metrics


def _iteration(logger: MetricsLogger, learner_metrics: dict[str, float]) -> dict[str, float]:
    log_learner_metrics(logger, learner_metrics)
    return MetricsLogger.peek_results(logger.reduce())["learner"]


def test_an_iteration_that_trains_nothing_reports_zero_tokens_and_no_stale_nan():
    logger = MetricsLogger()
    trained = {"trained_tokens": 48.0, "loss": 0.25, "grad_norm": 1.5}
    assert _iteration(logger, trained) == trained
    assert _iteration(logger, {}) == {"trained_tokens": 0.0}
    # The next iteration that trains reports its own metrics again, none NaN.
    again = _iteration(logger, {"trained_tokens": 12.0, "loss": 0.5, "grad_norm": 2.0})
    assert again == {"trained_tokens": 12.0, "loss": 0.5, "grad_norm": 2.0}
    assert not any(math.isnan(v) for v in again.values())


def test_without_the_fix_rllib_reports_the_missing_keys_as_nan():
    """Why the keys are dropped: a key logged once and then not logged comes back NaN."""
    logger = MetricsLogger()
    logger.log_dict({"trained_tokens": 48.0}, key="learner")
    logger.reduce()
    assert math.isnan(MetricsLogger.peek_results(logger.reduce())["learner"]["trained_tokens"])


def test_a_key_only_some_iterations_have_is_absent_in_the_others():
    logger = MetricsLogger()
    assert _iteration(logger, {"trained_tokens": 8.0, "is_weight_max": 3.0})["is_weight_max"] == 3.0
    assert _iteration(logger, {"trained_tokens": 8.0}) == {"trained_tokens": 8.0}
