"""What the driver hands its learners (learner_calls.py): the batch itself to a learner in its process, one
ObjectRef for remote learners; and the results of a foreach_learner call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from r3_rllib.algorithms.r3 import learner_calls
from r3_rllib.algorithms.r3.learner import _fetched
from r3_rllib.types import TrainingBatch


@dataclass
class _Group:
    is_local: bool


@dataclass
class _Result:
    ok: bool
    value: Any

    def get(self) -> Any:
        return self.value


def _batch() -> TrainingBatch:
    return TrainingBatch(
        prompt_ids=np.array([1, 2], dtype=np.int32),
        prompt_offsets=np.array([0, 2], dtype=np.int64),
        response_ids=np.array([3], dtype=np.int32),
        response_offsets=np.array([0, 1], dtype=np.int64),
        behavior_logprobs=np.array([-0.5], dtype=np.float32),
        advantages=np.array([1.0], dtype=np.float32),
        policy_versions=np.array([0], dtype=np.int64),
    )


def test_a_local_learner_gets_the_batch_itself_with_no_object_store_round_trip(monkeypatch):
    def no_put(value):
        raise AssertionError("a local learner's batch went through the object store")

    monkeypatch.setattr(learner_calls.ray, "put", no_put)
    batch = _batch()
    sent = learner_calls.to_learners(_Group(is_local=True), batch)
    assert sent is batch and _fetched(sent) is batch  # the learner reads it as it reads a fetched one


def test_remote_learners_get_one_object_ref_put_once(monkeypatch):
    puts = []
    monkeypatch.setattr(learner_calls.ray, "put", lambda value: puts.append(value) or "ref")
    batch = _batch()
    assert learner_calls.to_learners(_Group(is_local=False), batch) == "ref" and puts == [batch]


def test_results_in_rank_order_and_the_first_failure_raised():
    assert learner_calls.all_results([_Result(True, 1), _Result(True, 2)]) == [1, 2]
    assert learner_calls.first_result([_Result(True, "rank 0"), _Result(True, "rank 1")]) == "rank 0"
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        learner_calls.all_results([_Result(True, 1), _Result(False, RuntimeError("rank 1 failed"))])


@dataclass
class _Answer:
    actor_id: int
    ok: bool
    value: Any = None

    def get(self) -> Any:
        return self.value


class _Manager:
    """RLlib's FaultTolerantActorManager as collective_results uses it: each fetch hands out the next batch of
    answers (what finished within the wait), under the tag of the call."""

    def __init__(self, batches: list[list[_Answer]], fired: int) -> None:
        self.batches, self.fired, self.tags, self.fetches = list(batches), fired, [], 0

    def foreach_actor_async(self, func, tag=None) -> int:
        self.tags.append(tag)
        return self.fired

    def fetch_ready_async_reqs(self, *, tags, timeout_seconds) -> list[_Answer]:
        assert tags == self.tags[-1] and timeout_seconds == 0.25
        self.fetches += 1
        return self.batches.pop(0) if self.batches else []


class _RemoteGroup:
    is_local = False

    def __init__(self, manager: _Manager, size: int = 3) -> None:
        self._worker_manager, self.size = manager, size

    def __len__(self) -> int:
        return self.size


def test_collective_results_come_in_rank_order_once_all_learners_answered():
    manager = _Manager([[_Answer(2, True, "c")], [], [_Answer(0, True, "a"), _Answer(1, True, "b")]], fired=3)
    results = learner_calls.collective_results(_RemoteGroup(manager), print, poll_s=0.25)
    assert [r.value for r in results] == ["a", "b", "c"] and manager.fetches == 3
    assert learner_calls.first_result(results) == "a"


def test_a_failed_learner_is_returned_while_the_others_still_wait_in_the_collective():
    """Before, the driver waited for every learner: those waiting in a collective for the failed one held it until
    the process group's timeout (30 min). Now the failure comes back with the first fetch that holds it."""
    failure = ValueError("rank 1 failed")
    manager = _Manager([[], [_Answer(1, False, failure)], [_Answer(0, True, "never read")]], fired=3)
    results = learner_calls.collective_results(_RemoteGroup(manager), print, poll_s=0.25)
    assert [r.actor_id for r in results] == [1] and manager.fetches == 2
    with pytest.raises(ValueError, match="rank 1 failed"):
        learner_calls.all_results(results)
    # The next call has a tag of its own: the stuck calls' answers are never read as its own.
    second = _Manager([[_Answer(i, True) for i in range(3)]], fired=3)
    learner_calls.collective_results(_RemoteGroup(second), print, poll_s=0.25)
    assert manager.tags[0] != second.tags[0]


def test_learners_that_could_not_be_called_are_named_before_anyone_waits():
    manager = _Manager([], fired=2)
    with pytest.raises(RuntimeError, match="1 of 3 learners could not be called"):
        learner_calls.collective_results(_RemoteGroup(manager), print, poll_s=0.25)
    assert manager.fetches == 0


class _Executor:
    """Ray Train's BackendExecutor as stop_stuck_learners uses it."""

    def __init__(self) -> None:
        self.shutdowns: list[bool] = []

    def shutdown(self, graceful_termination: bool = True) -> None:
        self.shutdowns.append(graceful_termination)


def test_learners_left_in_a_collective_are_stopped_at_once_at_shutdown():
    """After a failure that left learners blocked in a collective, shutdown kills the group's processes without
    the graceful teardown, which would wait Ray Train's timeout for them (30.7 s measured); a group whose calls
    all returned is left to RLlib's own shutdown."""
    stuck = _RemoteGroup(_Manager([[_Answer(1, False, ValueError("rank 1 failed"))]], fired=3))
    stuck._backend_executor = _Executor()
    learner_calls.collective_results(stuck, print, poll_s=0.25)
    fine = _RemoteGroup(_Manager([[_Answer(i, True) for i in range(3)]], fired=3))
    fine._backend_executor = _Executor()
    learner_calls.collective_results(fine, print, poll_s=0.25)
    assert learner_calls.stop_stuck_learners(fine) is False and fine._backend_executor.shutdowns == []
    assert learner_calls.stop_stuck_learners(stuck) is True and stuck._backend_executor.shutdowns == [False]
    assert learner_calls.stop_stuck_learners(stuck) is False  # once
    assert learner_calls.stop_stuck_learners(None) is False  # setup stopped before the learners were built
