"""`StreamingCoordinator`: rollouts that never wait for the learner, bounded by ``max_staleness`` = k >= 2.

(k = 0 and 1 are the synchronous and one-step-overlap loops of :class:`RolloutCoordinator`, unchanged.)

- **Outstanding requests.** Every healthy runner keeps up to k rollout requests outstanding: in flight on it, or
  delivered and waiting in the driver's queue. A runner with k outstanding gets no new request: it pauses instead
  of running further ahead of the learner (the bound at sampling). Requests are RLlib async requests, one runner's
  share of ``queries_per_iteration`` each; a runner runs its calls in order, so each request generates with the
  weights of the last sync queued before it.
- **Training as soon as enough groups are ready.** An iteration takes delivered requests, oldest first (request
  number, then worker id), until it holds ``queries_per_iteration`` fresh groups; it waits (the learner idles) only
  while fewer are delivered, or while a request in flight would be too old by the next iteration (issued k versions
  ago: a slow runner's request is trained now rather than dropped later). A request's groups stay together (GRPO needs a query's G responses at once, R^3's
  reflection groups come with their queries). Which runner delivers first decides the batch, so runs are not
  reproducible sample for sample.
- **The bound at training.** A group whose samples were generated more than k policy versions before the update
  that trains them is dropped and counted (``rollout/stale_groups_dropped``): after a slow or restarted runner.
- **Then the top-up.** After taking its batch the iteration tops every runner up to k, with the reflection settings
  after this batch's data epoch; the learner then trains and the new weights are queued behind those requests.
- **Checkpoints** drain every request in flight into the queue, which is saved whole and restored: each runner's
  saved state is the one after its last delivered request, so after a restore no sample is trained twice or lost.
- **A runner that crashes** loses only its requests in flight (unfinished groups); restarted, it resumes at the
  data position of its last delivered request, so those queries are drawn again. With every runner down, the
  iteration waits (bounded) for Ray to restart them and asks again; a runner whose rollout raised stops the run
  with its ``RunnerError`` (runner_faults.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from r3_rllib.algorithms.r3.checkpoint import AlgorithmState
from r3_rllib.algorithms.r3.coordinator import (
    LAG_METRICS,
    MAX_LOST_ROLLOUTS,
    ROLLOUT_TAG,
    RolloutCoordinator,
    query_shares,
)
from r3_rllib.algorithms.r3.rollout_types import Rollout, RolloutResult, merge_results
from r3_rllib.algorithms.r3.runner_faults import raise_runner_errors, sample_or_error, wait_for_runners
from r3_rllib.core.method import TrainingPhase
from r3_rllib.core.metric_groups import clear_groups
from r3_rllib.core.reflection import ReflectionSettings
from r3_rllib.types.samples import Group

#: Seconds between polls of the requests in flight while the learner waits for groups.
POLL_S = 0.02

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedRollout:
    """One delivered request waiting to be trained: its number (issue order) and the runner's result."""

    request: int
    result: RolloutResult

    @property
    def fresh_groups(self) -> int:
        return sum(not g.is_reflection for g in self.result.groups)


def group_staleness(group: Group, policy_version: int) -> int:
    """Policy versions between the oldest weights that generated ``group`` and ``policy_version``."""
    return policy_version - min(s.policy_version for s in group.samples) if group.samples else 0


def split_stale_groups(
    groups: Iterable[Group], policy_version: int, max_staleness: int
) -> tuple[list[Group], list[Group]]:
    """(groups within ``max_staleness`` versions of ``policy_version``, groups older than that)."""
    kept, stale = [], []
    for g in groups:
        (stale if group_staleness(g, policy_version) > max_staleness else kept).append(g)
    return kept, stale


class StreamingCoordinator(RolloutCoordinator):
    """Streaming rollouts with a staleness bound (see the module docstring)."""

    def __init__(self, runners, config, metrics, max_staleness: int, restore_runners=None) -> None:
        super().__init__(runners, config, metrics, restore_runners)
        if max_staleness < 2:
            raise ValueError(f"streaming rollouts need max_staleness >= 2, got {max_staleness}")
        self.max_staleness = max_staleness
        self.queue: list[QueuedRollout] = []
        self._in_flight: dict[int, list[int]] = {}  # worker id -> numbers of its requests in flight
        self._requests = 0
        self._issued: dict[int, int] = {}  # request number -> the policy version when it was issued
        self._runners_lost = 0  # runners taken out of service with requests in flight, this iteration
        self._runners_timed_out = 0  # runners restarted as hung, this iteration

    # -- one iteration's rollout ------------------------------------------------------------------------------
    def rollout(
        self,
        reflection: ReflectionSettings | None,
        next_reflection: Callable[[], ReflectionSettings | None],
        policy_version: int,
        phase: TrainingPhase | None = None,
    ) -> tuple[list[Group], Rollout]:
        """(groups to train on, the rollout they came from): the oldest delivered requests holding
        ``queries_per_iteration`` fresh groups, less the groups older than ``max_staleness``, scored by the rollout
        stages an update in ``phase`` needs; then every runner is topped up to ``max_staleness`` outstanding
        requests."""
        target = self.config.queries_per_iteration
        self._forget_lost_requests()
        self._top_up(reflection, policy_version)  # the first iteration, or after a restore or a restart
        t_wait = time.perf_counter()
        self._wait_for(target, policy_version)
        for _ in range(MAX_LOST_ROLLOUTS):
            if self.queue or self.ready is not None:
                break
            # Every runner was lost with its requests: wait for their restart (in _top_up) and ask again.
            self._top_up(reflection, policy_version)
            self._wait_for(target, policy_version)
        if not self.queue and self.ready is None:
            raise RuntimeError(f"every EnvRunner was lost in {MAX_LOST_ROLLOUTS + 1} rollouts in a row")
        learner_wait_s = time.perf_counter() - t_wait
        taken = self._take(target)
        rollout = merge_results([q.result for q in taken])
        if self.ready is not None:  # a rollout restored from a synchronous or overlap checkpoint
            rollout, self.ready = self.ready.merge(rollout), None
        kept, stale = split_stale_groups(rollout.groups, policy_version, self.max_staleness)
        self._top_up(next_reflection(), policy_version)
        # Graded by the rollout stages while the runners, just topped up, generate.
        kept = list(self.score(dataclasses.replace(rollout, groups=tuple(kept)), phase).groups)
        staleness = [
            policy_version - s.policy_version for g in kept if not g.is_reflection for s in g.samples
        ]
        clear_groups(self.metrics, *LAG_METRICS)
        if staleness:
            self._log("policy_lag", float(np.mean(staleness)))
            self._log("staleness_max", float(max(staleness)))
        self._log("stale_groups_dropped", len(stale))
        self._log("runners_failed", self._runners_lost)
        self._log("runners_timed_out", self._runners_timed_out)  # each iteration: 0, not NaN, after one
        self._runners_lost = self._runners_timed_out = 0
        self._log("learner_wait_s", learner_wait_s)
        self._log("queue_depth", sum(q.fresh_groups for q in self.queue))
        self._log("requests_in_flight", sum(map(len, self._in_flight.values())))
        return kept, rollout

    # -- requests ----------------------------------------------------------------------------------------------
    def _outstanding(self, wid: int) -> int:
        return len(self._in_flight.get(wid, ())) + sum(q.result.worker_id == wid for q in self.queue)

    def _top_up(self, reflection: ReflectionSettings | None, policy_version: int) -> None:
        """Ask every healthy runner for its share until it has ``max_staleness`` requests outstanding (with none
        healthy, after waiting for Ray to restart them: runner_faults.wait_for_runners)."""
        ids = wait_for_runners(self.runners, self.restore_runners, self.config)
        share = query_shares(self.config.queries_per_iteration, ids)
        for wid in ids:
            if share[wid] == 0:
                continue
            while self._outstanding(wid) < self.max_staleness:
                self._request(wid, share[wid], reflection, policy_version)

    def _request(
        self, wid: int, num_queries: int, reflection: ReflectionSettings | None, policy_version: int
    ) -> None:
        number, self._requests = self._requests, self._requests + 1
        self._issued[number] = policy_version

        def sample(runner, _n=num_queries, _refl=reflection, _number=number):
            return _number, sample_or_error(runner, num_queries=_n, reflection=_refl)

        sent = self.runners.foreach_env_runner_async(sample, tag=ROLLOUT_TAG, remote_worker_ids=[wid])
        if sent != 1:  # RLlib refuses a request past max_requests_in_flight_per_env_runner
            raise RuntimeError(
                f"EnvRunner {wid} refused rollout request {number} (max_requests_in_flight_per_env_runner is "
                f"{self.config.max_requests_in_flight_per_env_runner}, max_staleness {self.max_staleness})"
            )
        self._in_flight.setdefault(wid, []).append(number)

    def _receive(self, timeout_s: float) -> int:
        """Collect the requests that finished (waiting at most ``timeout_s``) into the queue; their number."""
        answers = self.runners.fetch_ready_async_reqs(tags=ROLLOUT_TAG, timeout_seconds=timeout_s)
        raise_runner_errors((wid, out) for wid, (_, out) in answers)
        results = []
        for wid, (number, result) in answers:
            if number in self._in_flight.get(wid, ()):
                self._in_flight[wid].remove(number)
            self._issued.pop(number, None)
            if self._from_known_processes([result]):
                self.queue.append(QueuedRollout(number, result))
                results.append(result)
        # A restarted runner resumes after its last delivered request; the data epoch moves only with training
        # (`_take`), so R^3's start epochs switch on with the first batch of the new epoch, not k requests early.
        self.runner_states.update({r.worker_id: r.runner_state for r in results})
        self._forget_lost_requests()
        return len(results)

    def _at_risk(self, policy_version: int | None) -> bool:
        """A request in flight was issued ``max_staleness`` versions ago: trained after this iteration, too old."""
        if policy_version is None:
            return False
        numbers = [n for ns in self._in_flight.values() for n in ns]
        return any(
            self._issued.get(n, policy_version) <= policy_version - self.max_staleness for n in numbers
        )

    def _wait_for(self, target: float, policy_version: int | None = None) -> None:
        """Poll until the queue holds ``target`` fresh groups and no request in flight is at risk of going stale
        (:meth:`_at_risk`), every request has come back, or no request has come back for ``rollout_timeout_s``
        (then the runners with requests in flight are restarted as hung)."""
        timeout = self.config.rollout_timeout_s
        last_progress = time.perf_counter()
        while (sum(q.fresh_groups for q in self.queue) < target or self._at_risk(policy_version)) and any(
            self._in_flight.values()
        ):
            if self._receive(POLL_S):
                last_progress = time.perf_counter()
            elif timeout is not None and time.perf_counter() - last_progress > timeout:
                hung = [wid for wid, numbers in self._in_flight.items() if numbers]
                self._restart_hung_runners(hung)
                self._runners_timed_out += len(hung)
                self._forget_lost_requests()
                return

    def _take(self, target: int) -> list[QueuedRollout]:
        """The oldest delivered requests (request number, then worker id) holding ``target`` fresh groups (or all
        the queue holds, when fewer came back); the data epoch becomes theirs."""
        self.queue.sort(key=lambda q: (q.request, q.result.worker_id))
        taken, fresh = [], 0
        while self.queue and fresh < target:
            taken.append(self.queue.pop(0))
            fresh += taken[-1].fresh_groups
        # merged in worker order; each runner's newest request comes last, so its epoch is the one recorded
        taken.sort(key=lambda q: (q.result.worker_id, q.request))
        self.epoch.update({q.result.worker_id: q.result.env_epoch for q in taken})
        return taken

    def _forget_lost_requests(self) -> None:
        """Drop the requests of runners RLlib took out of service (a crash drops them with the actor's state)."""
        healthy = set(self.runners.healthy_worker_ids())
        for wid in list(self._in_flight):
            if wid not in healthy:
                lost = self._in_flight.pop(wid)
                self._runners_lost += bool(lost)
                for number in lost:
                    self._issued.pop(number, None)

    def runners_restarted(self, worker_ids: Iterable[int]) -> None:
        """Restarted runners start with nothing in flight (the requests their old process held are gone)."""
        worker_ids = list(worker_ids)
        super().runners_restarted(worker_ids)
        for wid in worker_ids:
            lost = self._in_flight.pop(wid, [])
            self._runners_lost += bool(lost)
            for number in lost:
                self._issued.pop(number, None)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Wait for every request in flight (a checkpoint keeps their samples: their queries are consumed)."""
        self._wait_for(float("inf"))

    def discard(self) -> None:
        """Drop the queue and the requests in flight (a restore replaces the policy that generated them)."""
        self.drain()
        self.queue = []

    @property
    def saved_queue(self) -> tuple[QueuedRollout, ...]:
        return tuple(self.queue)

    def restore(self, state: AlgorithmState) -> None:
        super().restore(state)
        self.queue = list(state.stream_queue or ())
