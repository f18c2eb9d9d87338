"""Starting the driver's helper actors (the reward server's workers, the distillation teacher's): placed outside a
Tune trial's placement group, and waited for at start with a message that says what they wait for.

A Tune trial reserves a placement group whose bundles hold the runners and learners; an actor created inside the
trial is captured by that group by default, and one asking for resources its bundles do not cover waits forever,
silently. These actors take their own resources from the cluster instead. Ray also queues an actor it cannot place
without a word: :func:`wait_until_started` logs every 30 s how many are still waiting, what each asks for and what
is free, and raises after ``timeout_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

logger = logging.getLogger(__name__)

#: How long a helper actor may take to start (placement and model loading) before the run stops.
START_TIMEOUT_S = 1800.0
#: How often the wait says what it waits for.
REPORT_EVERY_S = 30.0


def remote_outside_trial(cls: type, *, num_cpus: float, num_gpus: float) -> Any:
    """``cls`` as a Ray actor class asking for ``num_cpus`` / ``num_gpus``, scheduled outside any placement group
    (see the module docstring)."""
    return ray.remote(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None),
    )(cls)


def wait_until_started(
    refs: Sequence[Any], *, what: str, asks: str, timeout_s: float = START_TIMEOUT_S
) -> None:
    """Wait for ``refs`` (each actor's first call), re-raising an actor's start error; every 30 s a warning names
    ``what`` is waiting, what each asks for (``asks``: the settings behind it) and the free resources; a
    RuntimeError with the same words after ``timeout_s``."""
    start = time.perf_counter()
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=REPORT_EVERY_S)
        ray.get(done)
        waited = time.perf_counter() - start
        if not pending:
            return
        message = (
            f"{len(pending)} {what} not started after {waited:.0f} s: loading their models, or waiting for "
            f"{asks} each (free now: {ray.available_resources()})"
        )
        if waited >= timeout_s:
            raise RuntimeError(message)
        logger.warning(message)
