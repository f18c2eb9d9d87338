"""prefetch_rollout: the synchronous loop asks for the next iteration's rollout at the end of an iteration, and the
next iteration gathers that request instead of asking again; nothing is asked without the switch, twice, or over a
rollout already gathered ahead; the overlapped and streaming loops refuse the switch. (The same samples as without
it, to the last bit, on a real algorithm: tests/e2e/test_algorithm.py's repeat.)"""

from __future__ import annotations

import pytest
from test_fault_handling import _Metrics, _result, _Runners

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator


def _coordinator(runners: _Runners, **training) -> RolloutCoordinator:
    config = R3Config().training(queries_per_iteration=4, **training)
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
