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
