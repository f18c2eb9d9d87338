"""`RolloutCoordinator`: every decision about when and from which runners R3 gets its rollouts.

- **Request / gather.** A rollout of ``num_queries`` is split over the healthy runners (the first
  ``num_queries % n`` take one more, as ``envs.data.runner_shards`` assumes) and asked for without waiting; gathering
  waits at most ``rollout_timeout_s`` and merges the answers in worker-id order (:func:`rollout_types.merge_results`).
- **Errors, timeouts and restarts.** A runner whose rollout raised (its env, its sampling settings, a non-finite
  reward) answers with a ``RunnerError``, raised here: the run stops with the cause (runner_faults.py). A runner
  that crashed (RLlib marks it unhealthy, Ray restarts it) is brought back by ``R3.restore_env_runners`` at the
  data position and RNG of its last delivered rollout (:attr:`runner_states`). With ``runner_loss: reask`` (the
  default) the coordinator waits for it (bounded), loads the weights the lost request was made with (overlap: one
  version back) and asks it again for the same share with the same reflection settings, so the merged batch is the
  uninterrupted run's; with ``skip`` the iteration trains on the others' samples and the lost queries are drawn in
  a later iteration. A runner that has not answered within ``rollout_timeout_s`` is skipped in both modes (it is
  killed and restarted; asking again could hang again). When every runner asked was lost, the coordinator waits
  (bounded) for Ray to restart them, restores them and asks again: an iteration never trains on nothing.
- **Overlap** (``overlap_generation``): the next rollout is requested before the learner trains on this one; a
  checkpoint drains it (:meth:`drain`) so that its samples, whose queries the runners' data order has already
  consumed, are saved rather than lost.
- **Dynamic sampling** (DAPO): more generation batches until enough informative groups, then trimmed; out of
  batches (``max_num_gen_batches``) short of groups, the run stops (verl) or trains on those (``train_on_kept``).
- **The data epoch** (:class:`DataEpoch`) every runner's shard has completed, from the runners' last rollouts.
- **Restore** on the runners a checkpoint saved, or on more or fewer (:func:`runner_states_for`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import ray

from r3_rllib.algorithms.r3.checkpoint import AlgorithmState
from r3_rllib.algorithms.r3.groups import select_dynamic_groups
from r3_rllib.algorithms.r3.iteration_settings import max_staleness_of, overlong_shaping
from r3_rllib.algorithms.r3.rollout_stages import RolloutStage, apply_stages
from r3_rllib.algorithms.r3.rollout_types import Rollout, RolloutResult, RunnerState, merge_results
from r3_rllib.algorithms.r3.runner_faults import (
    raise_runner_errors,
    sample_or_error,
    wait_for_runner_ids,
    wait_for_runners,
)
from r3_rllib.core.method import TrainingPhase
from r3_rllib.core.metric_groups import clear_groups
from r3_rllib.core.reflection import ReflectionSettings
from r3_rllib.core.reward_shaping import DynamicSamplingShortfall, another_gen_batch, shortfall_message
from r3_rllib.types.samples import Group

#: RLlib async-request tag of the rollout a runner generates (ahead of the learner with overlap_generation).
ROLLOUT_TAG = "r3_rollout"

#: Rollouts in a row that every runner asked may lose (crashes) before the iteration gives up.
MAX_LOST_ROLLOUTS = 3
#: The fresh samples' lag behind the trained policy: absent, not NaN, in an iteration without a fresh sample.
LAG_METRICS = (("rollout", "policy_lag"), ("rollout", "staleness_max"))

logger = logging.getLogger(__name__)


def runner_states_for(saved: Mapping[int, RunnerState], num_runners: int) -> dict[int, RunnerState]:
    """The states runners ``1..num_runners`` resume with, from those a checkpoint saved (worker id -> state).

    Each saved runner still present keeps its own. A run resumed on more EnvRunners gives each added runner (a
    worker id above every saved one) runner 1's data position and the sampling seed runner 1's offset as
    :func:`~r3_rllib.algorithms.r3.runner_setup.runner_seed` offsets runners; the shipped envs' data orders move a
    position to the runner's own shard of the same step (``envs.data.resharded_cursor``), so from that step on the
    runners serve the queries the old number would have. On fewer, the states of the runners gone are dropped: the
    remaining shards of each step take their queries. Exact when the saved runners stand at the same step (every
    synchronous or overlapped iteration ends so); after a lost runner's ``runner_loss: skip``, or under streaming,
    they may stand a step or more apart, and the queries of that gap are served twice or not at all that epoch.
    A saved id absent among the runners and a present id missing from the saved ones (a runner that never
    delivered) are left out, as with the same number."""
    from r3_rllib.algorithms.r3.runner_setup import RUNNER_SEED_STRIDE

    if not saved:
        return {}
    first = min(saved)
    donor = saved[first]
    out = {wid: state for wid, state in saved.items() if wid <= num_runners}
    for wid in range(max(saved) + 1, num_runners + 1):
        seed = donor.sample_seed + RUNNER_SEED_STRIDE * (wid - first)
        out[wid] = dataclasses.replace(donor, sample_seed=seed)
    return out


def resume_note(saved: Iterable[int], num_runners: int) -> str | None:
    """What a restore logs when the runners ``1..num_runners`` are not those the checkpoint holds states for (worker
    ids ``saved``), one to one: another number of EnvRunners, or a runner that had no state to save (one that never
    delivered); None when they are, or when it holds none. Both numbers are those of runners, not the highest id."""
    ids = sorted(saved)
    if not ids or ids == list(range(1, num_runners + 1)):
        return None
    return (
        f"The checkpoint holds the data positions of {len(ids)} EnvRunner(s) (worker ids {ids}); resuming on "
        f"{num_runners}: a runner above those ids takes runner {ids[0]}'s, moved to its own share of the same step, "
        "a saved one above the runners is dropped, one among them without a state is left as it is "
        "(coordinator.runner_states_for)"
    )


class DataEpoch:
    """The data epoch of the run: the epoch of the slowest runner's last delivered rollout (runners that missed the
    latest one included). All shards move in step, so this is the global epoch; a runner restored after a crash
    redraws the queries it lost and is one step behind the others from then on, and the epoch waits for it."""

    def __init__(self) -> None:
        self.value = 0
        self.runner_epochs: dict[int, int] = {}

    def update(self, epochs: Mapping[int, int]) -> None:
        """Record runners' epochs (worker id -> the epoch their env reached); no-op without any."""
        if epochs:
            self.runner_epochs.update({int(w): int(e) for w, e in epochs.items()})
            self.value = min(self.runner_epochs.values())

    def restore(self, value: int, runner_epochs: Mapping[int, int], num_runners: int | None = None) -> None:
        """Take a checkpoint's epoch; on ``num_runners`` other than the saved ones, the runners gone are forgotten and
        each added one starts at runner 1's epoch, as its data position does (:func:`runner_states_for`)."""
        self.value = int(value)
        epochs = {int(w): int(e) for w, e in runner_epochs.items()}
        if num_runners is not None and epochs:
            first, last = epochs[min(epochs)], max(epochs)
            epochs = {w: e for w, e in epochs.items() if w <= num_runners}
            epochs.update({w: first for w in range(last + 1, num_runners + 1)})
        self.runner_epochs = epochs


class RolloutCoordinator:
    """Requests, gathers and merges the runners' rollouts for R3 (see the module docstring).

    ``runners`` is the algorithm's EnvRunnerGroup, ``metrics`` its MetricsLogger (rollout/... values are logged
    here), ``restore_runners`` brings restarted runners back (``R3.restore_env_runners``; None: a run with no
    healthy runner fails at once)."""

    def __init__(
        self, runners, config, metrics, restore_runners: Callable[[], list[int]] | None = None
    ) -> None:
        self.runners = runners
        self.config = config
        self.metrics = metrics
        self.restore_runners = restore_runners
        self.delivered = 0  # runners that delivered the last gathered request
        self._incarnations: dict[int, str] = {}  # worker id -> the runner process that answered last
        self.epoch = DataEpoch()
        self.in_flight = False  # a rollout request is out on the runners
        self._asked: list[int] = []  # the runners asked for the rollout in flight
        self.ready: Rollout | None = None  # gathered ahead of its iteration (drained or restored)
        # Each runner's state after its last rollout that reached the driver (a restarted runner resumes there).
        self.runner_states: dict[int, RunnerState] = {}
        # What the request in flight asked (runner_loss='reask' asks a crashed runner again for the same): each
        # runner's share, the reflection settings, and the weights sent last before it (PolicyWeights.sent).
        self.weights = None  # the algorithm's PolicyWeights, set once it exists
        self._share: dict[int, int] = {}
        self._reflection: ReflectionSettings | None = None
        self._request_weights: tuple | None = None
        self._failed = self._timed_out = 0  # runners crashed / hung during the request being gathered
        # Runners restored since the last request was sent: RLlib dropped that request with their old process, so
        # their missing answer is a loss, not a hang (RLlib may restore them between the request and the gather).
        self._restarted: set[int] = set()
        # Driver-side scoring of each gathered rollout (rollout_stages.py), set by the algorithm; none by default.
        self.stages: Sequence[RolloutStage] = ()

    # -- one iteration's rollout ------------------------------------------------------------------------------
    def rollout(
        self,
        reflection: ReflectionSettings | None,
        next_reflection: Callable[[], ReflectionSettings | None],
        policy_version: int,
        phase: TrainingPhase | None = None,
    ) -> tuple[list[Group], Rollout]:
        """(groups to train on, the rollout over every group sampled), scored by the rollout stages an update in
        ``phase`` needs. With overlap_generation the batch was requested in the previous iteration, before its
        update, and the next one is requested here with the reflection settings ``next_reflection()`` gives after
        this rollout's data epoch."""
        cfg = self.config
        t_wait = time.perf_counter()
        rollout = self._next(cfg.queries_per_iteration, reflection)
        overlap = max_staleness_of(cfg) == 1
        if overlap and not cfg.dynamic_sampling:
            # The runners generate the next batch with the current weights while the learner trains on this one
            # (and while the rollout stages grade this one); the weights of this update reach them after that
            # rollout (a runner runs its calls in order).
            self.request(cfg.queries_per_iteration, next_reflection())
        rollout = self.score(rollout, phase)
        groups = list(rollout.groups)
        if cfg.dynamic_sampling:
            groups, rollout = self._dynamic_sampling(rollout, reflection, phase)
        # The learner waits for this batch (all of its generation when synchronous, the rest of it with overlap).
        self._log("learner_wait_s", time.perf_counter() - t_wait)
        if overlap and cfg.dynamic_sampling:  # the filter needed this batch's scores first
            self.request(cfg.queries_per_iteration, next_reflection())
        fresh_versions = [s.policy_version for g in rollout.groups if not g.is_reflection for s in g.samples]
        clear_groups(self.metrics, *LAG_METRICS)
        if fresh_versions:  # updates between the weights a batch was sampled with and the ones it trains
            lag = policy_version - float(np.mean(fresh_versions))
            self._log("policy_lag", lag)
            self._log("staleness_max", float(policy_version - min(fresh_versions)))
        return groups, rollout

    def prefetch(self, reflection: ReflectionSettings | None) -> None:
        """Synchronous loop with ``prefetch_rollout``: ask for the next iteration's rollout now, with the reflection
        settings it would be asked with (those of the current data epoch and policy version), once the runners
        hold the update's weights; the next :meth:`rollout` gathers it. Nothing with overlap or streaming (their
        rollouts are asked for ahead already), nor with a rollout in flight or gathered ahead."""
        cfg = self.config
        if cfg.prefetch_rollout and max_staleness_of(cfg) == 0 and not self.in_flight and self.ready is None:
            self.request(cfg.queries_per_iteration, reflection)

    def score(self, rollout: Rollout, phase: TrainingPhase | None = None) -> Rollout:
        """``rollout`` with its groups through the driver's rollout stages (reward server, distillation teacher:
        rollout_stages.py) that an update in ``phase`` (this iteration's) needs; the rollout itself when there are
        none."""
        if not self.stages:
            return rollout
        # This rollout's stage metrics only: RLlib would report a key of an earlier iteration that this one lacks
        # (those of a stage the phase skips: the teacher's in R^2PO's stage A; every stage's after a rollout with
        # no group) as NaN.
        clear_groups(self.metrics, *(stage.name for stage in self.stages))
        if not rollout.groups:
            return rollout
        groups = apply_stages(self.stages, rollout.groups, self._log_stage, phase)
        return dataclasses.replace(rollout, groups=tuple(groups))

    def _log_stage(self, stage: str, name: str, value: float) -> None:
        self.metrics.log_value((stage, name), float(value), reduce="mean", window=1)

    def _dynamic_sampling(
        self, rollout: Rollout, reflection: ReflectionSettings | None, phase: TrainingPhase | None = None
    ) -> tuple[list[Group], Rollout]:
        """DAPO: draw generation batches of queries_per_iteration queries until that many groups pass the filter,
        then trim to that many. ``rollout`` is the first batch; verl's count includes it (max_num_gen_batches).
        Out of batches with fewer: raise (verl, the default) or train on those (dynamic_sampling_shortfall)."""
        cfg = self.config
        target = cfg.queries_per_iteration
        select = functools.partial(
            select_dynamic_groups,
            target=target,
            metric=cfg.dynamic_sampling_metric,
            overlong=overlong_shaping(cfg),
        )
        groups, passed = select(rollout.groups)
        gen_batches = 1
        while passed < target and another_gen_batch(gen_batches, cfg.max_num_gen_batches):
            rollout = rollout.merge(self.score(self.sample(target, reflection), phase))
            groups, passed = select(rollout.groups)
            gen_batches += 1
        self._log("dynamic_sampling_gen_batches", gen_batches)
        self._log("dynamic_sampling_rounds", gen_batches - 1)
        # Fresh groups that passed the filter, before the trim to queries_per_iteration.
        self._log("dynamic_sampling_passed", passed)
        if passed < target and cfg.dynamic_sampling_shortfall == "raise":
            raise DynamicSamplingShortfall(
                shortfall_message(
                    kept=passed,
                    needed=target,
                    gen_batches=gen_batches,
                    max_num_gen_batches=cfg.max_num_gen_batches,
                )
            )
        return groups, rollout

    def _next(self, num_queries: int, reflection: ReflectionSettings | None) -> Rollout:
        """The batch to train on: one gathered ahead (drained or restored), the request in flight, or a fresh
        synchronous rollout."""
        if self.ready is not None:
            ready, self.ready = self.ready, None
            if ready.groups:  # empty: drained while every runner was down
                return ready
        if self.in_flight:
            return self._gather_delivered(num_queries, reflection)
        return self.sample(num_queries, reflection)

    def sample(self, num_queries: int, reflection: ReflectionSettings | None) -> Rollout:
        """A synchronous rollout: request and gather."""
        self.request(num_queries, reflection)
        return self._gather_delivered(num_queries, reflection)

    def _gather_delivered(self, num_queries: int, reflection: ReflectionSettings | None) -> Rollout:
        """Gather the request in flight; when every runner asked was lost (crashed), wait for them to be restarted
        and ask again (at most MAX_LOST_ROLLOUTS times): a rollout with no samples is never trained or reported."""
        rollout = self.gather()
        for _ in range(MAX_LOST_ROLLOUTS):
            if self.delivered or not self._asked:
                return rollout
            logger.warning(
                "every EnvRunner asked (%s) was lost during the rollout: asking again", self._asked
            )
            self.request(num_queries, reflection)
            rollout = self.gather()
        if not self.delivered:
            raise RuntimeError(f"every EnvRunner was lost in {MAX_LOST_ROLLOUTS + 1} rollouts in a row")
        return rollout

    # -- request / gather -------------------------------------------------------------------------------------
    def request(self, num_queries: int, reflection: ReflectionSettings | None) -> None:
        """Split ``num_queries`` over the healthy runners and ask each for its share, without waiting (with none
        healthy, after waiting for Ray to restart them: runner_faults.wait_for_runners)."""
        ids = wait_for_runners(self.runners, self.restore_runners, self.config)
        self._share = query_shares(num_queries, ids)
        self._reflection = reflection
        self._request_weights = getattr(self.weights, "sent", None)
        self._asked = list(ids)
        self._failed = self._timed_out = 0
        self._send(ids)

    def _send(self, ids: list[int]) -> None:
        """Ask runners ``ids`` for their share of the request (:attr:`_share`, :attr:`_reflection`)."""

        def sample(runner, _share=self._share, _refl=self._reflection):
            n = _share.get(runner.worker_index, 0)
            return sample_or_error(runner, num_queries=n, reflection=_refl) if n > 0 else None

        self._restarted.clear()
        self.runners.foreach_env_runner_async(sample, tag=ROLLOUT_TAG, remote_worker_ids=ids)
        self.in_flight = True

    def gather(self) -> Rollout:
        """Wait for the requested rollout. A runner whose rollout raised stops the run with its RunnerError; one
        that crashed is asked again once restored (``runner_loss: reask``) or skipped for this iteration (``skip``);
        one that has not answered within rollout_timeout_s is skipped (it is restarted here)."""
        results, lost = self._collect(self._asked)
        if self.config.runner_loss == "reask":
            for _ in range(MAX_LOST_ROLLOUTS):
                if not lost:
                    break
                more, lost = self._reask(lost)
                results += more
            if lost:
                raise RuntimeError(
                    f"EnvRunner(s) {lost} lost their rollout {MAX_LOST_ROLLOUTS + 1} times in a row"
                )
        # In runner order, not arrival order: the batch must not depend on which runner finished first.
        results.sort(key=lambda r: r.worker_id)
        self.delivered = len(results) + sum(self._share.get(w, 0) == 0 for w in self._asked)
        self._log("runners_failed", self._failed)
        self._log("runners_timed_out", self._timed_out)
        self.epoch.update({r.worker_id: r.env_epoch for r in results})
        return merge_results(results)

    def _collect(self, asked: list[int]) -> tuple[list[RolloutResult], list[int]]:
        """(the results of runners ``asked`` that answered, the runners whose answer a crash lost). Restarts the
        runners that missed rollout_timeout_s (neither delivered nor lost: skipped)."""
        answers = self.runners.fetch_ready_async_reqs(
            tags=ROLLOUT_TAG, timeout_seconds=self.config.rollout_timeout_s
        )
        self.in_flight = False
        raise_runner_errors(sorted(answers, key=lambda answer: answer[0]))
        answered = {wid: out for wid, out in answers}
        healthy = set(self.runners.healthy_worker_ids())
        late = [w for w in asked if w in healthy and w not in answered and w not in self._restarted]
        self._restart_hung_runners(late)
        results = self._from_known_processes([out for _, out in answers if out is not None])
        self.runner_states.update({r.worker_id: r.runner_state for r in results})
        self._failed += len(asked) - len(answers)
        self._timed_out += len(late)
        delivered = {r.worker_id for r in results}
        # Lost: crashed before answering, or answered from a process Ray restarted unnoticed (result dropped).
        lost = [w for w in asked if w not in late and w not in delivered and answered.get(w, 0) is not None]
        return results, sorted(lost)

    def _reask(self, lost: list[int]) -> tuple[list[RolloutResult], list[int]]:
        """Wait for the ``lost`` runners to be restarted and restored (data position and RNG after their last
        delivered rollout, runner_faults.wait_for_runner_ids), ask them again for the same share with the weights
        the lost request was made with, and collect: (their results, the runners lost again)."""
        logger.warning("EnvRunner(s) %s lost their rollout: waiting for them to ask again", lost)
        wait_for_runner_ids(self.runners, self.restore_runners, self.config, lost)
        now = getattr(self.weights, "sent", None)
        back = self._request_weights is not None and now is not None and self._request_weights[1] != now[1]
        if back:  # overlap: the lost request was generated one version back; the restore loaded the newest
            self._load_weights(lost, self._request_weights)
        self._send(lost)
        results, still_lost = self._collect(lost)
        if back:  # the runners' next request samples with the newest weights, as the others' does
            self._load_weights([r.worker_id for r in results], now)
        return results, still_lost

    def _load_weights(self, ids: list[int], sent: tuple) -> None:
        """Load ``sent`` (an object ref of the weights, their policy version) on runners ``ids``, waiting."""
        if ids:
            self.runners.foreach_env_runner(
                lambda r, _w=sent[0], _v=sent[1]: r.update_weights(_w, _v),
                remote_worker_ids=ids,
                local_env_runner=False,
            )

    def drain(self) -> None:
        """Gather the request in flight into :attr:`ready` (a checkpoint keeps its samples: their queries are
        already consumed from the runners' data order)."""
        if self.in_flight:
            self.ready = self.gather()

    def discard(self) -> None:
        """Drop the request in flight (a restore replaces the policy that generates it)."""
        if self.in_flight:
            self.gather()

    def _restart_hung_runners(self, ids: list[int]) -> None:
        """Take runners that missed the rollout timeout out of service (RLlib drops their requests in flight) and
        kill their processes; Ray restarts them and ``R3.restore_env_runners`` brings them back."""
        if not ids:
            return
        # Private: RLlib exposes no public way to mark an actor unhealthy (tests/unit/test_rllib_private_api.py).
        manager = self.runners._worker_manager
        handles = manager.actors()
        for wid in ids:
            logger.warning(
                "EnvRunner %d gave no rollout within %.0f s: restarting it",
                wid,
                self.config.rollout_timeout_s,
            )
            manager.set_actor_state(wid, healthy=False)
            ray.kill(handles[wid], no_restart=False)

    # -- runner state ------------------------------------------------------------------------------------------
    @property
    def saved_queue(self) -> tuple | None:
        """Rollouts waiting beyond :attr:`ready`, for a checkpoint: none in the synchronous and overlapped loops
        (streaming keeps a queue)."""
        return None

    def restore(self, state: AlgorithmState) -> None:
        """Take the rollout state of a checkpoint: the data epoch, the rollout gathered ahead, every runner's
        state (pushed to the healthy runners now; the others get theirs when they come back)."""
        self.discard()  # generated by the policy being replaced
        num_runners = int(self.config.num_env_runners)
        self.epoch.restore(state.dataset_epoch, state.runner_epochs, num_runners)
        self.ready = Rollout.from_legacy(state.ready_rollout)
        saved = {
            int(wid): RunnerState.from_dict(runner, source=f"checkpoint state of runner {wid}")
            for wid, runner in state.runners.items()
        }
        note = resume_note(saved, num_runners)
        if note:
            logger.info(note)
        self.runner_states = runner_states_for(saved, num_runners)
        self.push_runner_states(self.runners.healthy_worker_ids())

    def runners_restarted(self, worker_ids: Iterable[int]) -> None:
        """Restored runners answer from a new process from now on (the streaming coordinator also forgets their
        requests in flight)."""
        for wid in worker_ids:
            self._incarnations.pop(wid, None)
            self._restarted.add(wid)

    def _from_known_processes(self, results: list[RolloutResult]) -> list[RolloutResult]:
        """``results`` less those of runners whose process changed since their last answer: Ray restarted it
        before RLlib noticed the crash, so it sampled with the initial weights from the start of its data. Such a
        runner is taken out of service and restored (``restore_runners``); its result is dropped."""
        kept, restarted = [], []
        for r in results:
            incarnation = getattr(r, "incarnation", "")  # absent from results saved by older checkpoints
            seen = self._incarnations.get(r.worker_id)
            (restarted if seen and incarnation and seen != incarnation else kept).append(r)
            self._incarnations[r.worker_id] = incarnation
        if restarted:
            ids = sorted(r.worker_id for r in restarted)
            logger.warning(
                "EnvRunner(s) %s restarted unnoticed: their rollout is dropped and they are restored", ids
            )
            for wid in ids:  # private: as in _restart_hung_runners
                self.runners._worker_manager.set_actor_state(wid, healthy=False)
            if self.restore_runners is not None:
                self.restore_runners()
        return kept

    def push_runner_states(self, worker_ids: Iterable[int]) -> None:
        """Put runners at their last known data position and RNG state (those without one are left as they are)."""
        for wid in worker_ids:
            if wid in self.runner_states:
                self.runners.foreach_env_runner(
                    lambda r, _s=self.runner_states[wid]: r.set_state(_s.to_dict()),
                    remote_worker_ids=[wid],
                    local_env_runner=False,
                )

    def current_runner_states(self) -> dict[int, RunnerState]:
        """Every runner's state, keyed by worker id: asked from the healthy ones, the last known for the others
        (a runner down at save time resumes, after a restore, where its last rollout left it)."""
        asked = self.runners.foreach_env_runner(
            lambda r: (r.worker_index, r.runner_state()), local_env_runner=False
        )
        return {**self.runner_states, **dict(asked)}

    def _log(self, name: str, value: float) -> None:
        self.metrics.log_value(("rollout", name), value, reduce="mean", window=1)


def query_shares(num_queries: int, worker_ids: list[int]) -> dict[int, int]:
    """Each runner's number of queries: an even split, the first ``num_queries % n`` runners one more."""
    n = len(worker_ids)
    return {wid: num_queries // n + (i < num_queries % n) for i, wid in enumerate(worker_ids)}
