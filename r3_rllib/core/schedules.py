"""Values that follow a schedule over the run (pure, no Ray): RLlib's ``[[timestep, value], ...]`` form.

RLlib lets ``lr`` be a number or a piecewise-linear schedule over the env steps sampled so far
(``num_env_steps_sampled_lifetime``): ``[[0, 1e-6], [40_000, 1e-6], [80_000, 0.0]]`` holds 1e-6 for 40k samples,
then decays linearly to 0 over the next 40k, and stays at the last value after the last point. In an R3 run one env
step is one trained sample (a response to one prompt, or one step of a multi-step episode), so a schedule written for
RLlib reads the same here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: A fixed value, or ``[[timestep, value], ...]`` with the first timestep 0 and timesteps nondecreasing.
ValueOrSchedule = float | Sequence[Sequence[float]]


def scheduled_value(value_or_schedule: ValueOrSchedule, timestep: float) -> float:
    """The value at ``timestep``: a fixed value as it is; a schedule interpolated linearly between its points,
    its first value before the first point and its last value after the last (RLlib's ``Scheduler``)."""
    if isinstance(value_or_schedule, int | float):
        return float(value_or_schedule)
    steps = [float(point[0]) for point in value_or_schedule]
    values = [float(point[1]) for point in value_or_schedule]
    return float(np.interp(float(timestep), steps, values))


def schedule_error(name: str, value_or_schedule: object) -> str | None:
    """What is wrong with a schedule given for setting ``name`` (None: a fixed value, or a usable schedule): each
    point a ``[timestep, value]`` pair of finite numbers, timesteps from 0 and nondecreasing, values >= 0 (a value of
    0 ends a decay; the fixed value's own rule asks for > 0)."""
    if isinstance(value_or_schedule, int | float) or value_or_schedule is None:
        return None
    example = f"e.g. {name}=[[0, 1e-6], [100000, 0.0]]"
    points = list(value_or_schedule)  # type: ignore[call-overload]
    if len(points) < 2:
        return f"{name} as a schedule needs at least two [timestep, value] points ({example}), got {points!r}"
    for point in points:
        ok = isinstance(point, Sequence) and not isinstance(point, str) and len(point) == 2
        if not ok or not all(_finite_number(x) for x in point):
            return f"{name} schedule points must be [timestep, value] pairs of finite numbers ({example}), got {point!r}"
    steps = [float(p[0]) for p in points]
    if steps[0] != 0:
        return (
            f"{name} schedule must start at timestep 0 (its first value is the initial one), got {steps[0]:g}"
        )
    if any(b < a for a, b in zip(steps[:-1], steps[1:], strict=True)):
        return f"{name} schedule timesteps must be nondecreasing, got {steps}"
    if any(float(p[1]) < 0 for p in points):
        return f"{name} schedule values must be >= 0, got {[float(p[1]) for p in points]}"
    return None


def _finite_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x))


#: The shapes of the learning rate over the run's updates (:func:`lr_factor`): verl's actor.optim.lr_scheduler_type
#: ('constant', 'cosine') and transformers' linear decay (TRL's default lr_scheduler_type).
LR_SCHEDULER_TYPES: tuple[str, ...] = ("constant", "cosine", "linear")


def warmup_updates(
    lr_warmup_steps: int | None, lr_warmup_steps_ratio: float, total_updates: int | None
) -> int:
    """The warm-up's length in updates: ``lr_warmup_steps`` when given, else ``int(lr_warmup_steps_ratio *
    total_updates)`` (verl's rule: its lr_warmup_steps -1 reads the ratio of total_training_steps); 0 without
    either."""
    if lr_warmup_steps is not None:
        return int(lr_warmup_steps)
    if lr_warmup_steps_ratio > 0 and total_updates is not None:
        return int(lr_warmup_steps_ratio * total_updates)
    return 0


def lr_factor(
    update: int,
    *,
    scheduler_type: str = "constant",
    warmup: int = 0,
    total_updates: int | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """The learning rate of update ``update`` (0 for the run's first) as a share of ``lr``, as verl's
    ``get_constant_schedule_with_warmup`` / ``get_cosine_schedule_with_warmup`` give it (half a cosine cycle):

    - during the warm-up, ``update / warmup`` (so the first update of a warm-up runs at 0, as verl's and
      transformers' schedulers step after each update);
    - then 'constant': 1; 'cosine': ``m + (1 - m) (1 + cos(pi p)) / 2``; 'linear': ``m + (1 - m) (1 - p)``, with
      ``p = (update - warmup) / (total_updates - warmup)`` and ``m = min_lr_ratio``.

    Past ``total_updates`` the rate stays at ``m`` (verl's cosine would climb again past its horizon; transformers'
    linear stops at 0 = ``m``'s default)."""
    if scheduler_type not in LR_SCHEDULER_TYPES:
        raise ValueError(f"scheduler_type must be one of {list(LR_SCHEDULER_TYPES)}, got {scheduler_type!r}")
    if update < warmup:
        return update / max(1, warmup)
    if scheduler_type == "constant":
        return 1.0
    if total_updates is None:
        raise ValueError(
            f"lr_scheduler_type {scheduler_type!r} needs the run's number of updates (lr_total_steps)"
        )
    progress = min(1.0, (update - warmup) / max(1, total_updates - warmup))
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if scheduler_type == "cosine" else 1.0 - progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def shaped_lr(lr: float, update: int, settings: Any) -> float:
    """``lr`` times :func:`lr_factor` at ``update`` with the ``settings``' lr_scheduler_type, warm-up
    (lr_warmup_steps, lr_warmup_steps_ratio), lr_total_steps and min_lr_ratio (an R3Settings or R3Config)."""
    total = settings.lr_total_steps
    return lr * lr_factor(
        update,
        scheduler_type=settings.lr_scheduler_type,
        warmup=warmup_updates(settings.lr_warmup_steps, settings.lr_warmup_steps_ratio, total),
        total_updates=total,
        min_lr_ratio=settings.min_lr_ratio,
    )


def policy_updates(iterations: int, critic_warmup: int = 0) -> int:
    """The policy's updates in a run's first ``iterations`` iterations: every iteration's, but those of PPO's
    critic warm-up (critic_warmup N >= 2 leaves the first N - 1 to the critic: verl's actor, and its scheduler,
    start at step N)."""
    return max(0, iterations - max(0, critic_warmup - 1))
