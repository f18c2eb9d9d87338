"""prefetch_rollout: the synchronous loop asks for the next iteration's rollout at the end of an iteration, and the
next iteration gathers that request instead of asking again; nothing is asked without the switch, twice, or over a
rollout already gathered ahead; with DAPO's dynamic sampling the prefetched batch is the first generation batch; a
runner lost with the prefetched request in flight is asked again after its restart; the overlapped and streaming
loops refuse the switch. (The same samples as without it, to the last bit, on a real algorithm:
tests/e2e/test_algorithm.py's repeat.)"""

from __future__ import annotations

import dataclasses

import pytest
from random_samples import random_samples
from test_fault_handling import _Metrics, _result, _Runners

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import runner_faults
from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator
from r3_rllib.algorithms.r3.rollout_types import RolloutResult, RolloutTimings, RunnerState
from r3_rllib.types.samples import Group


def _coordinator(runners: _Runners, **training) -> RolloutCoordinator:
    config = R3Config().training(**{"queries_per_iteration": 4, **training})
    return RolloutCoordinator(runners, config, _Metrics())


def test_the_prefetched_request_is_the_next_rollout_and_is_asked_once():
    runners = _Runners(healthy=[1], fetches=[[(1, _result(1))], [(1, _result(1))]])
    coordinator = _coordinator(runners, prefetch_rollout=True)
    coordinator.prefetch(None)
    assert runners.requests == [[1]] and coordinator.in_flight
    coordinator.prefetch(None)  # already in flight: not asked again
    assert runners.requests == [[1]]
    groups, rollout = coordinator.rollout(None, lambda: None, policy_version=0)
    assert len(groups) == 1 and runners.requests == [[1]]  # gathered, not asked again
    assert not coordinator.in_flight
    # Without a prefetch the next rollout is asked for and gathered in its own iteration.
    coordinator.rollout(None, lambda: None, policy_version=0)
    assert runners.requests == [[1], [1]]


def test_nothing_is_asked_ahead_without_the_switch_or_over_a_rollout_gathered_ahead():
    runners = _Runners(healthy=[1], fetches=[[(1, _result(1))]])
    _coordinator(runners).prefetch(None)  # the default: off
    assert runners.requests == []
    coordinator = _coordinator(runners, prefetch_rollout=True)
    coordinator.ready = coordinator.sample(4, None)  # a checkpoint's rollout, restored
    coordinator.prefetch(None)
    assert runners.requests == [[1]]  # only the sample above


@pytest.mark.parametrize("loop", [{"overlap_generation": True}, {"max_staleness": 1}, {"max_staleness": 3}])
def test_the_overlapped_and_streaming_loops_refuse_the_switch(loop):
    with pytest.raises(ValueError, match="prefetch_rollout is for the synchronous loop"):
        R3Config().training(prefetch_rollout=True, **loop).validate()


def _groups_result(*passing: bool) -> RolloutResult:
    """One runner's answer: a group per entry, with mixed outcomes (passes DAPO's filter) or all wrong (dropped)."""
    groups = []
    for i, mixed in enumerate(passing):
        samples = random_samples(2, seed=i)
        if not mixed:
            samples = [dataclasses.replace(s, reward=0.0, correct=False) for s in samples]
        groups.append(Group(f"q{i}", samples))
    return RolloutResult(
        1, tuple(groups), 0, RolloutTimings(), 0, {"samples": 2.0 * len(groups)}, RunnerState({}, 0)
    )


def test_with_dynamic_sampling_the_prefetched_request_is_the_first_generation_batch():
    """DAPO's refills are asked for in the iteration that gathers the prefetched batch, after its filter: the
    prefetched batch counts as the first generation batch (verl's count), as an unprefetched one does."""
    runners = _Runners(healthy=[1], fetches=[[(1, _groups_result(True, False))], [(1, _groups_result(True))]])
    coordinator = _coordinator(
        runners, queries_per_iteration=2, prefetch_rollout=True, dynamic_sampling=True, max_num_gen_batches=3
    )
    coordinator.prefetch(None)
    assert runners.requests == [[1]]
    groups, rollout = coordinator.rollout(None, lambda: None, policy_version=0)
    assert runners.requests == [[1], [1]]  # one refill, asked after the prefetched batch was gathered
    assert len(rollout.groups) == 3 and len(groups) == 2  # the all-wrong group dropped
    assert all(len({s.correct for s in g.samples}) == 2 for g in groups)
    assert not coordinator.in_flight and runners.fetches == []


def test_a_runner_lost_with_the_prefetched_request_in_flight_is_asked_again_after_its_restore(monkeypatch):
    """The runner crashes between iterations, its prefetched rollout with it: the next iteration waits for the
    restart and asks again (the crash path of a rollout asked in its own iteration), not an empty batch."""
    monkeypatch.setattr(runner_faults, "RESTORE_POLL_S", 0.0)

    def crashed():
        runners.healthy = []
        return []

    def restore():
        runners.healthy = [1]
        return [1]

    runners = _Runners(healthy=[1], fetches=[crashed, [(1, _result(1))]])
    config = R3Config().training(queries_per_iteration=4, prefetch_rollout=True)
    coordinator = RolloutCoordinator(runners, config, _Metrics(), restore)
    coordinator.prefetch(None)
    groups, rollout = coordinator.rollout(None, lambda: None, policy_version=0)
    assert len(groups) == 1 and len(rollout.groups) == 1
    assert runners.requests == [[1], [1]] and not coordinator.in_flight
