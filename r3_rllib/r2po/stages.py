"""R^2PO's two-stage schedule as a pure function of the training iteration (no torch, no Ray).

R^2PO alternates two stages, each a run of consecutive training iterations:

- stage ``"A"`` trains only the rollout head (base frozen) on the rarity reward;
- stage ``"B"`` trains only the base policy (head frozen) on the task reward, still sampling with the head on.

One *cycle* is ``head_iters`` iterations of A and ``base_iters`` of B, in the order given by ``first`` (the
reference code starts with A: a fresh near-zero head first learns to explore, then the base learns from its
samples). Since the stage depends on nothing but the iteration index, a run restored from a checkpoint at iteration
``k`` resumes in the stage it left, at the same position inside it.
"""

from __future__ import annotations

import enum
import numbers
from typing import NamedTuple


class Stage(enum.StrEnum):
    """An R^2PO stage. A ``str`` subclass: ``Stage.HEAD == "A"``, so code and configs that name stages by their
    letters keep working, and a stage formats as its letter in metric keys."""

    HEAD = "A"
    """Trains the rollout head (base frozen)."""
    BASE = "B"
    """Trains the base policy (head frozen)."""


#: Stage that trains the rollout head (base frozen).
HEAD_STAGE = Stage.HEAD
#: Stage that trains the base policy (head frozen).
BASE_STAGE = Stage.BASE
STAGES: tuple[Stage, Stage] = (HEAD_STAGE, BASE_STAGE)
#: Values of the config's ``rollout_head_first_stage`` -> the stage a cycle starts with.
FIRST_STAGES: dict[str, Stage] = {stage.name.lower(): stage for stage in Stage}


class StagePosition(NamedTuple):
    """Where an iteration falls in the schedule."""

    stage: Stage
    #: 0-based index of the cycle (one run of A and one of B) the iteration belongs to.
    cycle: int
    #: 0-based index of the iteration inside its stage's run (0 on the first iteration of a run).
    step_in_stage: int


def _check_count(name: str, value: object) -> int:
    # bool is an int subclass; True as a length is almost certainly a config mistake.
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def stage_position(
    iteration: int, *, head_iters: int, base_iters: int, first: Stage = HEAD_STAGE
) -> StagePosition:
    """Stage active at 0-based ``iteration``, with its cycle and its position inside the stage's run.

    ``head_iters`` / ``base_iters``: length of each run of stage A / B. One of them may be 0 (that stage never runs:
    ``base_iters=0`` trains only the head, ``head_iters=0`` only the base with a fixed head); not both.
    """
    iteration = _check_count("iteration", iteration)
    head_iters = _check_count("head_iters", head_iters)
    base_iters = _check_count("base_iters", base_iters)
    if first not in STAGES:
        raise ValueError(f"first must be one of {tuple(map(str, STAGES))}, got {first!r}")
    first = Stage(first)
    if head_iters + base_iters == 0:
        raise ValueError("head_iters and base_iters cannot both be 0 (no stage would ever run)")
    second: Stage = BASE_STAGE if first == HEAD_STAGE else HEAD_STAGE
    first_len = head_iters if first == HEAD_STAGE else base_iters
    cycle, pos = divmod(iteration, head_iters + base_iters)
    if pos < first_len:
        return StagePosition(first, cycle, pos)
    return StagePosition(second, cycle, pos - first_len)


def active_stage(iteration: int, *, head_iters: int, base_iters: int, first: Stage = HEAD_STAGE) -> Stage:
    """``"A"`` (train the head) or ``"B"`` (train the base) at 0-based ``iteration``; see :func:`stage_position`."""
    return stage_position(iteration, head_iters=head_iters, base_iters=base_iters, first=first).stage


def base_iterations(iterations: int, *, head_iters: int, base_iters: int, first: Stage = HEAD_STAGE) -> int:
    """How many of the first ``iterations`` iterations run stage B (train the base): ``base_iters`` per whole cycle,
    and the stage-B part of the cycle under way."""
    iterations = _check_count("iterations", iterations)
    cycle_len = _check_count("head_iters", head_iters) + _check_count("base_iters", base_iters)
    if cycle_len == 0:
        raise ValueError("head_iters and base_iters cannot both be 0 (no stage would ever run)")
    cycle, pos = divmod(iterations, cycle_len)
    before_base = head_iters if Stage(first) == HEAD_STAGE else 0
    return cycle * base_iters + min(max(0, pos - before_base), base_iters)
