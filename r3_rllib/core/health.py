"""Training health checks: pure functions over a window of per-iteration metric dicts (no Ray, no torch).

Each iteration's metrics are one flat dict with the result's ``a/b`` names (``rollout/entropy_mean``,
``learner/mismatch_k3``, ...). :func:`check_health` reads the recent iterations (oldest first, the current one last)
and the means of the run's first iterations (the *baseline*, for the relative checks) and returns one
:class:`Finding` per check that is switched on:

========================  ==========================================================================================
``entropy_collapse``      mean token entropy at or below ``health_entropy_min`` nats, or at or below
                          ``health_entropy_drop`` x its baseline (``learner/entropy``; ``rollout/entropy_mean``
                          when the learner does not measure it)
``mismatch_kl``           ``learner/mismatch_k3`` (KL of the engine's sampling policy to the learner's) at or above
                          ``health_mismatch_k3_max``
``is_weight_spike``       ``learner/mismatch_is_weight_max`` at or above ``health_is_weight_max``
``zero_advantage``        ``rollout/zero_adv_frac`` at or above ``health_zero_adv_frac_max`` in each of the last
                          ``health_zero_adv_iterations`` iterations
``length_blowup``         ``rollout/response_len_mean`` at or above ``health_length_growth`` x its baseline
``truncation``            ``rollout/truncated_frac`` at or above ``health_truncated_frac_max``
``reward_hacking``        over the last ``health_window`` iterations ``rollout/reward_mean`` rose by at least
                          ``health_reward_rise`` (least-squares trend) while ``rollout/accuracy`` rose by at most
                          ``health_accuracy_rise_max``: the reward is paid for something else than correctness
``nonfinite``             NaN or inf in ``learner/loss``, ``learner/pg_loss`` or ``learner/grad_norm``, or an optimizer
                          step skipped for a non-finite gradient (``learner/nonfinite_grad_steps``)
========================  ==========================================================================================

A check whose metric this iteration lacks (nothing trained, the baseline not complete yet, fewer iterations than its
window) is *unmeasured*: not fired, value and threshold NaN. :func:`update_episodes` turns findings into warnings once
per episode of a condition: a check warns when it fires and did not fire at its last measurement, and its episode
ends at the first measurement where it does not fire. :func:`health_metrics` gives the ``health/*`` metrics:
``<check>`` (1 while it fires, else 0), and ``<check>_value`` and ``<check>_threshold`` of a measured check (absent,
not NaN, while it is unmeasured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Every check, in the order :func:`check_health` returns them.
CHECK_NAMES: tuple[str, ...] = (
    "entropy_collapse",
    "mismatch_kl",
    "is_weight_spike",
    "zero_advantage",
    "length_blowup",
    "truncation",
    "reward_hacking",
    "nonfinite",
)
#: The learner metrics that must be finite (``nonfinite``); the count of skipped steps must be 0.
NONFINITE_METRICS: tuple[str, ...] = ("learner/loss", "learner/pg_loss", "learner/grad_norm")
SKIPPED_STEPS = "learner/nonfinite_grad_steps"
#: Metrics whose baseline (the mean over the run's first iterations) a relative check compares with.
BASELINE_METRICS: tuple[str, ...] = ("learner/entropy", "rollout/entropy_mean", "rollout/response_len_mean")

Metrics = Mapping[str, Any]
NAN = float("nan")


class NonFiniteTrainingError(RuntimeError):
    """Training stopped: NaN or inf in the loss or the gradients (the message names the metric, the iteration and
    the last checkpoint saved before it)."""


@dataclass(frozen=True)
class HealthThresholds:
    """The checks' settings (the config's ``health_*`` fields; None switches a check off)."""

    entropy_metric: str
    entropy_min: float | None
    entropy_drop: float | None
    mismatch_k3_max: float | None
    is_weight_max: float | None
    zero_adv_frac_max: float | None
    zero_adv_iterations: int
    length_growth: float | None
    truncated_frac_max: float | None
    reward_rise: float | None
    accuracy_rise_max: float
    window: int
    baseline_iterations: int

    @classmethod
    def from_config(cls, config: Any) -> HealthThresholds:
        """From an ``R3Config`` (or any object with its ``health_*`` fields and ``learner_entropy``)."""
        return cls(
            entropy_metric="learner/entropy" if config.learner_entropy else "rollout/entropy_mean",
            entropy_min=config.health_entropy_min,
            entropy_drop=config.health_entropy_drop,
            mismatch_k3_max=config.health_mismatch_k3_max,
            is_weight_max=config.health_is_weight_max,
            zero_adv_frac_max=config.health_zero_adv_frac_max,
            zero_adv_iterations=int(config.health_zero_adv_iterations),
            length_growth=config.health_length_growth,
            truncated_frac_max=config.health_truncated_frac_max,
            reward_rise=config.health_reward_rise,
            accuracy_rise_max=float(config.health_accuracy_rise_max),
            window=int(config.health_window),
            baseline_iterations=int(config.health_baseline_iterations),
        )

    @property
    def history(self) -> int:
        """How many recent iterations the checks read."""
        return max(self.window, self.zero_adv_iterations)


@dataclass(frozen=True)
class Finding:
    """One check's outcome at one iteration. ``measured`` False: its metric was missing (then ``value`` and
    ``threshold`` are NaN and it has not fired). ``message`` says what fired and what to do ("" when it did not)."""

    name: str
    metric: str
    value: float
    threshold: float
    fired: bool
    measured: bool = True
    message: str = ""


def metric_value(metrics: Metrics, key: str) -> float:
    """``metrics[key]`` as a float; NaN when missing or not a number."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return NAN
    return float(value)


def baseline_means(first: Sequence[Metrics], keys: Sequence[str] = BASELINE_METRICS) -> dict[str, float]:
    """The mean of each of ``keys`` over the finite values it has in ``first`` (the run's first iterations); a key
    with none is left out."""
    out = {}
    for key in keys:
        values = [v for v in (metric_value(m, key) for m in first) if math.isfinite(v)]
        if values:
            out[key] = float(np.mean(values))
    return out


def _unmeasured(name: str, metric: str) -> Finding:
    return Finding(name, metric, NAN, NAN, fired=False, measured=False)


def check_entropy(
    recent: Sequence[Metrics], baseline: Mapping[str, float] | None, t: HealthThresholds
) -> Finding:
    """``entropy_collapse``: the entropy at or below the higher of the floor and the baseline's fraction."""
    metric = t.entropy_metric
    value = metric_value(recent[-1], metric)
    limits = []
    if t.entropy_min is not None:
        limits.append((float(t.entropy_min), "health_entropy_min"))
    if t.entropy_drop is not None and baseline and metric in baseline:
        base = baseline[metric]
        limits.append(
            (
                t.entropy_drop * base,
                f"health_entropy_drop={t.entropy_drop:g} x its first iterations' {base:.4g}",
            )
        )
    if not limits or not math.isfinite(value):
        return _unmeasured("entropy_collapse", metric)
    threshold, why = max(limits)
    fired = value <= threshold
    message = (
        f"entropy collapse: {metric} = {value:.4g} nats <= {threshold:.4g} ({why}): the policy is turning "
        "deterministic, its groups stop differing and exploration ends; lower lr, raise clip_high or the "
        "temperature, or add replay / ranking"
    )
    return Finding("entropy_collapse", metric, value, threshold, fired, message=message if fired else "")


def _at_or_above(name: str, metric: str, recent: Sequence[Metrics], threshold: float, what: str) -> Finding:
    """A check of ``metric`` >= ``threshold`` in the current iteration; ``what`` completes its message."""
    value = metric_value(recent[-1], metric)
    if not math.isfinite(value):
        return _unmeasured(name, metric)
    fired = value >= threshold
    message = f"{metric} = {value:.4g} >= {threshold:.4g}: {what}" if fired else ""
    return Finding(name, metric, value, float(threshold), fired, message=message)


def check_mismatch(recent: Sequence[Metrics], t: HealthThresholds) -> list[Finding]:
    """``mismatch_kl`` and ``is_weight_spike``: the engine's sampling policy far from the learner's."""
    out = []
    if t.mismatch_k3_max is not None:
        what = (
            "rollout/learner mismatch (KL of the engine's sampling policy to the learner's, health_mismatch_k3_max): "
            "check the weight sync and the engine's dtype, or reject such tokens (rollout_rs); with generation "
            "overlapped (max_staleness >= 1) it includes the policy's change over the staleness: a lower lr or "
            "staleness lowers it"
        )
        out.append(_at_or_above("mismatch_kl", "learner/mismatch_k3", recent, t.mismatch_k3_max, what))
    if t.is_weight_max is not None:
        what = (
            "importance-weight spike (health_is_weight_max): some tokens are far likelier under the learner than "
            "under the engine that sampled them; check the weight sync and staleness, or reject them (rollout_rs)"
        )
        out.append(
            _at_or_above("is_weight_spike", "learner/mismatch_is_weight_max", recent, t.is_weight_max, what)
        )
    return out


def check_zero_advantage(recent: Sequence[Metrics], t: HealthThresholds) -> Finding:
    """``zero_advantage``: almost every group has equal rewards, for ``zero_adv_iterations`` iterations running."""
    metric, threshold, n = "rollout/zero_adv_frac", float(t.zero_adv_frac_max), t.zero_adv_iterations
    values = [metric_value(m, metric) for m in recent[-n:]]
    if len(values) < n or not all(math.isfinite(v) for v in values):
        return _unmeasured("zero_advantage", metric)
    fired = min(values) >= threshold
    message = (
        f"zero advantage: {metric} >= {threshold:.4g} for {n} iterations (now {values[-1]:.4g}): almost every group's "
        "samples got the same reward and train nothing; the tasks are too hard or too easy for the policy: other "
        "data, dynamic_sampling, replay or ranking"
    )
    return Finding("zero_advantage", metric, values[-1], threshold, fired, message=message if fired else "")


def check_length(
    recent: Sequence[Metrics], baseline: Mapping[str, float] | None, t: HealthThresholds
) -> list[Finding]:
    """``length_blowup`` (the mean response length grown by a factor) and ``truncation`` (responses cut off)."""
    out = []
    metric = "rollout/response_len_mean"
    if t.length_growth is not None and baseline and baseline.get(metric, 0.0) > 0:
        base = baseline[metric]
        what = (
            f"response length blow-up (health_length_growth={t.length_growth:g} x the first iterations' "
            f"{base:.4g} tokens): check the completions (r3 samples) for repetition or padding the reward pays for; "
            "the overlong penalty (overlong_buffer_len) or seq-mean-token-mean loss aggregation curb it"
        )
        out.append(_at_or_above("length_blowup", metric, recent, t.length_growth * base, what))
    elif t.length_growth is not None:
        out.append(_unmeasured("length_blowup", metric))
    if t.truncated_frac_max is not None:
        what = (
            "responses hit max_new_tokens (health_truncated_frac_max): truncated answers are graded as they are; "
            "raise max_new_tokens, penalise overlong responses (overlong_buffer_len) or leave them out of the "
            "update (mask_truncated_completions)"
        )
        out.append(_at_or_above("truncation", "rollout/truncated_frac", recent, t.truncated_frac_max, what))
    return out


def trend_rise(values: Sequence[float]) -> float:
    """The rise of ``values`` (one per iteration) from first to last along their least-squares line."""
    y = np.asarray(values, dtype=np.float64)
    if len(y) < 2:
        return 0.0
    x = np.arange(len(y), dtype=np.float64)
    slope = float(np.polyfit(x, y, 1)[0])
    return slope * (len(y) - 1)


def check_reward_hacking(recent: Sequence[Metrics], t: HealthThresholds) -> Finding:
    """``reward_hacking``: over the last ``window`` iterations the reward trends up while the accuracy does not."""
    metric = "rollout/reward_mean"
    window = recent[-t.window :]
    rewards = [metric_value(m, metric) for m in window]
    accuracy = [metric_value(m, "rollout/accuracy") for m in window]
    if len(window) < t.window or not all(math.isfinite(v) for v in rewards + accuracy):
        return _unmeasured("reward_hacking", metric)
    rise, accuracy_rise, threshold = trend_rise(rewards), trend_rise(accuracy), float(t.reward_rise)
    fired = rise >= threshold and accuracy_rise <= t.accuracy_rise_max
    message = (
        f"reward up, accuracy flat: {metric} rose {rise:.4g} over the last {t.window} iterations (>= "
        f"health_reward_rise={threshold:g}) while rollout/accuracy rose {accuracy_rise:.4g} (<= "
        f"health_accuracy_rise_max={t.accuracy_rise_max:g}): the reward may be paid for form, not correctness (format "
        "hacking); read the completions (r3 samples) and the reward's parts"
    )
    return Finding("reward_hacking", metric, rise, threshold, fired, message=message if fired else "")


def check_nonfinite(recent: Sequence[Metrics]) -> Finding:
    """``nonfinite``: NaN or inf in the loss or the gradient norm, or a step skipped for a non-finite gradient.
    Unmeasured in an iteration that trained nothing."""
    current = recent[-1]
    if not any(key in current for key in (*NONFINITE_METRICS, SKIPPED_STEPS)):
        return _unmeasured("nonfinite", NONFINITE_METRICS[0])
    for key in NONFINITE_METRICS:
        value = metric_value(current, key)
        if key in current and not math.isfinite(value):
            return Finding("nonfinite", key, value, NAN, True, message=f"{key} is {value}")
    skipped = metric_value(current, SKIPPED_STEPS)
    if skipped > 0:
        message = f"{SKIPPED_STEPS} = {skipped:g}: optimizer steps with a NaN or inf gradient"
        return Finding("nonfinite", SKIPPED_STEPS, skipped, 0.0, True, message=message)
    return Finding("nonfinite", NONFINITE_METRICS[0], 0.0, 0.0, False)


def check_health(
    recent: Sequence[Metrics], baseline: Mapping[str, float] | None, t: HealthThresholds
) -> list[Finding]:
    """Every switched-on check on ``recent`` (per-iteration metric dicts, oldest first, the current one last; at
    most ``t.history`` are read) with ``baseline`` (:func:`baseline_means` of the run's first iterations; None while
    the current iteration is one of them), in :data:`CHECK_NAMES` order."""
    if not recent:
        return []
    out: list[Finding] = []
    if t.entropy_min is not None or t.entropy_drop is not None:
        out.append(check_entropy(recent, baseline, t))
    out += check_mismatch(recent, t)
    if t.zero_adv_frac_max is not None:
        out.append(check_zero_advantage(recent, t))
    out += check_length(recent, baseline, t)
    if t.reward_rise is not None:
        out.append(check_reward_hacking(recent, t))
    out.append(check_nonfinite(recent))
    return out


def update_episodes(
    active: frozenset[str], findings: Sequence[Finding]
) -> tuple[frozenset[str], list[Finding]]:
    """The checks firing now (``active`` updated by ``findings``) and the findings to warn about: those that fire
    and were not active. An unmeasured check keeps its state (its episode neither starts nor ends)."""
    now = set(active)
    new = []
    for f in findings:
        if f.fired and f.name not in now:
            new.append(f)
            now.add(f.name)
        elif f.measured and not f.fired:
            now.discard(f.name)
    return frozenset(now), new


def health_metrics(findings: Sequence[Finding]) -> dict[str, float]:
    """The ``health/*`` metrics of ``findings`` (without the prefix): ``<check>`` 1.0 or 0.0, ``<check>_value`` and
    ``<check>_threshold`` of a measured check (an unmeasured one has neither: absent, not NaN; a measured NaN, the
    ``nonfinite`` check's NaN loss, stays NaN), and ``firing``, the number of checks that fire."""
    out: dict[str, float] = {}
    for f in findings:
        out[f.name] = float(f.fired)
        if f.measured:
            out[f"{f.name}_value"] = f.value
            out[f"{f.name}_threshold"] = f.threshold
    out["firing"] = float(sum(f.fired for f in findings))
    return out


def nonfinite_stop_message(
    finding: Finding, iteration: int, checkpoint: tuple[str, int | None] | None, no_checkpoint: str
) -> str:
    """The message that stops training at ``iteration`` for a fired ``nonfinite`` finding: the metric and its
    value, that the weights hold no NaN (the step was skipped), and where to restart: ``checkpoint`` (path,
    iteration), the newest complete one saved before, or ``no_checkpoint`` (why there is none)."""
    if checkpoint is not None:
        path, at = checkpoint
        where = (
            f"the last good checkpoint is {path} (iteration {at if at is not None else '?'}): restore it "
            "(`r3 train --resume`, or Algorithm.restore) "
        )
    else:
        where = f"{no_checkpoint}; "
    return (
        f"training stopped at iteration {iteration}: NaN/inf in the loss or gradients ({finding.message}). The "
        f"optimizer skips a step whose gradient is not finite, so the weights hold no NaN; {where}and lower lr, "
        "set grad_clip, or check the rewards and advantages for NaN before going on (health_stop_on_nonfinite=False "
        "only warns)"
    )
