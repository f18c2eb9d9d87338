"""How many CPU threads each phase of an iteration uses (pure, no Ray).

Ray reserves CPUs per actor (``num_cpus_per_env_runner``, ``num_cpus_per_learner``), but a reservation says where
an actor may be placed, not how many cores are idle while it works. The synchronous loop alternates its phases: the
runners wait while the learners update and the learners wait while the runners generate, so each phase can use the
whole machine. With generation overlapped with training (``max_staleness >= 1``) both phases run at once and split
the cores: the runners keep what they reserved and the learners start on the rest, taking the runners' cores too
while these wait for the next weights (up to the synchronous plan: :class:`FreeCoreFollower`).

A plan is an upper bound. Cores another job keeps busy are not free: OpenMP threads spin at every barrier waiting
for a thread the OS has descheduled, so on two cores shared with one busy process, two threads made our update 5-7x
slower than one (BENCHMARKS.md section 28). Each phase therefore takes, when it starts, no more threads than there
are cores with nothing runnable on them (:func:`threads_now`), and a learner's update follows the cores other
processes leave free while it runs (:class:`FreeCoreFollower`, polled from hooks on the policy).

Following the load is safe for seeded runs because the numbers do not follow the thread count: matrix products and
reductions along a dimension are thread-invariant on CPU, and whole-tensor sums go through
:func:`r3_rllib.core.reductions.invariant_sum` (tests/unit/algorithms/test_thread_invariance.py: a learner's
two-epoch update, bit-identical at 1, 2 and 3 threads, in fp32 and bf16, and with its thread count changing inside
its forwards and backwards). The HF engine's sampled log-probs are not (one ulp apart between 1 and 2 threads), so
under ``cpu_threads='auto'`` its runners keep their reservation; an engine whose samples are the same bits at any
count (``thread_invariant_sampling``: vLLM's) has its runners take their share of the cores in the synchronous
loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field


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


def machine_busy_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU-seconds the whole machine has spent busy since boot (all processes, all cores): Linux ``/proc/stat``'s
    user + nice + system + irq + softirq + steal; None where it cannot be read."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class BusyElsewhere:
    """Cores other processes kept busy since the previous call: the machine's busy CPU time (``/proc/stat``: user,
    nice, system, irq, softirq, steal) less this process's (``os.times``), over the wall time between the calls.
    An average over the interval, so a task that ran for a moment counts for its moment; this process's own
    OpenMP workers, spinning or not, are its own time. None on the first call and where ``/proc/stat`` is absent."""

    def __init__(
        self,
        stat: str = "/proc/stat",
        own_seconds: Callable[[], float] = lambda: sum(os.times()[:2]),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stat, self._own_seconds, self._clock = stat, own_seconds, clock
        self._last: tuple[float, float, float] | None = None

    def __call__(self) -> float | None:
        machine = machine_busy_seconds(self._stat)
        if machine is None:
            return None
        now = (self._clock(), machine, self._own_seconds())
        last, self._last = self._last, now
        if last is None or now[0] <= last[0]:
            return None
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0]))


@dataclass
class FreeCoreFollower:
    """A phase's threads, re-planned while it runs: :meth:`poll` (called often, e.g. from module hooks) reads the
    cores busy elsewhere over the last ``interval_s`` (:class:`BusyElsewhere`) and moves towards
    :func:`threads_now`'s count, both ways at the reading that finds it (down: OpenMP threads waiting at barriers
    on a busy core make every operation slower; up: each interval on fewer threads than the free cores leaves a core
    idle). A core counts as busy when at least half of it was: a reading averages over its interval, so a job that
    ran for a moment does not move the count.

    Why: under overlap the runners' generation and the update start together, so the update starts on the cores the
    runners left; when the generation ends first the update goes on alone, and a count fixed at its start leaves a
    core idle for the rest of it (measured: BENCHMARKS.md section 34). The other way, a job that starts on a core
    mid-update makes the update give that core back. Changing the count mid-update changes no number (module
    docstring).
    """

    planned: int
    reserved: int
    current: int
    set_threads: Callable[[int], None]
    interval_s: float = 0.1
    read_busy: Callable[[], float | None] = field(default_factory=BusyElsewhere)
    clock: Callable[[], float] = time.monotonic
    changes: int = 0
    _next_read: float = 0.0
    _since: float = 0.0
    _thread_seconds: float = 0.0
    _started: float = 0.0

    def __post_init__(self) -> None:
        self._started = self._since = self.clock()
        self._next_read = self._started + self.interval_s
        if self.follows:
            self.read_busy()  # the reading that the first interval is measured from

    @property
    def follows(self) -> bool:
        """Whether there is anything to follow: a plan above the reservation."""
        return self.planned > self.reserved

    def poll(self) -> None:
        now = self.clock()
        if now < self._next_read:
            return
        self._next_read = now + self.interval_s
        busy = self.read_busy()
        if busy is None:
            return
        want = threads_now(self.planned, self.reserved, available_cores(), 1 + int(busy + 0.5))
        if want == self.current:
            return
        self._thread_seconds += self.current * (now - self._since)
        self._since, self.current = now, want
        self.changes += 1
        self.set_threads(want)

    def mean_threads(self) -> float:
        """The threads the phase ran on so far, averaged over its time."""
        now = self.clock()
        elapsed = now - self._started
        if elapsed <= 0:
            return float(self.current)
        return (self._thread_seconds + self.current * (now - self._since)) / elapsed


def runnable_tasks(samples: int = 3, gap_s: float = 0.002, loadavg: str = "/proc/loadavg") -> int | None:
    """Tasks runnable on the machine now, this process counted once (the caller): the fourth field of Linux's
    ``/proc/loadavg`` less this process's other running threads, the least of ``samples`` reads ``gap_s`` apart (a
    task that woke for a moment does not count). None elsewhere.

    Why this process's threads are left out: its own OpenMP workers keep spinning for a few milliseconds after each
    parallel region, and ``/proc/loadavg`` counts them like another job's. Counted, they made our learner start
    its update on one thread right after its own torch work on two idle cores (BENCHMARKS.md section 34).
    """
    counts = []
    for i in range(samples):
        try:
            with open(loadavg) as f:
                machine = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        # The caller is one of the machine's runnable tasks: with none besides it, its own threads are not read
        # (a read of every thread's stat file, ~1 ms in a Ray driver).
        counts.append(1 if machine <= 1 else max(1, machine - own_running_threads() + 1))
        if counts[-1] == 1:
            break  # nothing else runnable: no later reading can make the least smaller (one read, not three)
        if i + 1 < samples:
            time.sleep(gap_s)
    return min(counts)


def own_running_threads(task_dir: str = "/proc/self/task") -> int:
    """This process's threads that are running or runnable (state ``R`` in ``task_dir/<tid>/stat``), the caller
    included; 1 where they cannot be read."""
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return 1
    running = 0
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "stat")) as f:
                # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")".
                running += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue  # the thread ended while we read
    return max(1, running)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
