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


def test_the_r3_and_replay_groups_hold_only_what_the_iteration_measured():
    """``R3._log_metrics`` on a stand-in algorithm: a batch metric of one iteration only (the learner's ranking
    entropies, with ranking on in one R^2PO stage and off in the other) and the replay actor's numbers in an
    iteration where the actor is gone are absent, not NaN; the rest as measured."""
    from types import SimpleNamespace

    from r3_rllib.algorithms.r3.r3 import R3
    from r3_rllib.algorithms.r3.rollout_types import Rollout

    class Replay:
        up = True

        def call(self, fn, default):  # ReplaySupervisor.call: ``default`` when the actor is gone
            return {"size": 3.0} if self.up else default

        def health_metrics(self):
            return {"available": float(self.up)}

    algo = SimpleNamespace(
        metrics=MetricsLogger(),
        weights=SimpleNamespace(loads_skipped=0, version=1),
        coordinator=SimpleNamespace(epoch=SimpleNamespace(value=0)),
        _replay=Replay(),
    )
    batch = {"zero_adv_frac": 0.5, "trained_groups": 1.0, "train_samples": 4.0}
    results = []
    for r3_metrics, up in ((batch | {"ranking_entropy_tokens": 5.0}, True), (batch, False)):
        algo._replay.up = up
        R3._log_metrics(algo, Rollout(), r3_metrics, {"loss": 1.0})
        results.append(MetricsLogger.peek_results(algo.metrics.reduce()))
    assert [r["r3"].get("ranking_entropy_tokens") for r in results] == [5.0, None]
    assert [r["r3"]["train_samples"] for r in results] == [4.0, 4.0]
    assert [r["replay"] for r in results] == [{"size": 3.0, "available": 1.0}, {"available": 0.0}]


def test_zero_adv_frac_is_absent_in_an_iteration_that_scored_no_fresh_group():
    """``rollout/zero_adv_frac`` is NaN in the batch builder's metrics when no fresh group was scored (DAPO's filter
    kept none, every group a reflection): the iteration's result leaves it out, also after iterations that
    measured it, and the next one that measures it reports its value (the rest of the group as logged)."""
    from types import SimpleNamespace

    from r3_rllib.algorithms.r3.r3 import R3
    from r3_rllib.algorithms.r3.rollout_types import Rollout

    algo = SimpleNamespace(
        metrics=MetricsLogger(),
        weights=SimpleNamespace(loads_skipped=0, version=1),
        coordinator=SimpleNamespace(epoch=SimpleNamespace(value=0)),
        _replay=None,
    )
    results = []
    for zero_adv in (0.25, math.nan, 0.5):
        R3._log_metrics(algo, Rollout(), {"zero_adv_frac": zero_adv, "trained_groups": 1.0}, {})
        results.append(MetricsLogger.peek_results(algo.metrics.reduce())["rollout"])
    assert [r.get("zero_adv_frac") for r in results] == [0.25, None, 0.5]
    assert [r["trained_groups"] for r in results] == [1.0, 1.0, 1.0]


def test_r2po_stage_zero_adv_frac_is_absent_when_not_measured():
    """R^2PO's per-stage copy (``r2po/<stage>/zero_adv_frac``) follows the rollout's: absent when NaN."""
    from r3_rllib.r2po.method import R2POPhase
    from r3_rllib.r2po.stages import HEAD_STAGE

    logger, phase, got = MetricsLogger(), R2POPhase(HEAD_STAGE), []
    for zero_adv in (0.5, math.nan):
        phase.log_metrics(logger, {"train_samples": 4.0, "zero_adv_frac": zero_adv}, {})
        got.append(MetricsLogger.peek_results(logger.reduce())["r2po"][str(HEAD_STAGE)])
    assert got == [{"train_samples": 4.0, "zero_adv_frac": 0.5}, {"train_samples": 4.0}]
