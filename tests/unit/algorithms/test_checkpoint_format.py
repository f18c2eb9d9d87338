"""The versioned driver state file and runner state (checkpoint.py, rollout_types.py), without Ray actors."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from r3_rllib.algorithms.r3.checkpoint import (
    ALGORITHM_STATE_VERSION,
    FORMAT_KEY,
    R3_STATE_FILE,
    AlgorithmState,
    CheckpointFormatError,
    checked_version,
    read_algorithm_state,
    write_algorithm_state,
)
from r3_rllib.algorithms.r3.rollout_types import (
    Rollout,
    RolloutResult,
    RolloutTimings,
    RunnerState,
    merge_results,
)
from r3_rllib.types.samples import Group, Sample


def _state(**overrides) -> AlgorithmState:
    fields = {
        "iteration": 3,
        "policy_version": 3,
        "dataset_epoch": 1,
        "runner_epochs": {1: 1, 2: 2},
        "rng": {"state": 7},
        "runners": {1: RunnerState(env={"pos": 4}, sample_seed=1005).to_dict()},
        "replay": None,
        "metrics": {"m": 1.0},
        "r3_settings": {"replay": True},
        "ready_rollout": None,
    }
    return AlgorithmState(**{**fields, **overrides})


def test_state_round_trips_with_its_format_version(tmp_path):
    state = _state()
    path = write_algorithm_state(str(tmp_path), state)
    with open(path, "rb") as f:
        assert pickle.load(f)[FORMAT_KEY] == ALGORITHM_STATE_VERSION
    assert read_algorithm_state(str(tmp_path)) == state


def test_unversioned_state_reads_as_legacy(tmp_path):
    # A checkpoint written before states carried a version: same keys, runner states with a policy_version.
    legacy = {k: v for k, v in vars(_state()).items()}
    legacy["runners"] = {1: {"env": {"pos": 4}, "sample_seed": 1005, "policy_version": 3}}
    del legacy["runner_epochs"]  # older still: no runner epochs
    with open(tmp_path / R3_STATE_FILE, "wb") as f:
        pickle.dump(legacy, f)
    state = read_algorithm_state(str(tmp_path))
    assert state.runner_epochs == {} and state.dataset_epoch == 1
    assert RunnerState.from_dict(state.runners[1]) == RunnerState(env={"pos": 4}, sample_seed=1005)


def test_unknown_state_version_is_refused_naming_file_and_versions(tmp_path):
    with open(tmp_path / R3_STATE_FILE, "wb") as f:
        pickle.dump({**vars(_state()), FORMAT_KEY: 99}, f)
    with pytest.raises(CheckpointFormatError) as err:
        read_algorithm_state(str(tmp_path))
    message = str(err.value)
    assert os.path.join(str(tmp_path), R3_STATE_FILE) in message
    assert "version 99" in message and "0, 1" in message


def test_unknown_runner_state_version_is_refused(tmp_path):
    bad = {1: {FORMAT_KEY: 2, "env": {}, "sample_seed": 0}}
    write_algorithm_state(str(tmp_path), _state(runners=bad))
    with pytest.raises(CheckpointFormatError, match=r"runner 1\).*version 2"):
        read_algorithm_state(str(tmp_path))
    with pytest.raises(CheckpointFormatError, match="EnvRunner 1 state: state format version 2"):
        RunnerState.from_dict(bad[1], source="EnvRunner 1 state")


def test_a_state_that_is_not_a_dict_is_refused():
    with pytest.raises(CheckpointFormatError, match="somewhere: expected a state dict, found a list"):
        checked_version([1, 2], supported=(0, 1), source="somewhere")


def _group(qid: str, version: int) -> Group:
    sample = Sample(
        query_id=qid,
        prompt_ids=[1, 2],
        response_ids=[3],
        behavior_logprobs=np.zeros(1, dtype=np.float32),
        entropies=np.zeros(1, dtype=np.float32),
        reward=1.0,
        correct=True,
        truncated=False,
        policy_version=version,
    )
    return Group(query_id=qid, samples=[sample])


def _result(wid: int, qid: str, gen_s: float, tokens: int) -> RolloutResult:
    return RolloutResult(
        worker_id=wid,
        groups=(_group(qid, 0),),
        env_epoch=wid,
        timings=RolloutTimings(generate_s=gen_s, grade_s=0.5, sample_s=gen_s + 1),
        generated_tokens=tokens,
        totals={"samples": 1.0},
        runner_state=RunnerState(env=None, sample_seed=wid),
    )


def test_results_merge_in_the_given_order_slowest_runner_timing():
    merged = merge_results([_result(1, "a", 2.0, 10), _result(2, "b", 3.0, 5)])
    assert [g.query_id for g in merged.groups] == ["a", "b"]
    assert (merged.generate_s, merged.grade_s, merged.generated_tokens) == (3.0, 0.5, 15.0)
    assert merged.totals == {"samples": 2.0}
    assert merge_results([]) == Rollout()


def test_rounds_merge_adding_times_and_a_legacy_rollout_converts():
    one = merge_results([_result(1, "a", 2.0, 10)])
    both = one.merge(merge_results([_result(1, "b", 1.0, 4)]))
    assert [g.query_id for g in both.groups] == ["a", "b"]
    assert (both.generate_s, both.generated_tokens, both.totals) == (3.0, 14.0, {"samples": 2.0})
    legacy = ([_group("c", 0)], {"generate_s": 1.0, "grade_s": 0.0, "generated_tokens": 2.0, "totals": {}})
    assert [g.query_id for g in Rollout.from_legacy(legacy).groups] == ["c"]
    assert Rollout.from_legacy(None) is None and Rollout.from_legacy(both) is both
