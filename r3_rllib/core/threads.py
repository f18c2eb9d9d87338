"""How many CPU threads each phase of an iteration uses (pure, no Ray).

Ray reserves CPUs per actor (``num_cpus_per_env_runner``, ``num_cpus_per_learner``), but a reservation says where
an actor may be placed, not how many cores are idle while it works. The synchronous loop alternates its phases: the
runners wait while the learners update and the learners wait while the runners generate, so each phase can use the
whole machine. With generation overlapped with training (``max_staleness >= 1``) both phases run at once and split
the cores: the runners keep what they reserved and the learners get the rest.

A plan is an upper bound. Cores another job keeps busy are not free: OpenMP threads spin at every barrier waiting
for a thread the OS has descheduled, so on two cores shared with one busy process, two threads made our update 5-7x
slower than one (BENCHMARKS.md section 28). Each phase therefore takes, when it starts, no more threads than there
are cores with nothing runnable on them (:func:`threads_now`).

Following the load is safe for seeded runs because the numbers do not follow the thread count: matrix products and
reductions along a dimension are thread-invariant on CPU, and whole-tensor sums go through
:func:`r3_rllib.core.reductions.invariant_sum` (tests/unit/algorithms/test_thread_invariance.py: a learner's
two-epoch update, bit-identical at 1, 2 and 3 threads). The HF engine's sampled log-probs are not (one ulp apart
between 1 and 2 threads), so under ``cpu_threads='auto'`` the runners keep their reservation.
"""

from __future__ import annotations

import os
import time
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


def threads_now(planned: int, reserved: int, cores: int, runnable: int | None) -> int:
    """The threads a phase starts with: ``planned``, but no more than the cores that nothing else is running on
    (``runnable``: the tasks runnable on the machine now, this one included; None when unknown: the reservation),
    and never fewer than ``reserved``."""
    if runnable is None:
        return max(1, min(planned, reserved))
    free = cores - max(0, runnable - 1)
    return max(1, min(planned, max(reserved, free)))


def phase_start_threads(planned: int, reserved: int) -> int:
    """The threads of a phase starting now on this machine: ``planned`` when it is within the reservation, else
    :func:`threads_now` from this moment's runnable tasks."""
    if planned <= reserved:
        return max(1, planned)
    return threads_now(planned, reserved, available_cores(), runnable_tasks())


def runnable_tasks(samples: int = 3, gap_s: float = 0.002) -> int | None:
    """Tasks runnable on the machine now (the fourth field of Linux's ``/proc/loadavg``, the caller included): the
    least of ``samples`` reads ``gap_s`` apart, so a task that woke for a moment does not count. None elsewhere."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(gap_s)
    return min(counts)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
