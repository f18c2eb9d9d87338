"""`R3`'s health checks (the detection itself: ``r3_rllib.core.health``): each iteration's ``health/*`` metrics, a
warning when a condition starts, and the stop on NaN/inf in the loss or gradients.

``R3.training_step`` calls :func:`observe_health` once per iteration, after its metrics are logged. The
:class:`HealthMonitor` it keeps on the algorithm holds the recent iterations' metrics and the run's first ones (the
baseline of the relative checks), logs ``health/<check>`` (1 while it fires), ``health/<check>_value`` and
``health/<check>_threshold`` into the result, and logs each warning once per episode of its condition through this
module's logger (a plain ``algo.train()`` loop shows it on the console). ``r3 train`` runs the algorithm in a Tune
trial whose output the console does not show: there :class:`HealthWarningCallback` prints the warnings on the
driver from the results' ``health/*`` metrics.

A fired ``nonfinite`` check raises :class:`~r3_rllib.core.health.NonFiniteTrainingError` (unless
``health_stop_on_nonfinite`` is off), naming the metric, the iteration and the last complete checkpoint: the
trial's newest under Tune, else the directory of the last ``algo.save()``. The learner has already skipped the
optimizer step whose gradient was not finite (``R3Learner._apply_gradients``), so the weights are not poisoned.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
from collections.abc import Mapping
from typing import Any

from ray.tune import Callback

from r3_rllib.algorithms.r3.checkpoint import newest_complete_checkpoint
from r3_rllib.algorithms.r3.checkpoint_files import read_manifest
from r3_rllib.core.health import (
    CHECK_NAMES,
    Finding,
    HealthThresholds,
    NonFiniteTrainingError,
    baseline_means,
    check_health,
    health_metrics,
    nonfinite_stop_message,
    update_episodes,
)
from r3_rllib.core.metric_groups import log_group

logger = logging.getLogger(__name__)

#: The metric groups of the result the checks read.
_GROUPS = ("rollout", "learner")
NO_CHECKPOINT_PLAIN = (
    "no checkpoint was saved in this run (an algo.train() loop has one only where it calls algo.save(); save every "
    "few iterations to have one to go back to)"
)
NO_CHECKPOINT_TUNE = (
    "this trial has no complete checkpoint yet (run.checkpoint_frequency sets how often one is saved)"
)


class HealthMonitor:
    """The window of per-iteration metrics and the checks firing now (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        self.thresholds = HealthThresholds.from_config(config)
        self.stop_on_nonfinite = bool(config.health_stop_on_nonfinite)
        self.first: list[dict[str, float]] = []  # the run's first baseline_iterations iterations
        self.recent: collections.deque[dict[str, float]] = collections.deque(maxlen=self.thresholds.history)
        self.active: frozenset[str] = frozenset()

    def observe(self, metrics: Mapping[str, float]) -> tuple[list[Finding], list[Finding]]:
        """Add one iteration's flat metrics; returns every check's finding and the ones that start an episode."""
        metrics = dict(metrics)
        self.recent.append(metrics)
        baseline = (
            baseline_means(self.first) if len(self.first) >= self.thresholds.baseline_iterations else None
        )
        if baseline is None:
            self.first.append(metrics)
        findings = check_health(list(self.recent), baseline, self.thresholds)
        self.active, new = update_episodes(self.active, findings)
        return findings, new


def iteration_metrics(algo: Any, learner_metrics: Mapping[str, float]) -> dict[str, float]:
    """The iteration's rollout metrics (as logged, read back from the algorithm's MetricsLogger) and the learner's
    (given: none when nothing was trained), flat with ``rollout/`` and ``learner/`` names."""
    out = {}
    rollout = algo.metrics.peek("rollout", default={})
    for group, values in zip(_GROUPS, (rollout, learner_metrics), strict=True):
        for key, value in (values or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[f"{group}/{key}"] = float(value)
    return out


def observe_health(algo: Any, learner_metrics: Mapping[str, float]) -> list[Finding]:
    """One iteration of `R3`'s health checks (see the module docstring); returns the findings. Does nothing with
    ``health_checks`` off."""
    config = algo.config
    if not getattr(config, "health_checks", False):
        return []
    monitor = algo.__dict__.get("_health_monitor")
    if monitor is None:
        monitor = algo.__dict__["_health_monitor"] = HealthMonitor(config)
    iteration = int(algo.iteration) + 1  # training_step runs before RLlib counts the iteration
    findings, new = monitor.observe(iteration_metrics(algo, learner_metrics))
    log_group(algo.metrics, "health", health_metrics(findings))
    for finding in findings:
        if finding.name == "nonfinite" and finding.fired and monitor.stop_on_nonfinite:
            raise NonFiniteTrainingError(
                nonfinite_stop_message(finding, iteration, last_checkpoint(algo), _no_checkpoint(algo))
            )
    for finding in new:
        logger.warning("health warning at iteration %d (%s): %s", iteration, finding.name, finding.message)
    return findings


def last_checkpoint(algo: Any) -> tuple[str, int | None] | None:
    """(path, iteration) of the newest complete checkpoint of ``algo``: its Tune trial's newest (sizes checked,
    not hashes), else the directory of its last ``save()`` when that one is complete (has its manifest); None when
    there is none."""
    storage = getattr(algo, "_storage", None)
    if storage is not None:
        trial_dir = getattr(storage, "trial_fs_path", None)
        if not trial_dir or not os.path.isdir(trial_dir):
            return None
        choice = newest_complete_checkpoint(trial_dir, set_aside=False, hashes=False)
        if choice.path is None:
            return None
        return choice.path, _manifest_iteration(choice.manifest)
    target = getattr(algo, "_checkpoint_target", None)
    if not target or not os.path.isdir(target):
        return None
    manifest = read_manifest(target)
    if manifest is None:
        return None
    return os.path.abspath(target), _manifest_iteration(manifest)


def _manifest_iteration(manifest: Any) -> int | None:
    iteration = (getattr(manifest, "meta", None) or {}).get("iteration")
    return int(iteration) if isinstance(iteration, int) else None


def _no_checkpoint(algo: Any) -> str:
    return NO_CHECKPOINT_TUNE if getattr(algo, "_storage", None) is not None else NO_CHECKPOINT_PLAIN


class HealthWarningCallback(Callback):
    """Prints, on the Tune driver, a trial's health warnings from its results' ``health/*`` metrics, once per
    episode of a condition (the trial's own log lines do not reach the console under ``r3 train``)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self._active: dict[str, set[str]] = {}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        active = self._active.setdefault(str(trial), set())
        health = _health_group(result)
        for line in result_warnings(health, active):
            prefix = f"{trial}: " if len(trials) > 1 else ""
            at = result.get("training_iteration", "?")
            print(
                f"{prefix}health warning at iteration {at} {line}",
                file=self.stream or sys.stderr,
                flush=True,
            )


def _health_group(result: Mapping[str, Any]) -> dict[str, Any]:
    """The result's ``health`` metrics, whether nested or flattened as ``health/<key>``."""
    nested = result.get("health")
    if isinstance(nested, Mapping):
        return dict(nested)
    return {
        k.split("/", 1)[1]: v for k, v in result.items() if isinstance(k, str) and k.startswith("health/")
    }


def result_warnings(health: Mapping[str, Any], active: set[str]) -> list[str]:
    """The warnings of one result's ``health`` metrics for the checks that start firing (``active``: the checks
    firing at their last measurement, updated in place); one line each, naming the check, value and threshold."""
    lines = []
    for name in CHECK_NAMES:
        flag = health.get(name)
        if flag is None:
            continue
        value, threshold = health.get(f"{name}_value", math.nan), health.get(f"{name}_threshold", math.nan)
        if flag and name not in active:
            active.add(name)
            lines.append(f"({name}): health/{name}_value {value:.4g}, threshold {threshold:.4g}")
        elif not flag and not math.isnan(value):
            active.discard(name)
    return lines
