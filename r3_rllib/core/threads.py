"""How many CPU threads each phase of an iteration uses (pure, no Ray).

Ray reserves CPUs per actor (``num_cpus_per_env_runner``, ``num_cpus_per_learner``), but a reservation says where
an actor may be placed, not how many cores are idle while it works. The synchronous loop alternates its phases: the
runners wait while the learners update and the learners wait while the runners generate, so each phase can use the
whole machine. With generation overlapped with training (``max_staleness >= 1``) both phases run at once and split
the cores: the runners keep what they reserved and the learners get the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseThreads:
    """Torch intra-op threads of each EnvRunner while it generates and of each learner while it updates."""

    runner: int
    learner: int


def phase_threads(
    *,
    cores: int,
    overlapped: bool,
    num_env_runners: int,
    runner_cpus: float,
    num_learners: int,
    learner_cpus: float | None,
) -> PhaseThreads:
    """The threads of each phase on a machine of ``cores`` cores (see the module docstring).

    ``num_learners`` 0 means one learner in the driver process. ``learner_cpus`` is the learner's reservation, None
    for RLlib's ``"auto"``. Synchronous (``overlapped`` False): every runner gets its share of the cores (at least
    its reservation) while it generates, and every learner its share while it updates. Overlapped: the runners keep
    their reservations and the learners share what is left, at least one thread each (or their reservation).
    """
    cores = max(1, int(cores))
    runners = max(1, int(num_env_runners))
    learners = max(1, int(num_learners))
    reserved_runner = max(1, int(runner_cpus or 1))
    reserved_learner = max(1, int(learner_cpus or 1))
    if not overlapped:
        return PhaseThreads(
            runner=max(reserved_runner, cores // runners), learner=max(reserved_learner, cores // learners)
        )
    left = cores - runners * reserved_runner
    return PhaseThreads(runner=reserved_runner, learner=max(reserved_learner, left // learners))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
