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
