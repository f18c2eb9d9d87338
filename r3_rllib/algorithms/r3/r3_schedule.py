"""When R^3's parts switch on, and whether the replay history lasts until a query comes back (pure; no Ray).

The data schedule this computes (``envs/data.py``, ``QueryOrder`` and ``Shard``): every epoch one permutation of the
``dataset_size`` queries is cut into steps of ``queries_per_iteration`` (B) queries, one step per training
iteration, shared out over the EnvRunners. So an epoch lasts ``T = dataset_size // B`` iterations and the last
``dataset_size % B`` queries of each epoch's permutation sit out that epoch.

When a part switches on. ``training_step`` decides the switches at its start from the dataset epoch the previous
rollout reported: the epoch a runner reports counts *completed* passes, and it becomes ``e + 1`` with the rollout
that serves the last step of epoch ``e``. In iteration ``j`` (1-based) the previous rollouts served ``j - 1`` steps,
so a part with start epoch ``s`` is active from iteration ``s * T + 1`` on: the first iteration whose batch comes
from epoch ``s``. The same holds with ``overlap_generation`` (the rollout trained in iteration ``j`` is requested in
iteration ``j - 1`` after ``j - 1`` steps were gathered, with the reflection settings of that moment), and for
reflection, whose prompts are made with the rollout.

Revisits. A query served in step ``b`` of epoch ``e`` comes back in step ``b'`` of epoch ``e + 1`` (both uniform over
the ``T`` steps when it is not skipped in either epoch): ``T + b' - b`` iterations later, between 1 and ``2T - 1``
(``T`` on average), one policy update per iteration (fewer when an iteration has nothing to train on). Its previous
samples are still in the replay buffer when that lag (plus one with ``overlap_generation``, whose samples are one
update older) is at most ``replay_max_age``. The fraction of revisits for which that holds follows from the
triangular distribution of ``b' - b``: ``P(b' - b = d) = (T - |d|) / T**2``.

With ``dynamic_sampling`` every extra sampling round takes another step of data, so epochs end earlier than computed
here: the iterations are then upper bounds (and replay is rejected with dynamic sampling, see ``R3Config``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from r3_rllib.algorithms.r3.iteration_settings import max_staleness_of

logger = logging.getLogger(__name__)

PARTS = ("replay", "reflection", "ranking")

# Default history: a query's samples stay replayable for this many epochs of updates (the previous visit of a
# query is at most 2T - 1 updates back, so two epochs always keep it).
DEFAULT_MAX_AGE_EPOCHS = 2


@dataclass(frozen=True)
class PartSchedule:
    name: str
    enabled: bool
    start_epoch: int
    first_iteration: int | None  # 1-based training iteration in which the part is first active; None: off


@dataclass(frozen=True)
class Schedule:
    """What :func:`compute_schedule` derives; ``errors`` make a run pointless, ``warnings`` weaken it."""

    dataset_size: int
    queries_per_iteration: int
    iterations_per_epoch: int  # T
    skipped_per_epoch: int  # queries of each epoch's permutation that no runner serves that epoch
    stop_iteration: int | None
    parts: dict[str, PartSchedule]
    revisit_mean: int  # iterations (= updates) between two visits of a query, on average
    revisit_max: int  # the longest such gap, in policy versions (overlap_generation adds one)
    max_age: int | None  # replay_max_age in effect (the derived default when the config leaves it None)
    revisit_kept_fraction: float  # revisits whose previous visit is still within max_age
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def epoch_trained_in(self, iteration: int) -> int:
        """The data epoch of the batch trained in (1-based) ``iteration`` (without dynamic sampling)."""
        return (iteration - 1) // self.iterations_per_epoch

    def reported_epoch(self, iteration: int) -> int:
        """``rollout/dataset_epoch`` as logged in ``iteration``: completed epochs after that iteration's rollout."""
        return iteration // self.iterations_per_epoch

    def summary(self) -> str:
        parts = ", ".join(
            f"{p.name} from iteration {p.first_iteration} (epoch {p.start_epoch})"
            for p in self.parts.values()
            if p.enabled
        )
        text = (
            f"{self.dataset_size} queries / {self.queries_per_iteration} per iteration: "
            f"{self.iterations_per_epoch} iterations per epoch ({self.skipped_per_epoch} queries sit out each epoch)"
        )
        if self.stop_iteration is not None:
            text += f", stop at iteration {self.stop_iteration} ({self.stop_iteration / self.iterations_per_epoch:.2f} epochs)"
        if parts:
            text += f"; {parts}"
            text += (
                f"; a query comes back every {self.revisit_mean} updates on average (at most {self.revisit_max}), "
                f"replay_max_age {self.max_age}: {self.revisit_kept_fraction:.1%} of revisits find the "
                f"previous visit's samples"
            )
        return text


def iterations_per_epoch(dataset_size: int, queries_per_iteration: int) -> int:
    """``T``: steps of ``queries_per_iteration`` queries in one epoch (drop-last)."""
    _check_sizes(dataset_size, queries_per_iteration)
    return dataset_size // queries_per_iteration


def default_max_age(dataset_size: int, queries_per_iteration: int) -> int:
    """The ``replay_max_age`` used when the config leaves it None: two epochs of updates."""
    return DEFAULT_MAX_AGE_EPOCHS * iterations_per_epoch(dataset_size, queries_per_iteration)


def revisit_kept_fraction(steps_per_epoch: int, max_age: int | None, *, extra_lag: int = 0) -> float:
    """Fraction of revisits (next epoch, uniform step positions) whose lag ``T + d + extra_lag`` is within
    ``max_age``; ``None`` keeps everything."""
    if max_age is None:
        return 1.0
    t = steps_per_epoch
    kept = 0
    for d in range(-(t - 1), t):
        if t + d + extra_lag <= max_age:
            kept += t - abs(d)
    return kept / (t * t)


def _part_schedules(
    settings: dict[str, tuple[bool, int]],
    t: int,
    dataset_size: int,
    queries_per_iteration: int,
    stop_iteration: int | None,
) -> tuple[dict[str, PartSchedule], list[str]]:
    """Each part's first iteration (``name -> (enabled, start epoch)``, ``t`` iterations per epoch), and a warning
    for each enabled part that would switch on only after ``stop_iteration``."""
    parts: dict[str, PartSchedule] = {}
    warnings: list[str] = []
    for name, (enabled, start) in settings.items():
        if start < 0:
            raise ValueError(f"{name}_start_epoch must be >= 0, got {start}")
        first = start * t + 1 if enabled else None
        parts[name] = PartSchedule(name, bool(enabled), int(start), first)
        sizes = f"({dataset_size} queries / {queries_per_iteration} per iteration = {t} iterations per epoch)"
        if enabled and stop_iteration is not None and first > stop_iteration:
            warnings.append(
                f"{name} never switches on: {name}_start_epoch={start} begins at iteration {first} {sizes}, "
                f"after the stop at iteration {stop_iteration}"
            )
    return parts, warnings


def _check_history(
    max_age: int,
    max_age_derived: bool,
    t: int,
    extra_lag: int,
    kept: float,
    errors: list[str],
    warnings: list[str],
) -> None:
    """With replay or reflection on: an error when no revisit can find its past samples within ``max_age``,
    a warning when only some can (``kept`` of them)."""
    revisit_max = 2 * t - 1 + extra_lag
    if kept == 0.0:
        errors.append(
            f"replay_max_age={max_age} is shorter than the shortest gap between two visits of a "
            f"query ({1 + extra_lag} update(s)): replay and reflection can never use a past sample"
        )
    elif max_age < revisit_max:
        source = "the derived default" if max_age_derived else f"replay_max_age={max_age}"
        warnings.append(
            f"{source} is shorter than the longest gap between two visits of a query ({revisit_max} updates; "
            f"{t} on average): only {kept:.1%} of revisits find the previous visit's samples. Leave "
            f"replay_max_age unset (None) for two epochs of history ({DEFAULT_MAX_AGE_EPOCHS * t} updates)"
        )


def compute_schedule(
    *,
    dataset_size: int,
    queries_per_iteration: int,
    replay: bool,
    replay_start_epoch: int,
    reflection: bool,
    reflection_start_epoch: int,
    ranking: bool,
    ranking_start_epoch: int,
    replay_max_age: int | None,
    max_age_derived: bool = False,
    dynamic_sampling: bool = False,
    overlap_generation: bool = False,
    generation_lag: int | None = None,
    stop_iteration: int | None = None,
) -> Schedule:
    """The R^3 schedule of a run (see the module docstring for the rules).

    ``generation_lag``: the updates between a rollout's weights and its training (max_staleness; None: 1 with
    ``overlap_generation``, else 0). ``replay_max_age`` is the bound in effect (pass :func:`default_max_age` with
    ``max_age_derived=True`` when the config leaves it None). ``stop_iteration``: the last training iteration, when known.
    """
    t = iterations_per_epoch(dataset_size, queries_per_iteration)
    if stop_iteration is not None and stop_iteration < 1:
        raise ValueError(f"stop_iteration must be >= 1 or None, got {stop_iteration}")
    if replay_max_age is not None and replay_max_age < 0:
        raise ValueError(f"replay_max_age must be >= 0 or None, got {replay_max_age}")
    settings = {
        "replay": (replay, replay_start_epoch),
        "reflection": (reflection, reflection_start_epoch),
        "ranking": (ranking, ranking_start_epoch),
    }
    parts, warnings = _part_schedules(settings, t, dataset_size, queries_per_iteration, stop_iteration)
    # Updates between the weights a rollout is generated with and the update it trains: max_staleness (overlap: 1).
    extra_lag = generation_lag if generation_lag is not None else (1 if overlap_generation else 0)
    revisit_max = 2 * t - 1 + extra_lag
    kept = revisit_kept_fraction(t, replay_max_age, extra_lag=extra_lag)
    errors: list[str] = []
    if replay and dynamic_sampling:
        errors.append(
            "replay with dynamic_sampling: dynamic sampling drops the all-equal groups that replay would mix "
            "past samples into, so replay would never act; turn one of them off"
        )
    if (replay or reflection) and replay_max_age is not None:
        _check_history(replay_max_age, max_age_derived, t, extra_lag, kept, errors, warnings)
    late_parts = [p for p in parts.values() if p.enabled and p.start_epoch > 0]
    if dynamic_sampling and late_parts:
        warnings.append(
            "dynamic_sampling draws one more step of data per extra round: epochs end earlier than "
            f"{t} iterations, and the parts switch on no later than the iterations computed here"
        )
    return Schedule(
        dataset_size=dataset_size,
        queries_per_iteration=queries_per_iteration,
        iterations_per_epoch=t,
        skipped_per_epoch=dataset_size - t * queries_per_iteration,
        stop_iteration=stop_iteration,
        parts=parts,
        revisit_mean=t,
        revisit_max=revisit_max,
        max_age=replay_max_age,
        revisit_kept_fraction=kept,
        warnings=warnings,
        errors=errors,
    )


def resolved_max_age(config: Any, dataset_size: int) -> int | None:
    """``config.replay_max_age``, or two epochs of updates when it is None."""
    if config.replay_max_age is not None:
        return int(config.replay_max_age)
    return default_max_age(dataset_size, int(config.queries_per_iteration))


def schedule_for_config(config: Any, dataset_size: int, stop_iteration: int | None = None) -> Schedule:
    """:func:`compute_schedule` with the values of an ``R3Config`` (read by attribute name)."""
    return compute_schedule(
        dataset_size=dataset_size,
        queries_per_iteration=int(config.queries_per_iteration),
        replay=bool(config.replay),
        replay_start_epoch=int(config.replay_start_epoch),
        reflection=bool(config.reflection),
        reflection_start_epoch=int(config.reflection_start_epoch),
        ranking=bool(config.ranking),
        ranking_start_epoch=int(config.ranking_start_epoch),
        replay_max_age=resolved_max_age(config, dataset_size),
        max_age_derived=config.replay_max_age is None,
        dynamic_sampling=bool(config.dynamic_sampling),
        overlap_generation=bool(config.overlap_generation),
        generation_lag=max_staleness_of(config),
        stop_iteration=stop_iteration,
    )


def late_start_warnings(schedule: Schedule | None) -> list[str]:
    """With no stop known (the Python API: ``build_algo()``, then ``train()`` in a loop), one warning per enabled
    part that switches on only after iteration 1, naming that iteration: a shorter loop is silently plain GRPO.
    Empty for a schedule with a stop (its own warnings cover that) or without a finite data size (None)."""
    if schedule is None or schedule.stop_iteration is not None:
        return []
    sizes = (
        f"{schedule.dataset_size} queries / {schedule.queries_per_iteration} per iteration = "
        f"{schedule.iterations_per_epoch} iterations per epoch"
    )
    return [
        f"{p.name} switches on only at iteration {p.first_iteration} ({p.name}_start_epoch={p.start_epoch}; {sizes}): "
        f"a run of fewer iterations trains without it; set {p.name}_start_epoch=0 or use fewer queries"
        for p in schedule.parts.values()
        if p.enabled and p.first_iteration is not None and p.first_iteration > 1
    ]


def log_late_starts(schedule: Schedule | None) -> None:
    """Log :func:`late_start_warnings` (called once at the algorithm's setup)."""
    for warning in late_start_warnings(schedule):
        logger.warning("R^3 schedule: %s", warning)


def _check_sizes(dataset_size: int, queries_per_iteration: int) -> None:
    if queries_per_iteration < 1:
        raise ValueError(f"queries_per_iteration must be >= 1, got {queries_per_iteration}")
    if dataset_size < queries_per_iteration:
        raise ValueError(
            f"a data set of {dataset_size} queries is smaller than one iteration's {queries_per_iteration} "
            f"queries: no epoch can be formed"
        )
