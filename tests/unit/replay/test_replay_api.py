"""The replay API is declared once (``REPLAY_API``): the actor and the client take their methods from it."""

from __future__ import annotations

import inspect

import pytest

from r3_rllib.replay.api import REPLAY_API, pack_found, pack_groups, unpack_found, unpack_groups
from r3_rllib.replay.buffer import QueryReplayBuffer
from r3_rllib.types.samples import ReplaySample


def _sample(i: int) -> ReplaySample:
    return ReplaySample(
        query_id=f"q{i % 2}",
        prompt_ids=[1, 2],
        response_ids=list(range(1 + i % 3)),
        behavior_logprobs=[-0.5] * (1 + i % 3),
        reward=float(i),
        correct=bool(i % 2),
        policy_version=i,
        response_text=f"r{i}",
    )


def test_groups_and_found_round_trip():
    groups = [[_sample(0), _sample(1)], [], [_sample(2)]]
    back = unpack_groups(pack_groups(groups))
    assert [[s.response_text for s in g] for g in back] == [["r0", "r1"], [], ["r2"]]
    found = [_sample(3), None, _sample(4)]
    back_found = unpack_found(pack_found(found))
    assert [None if s is None else s.response_text for s in back_found] == ["r3", None, "r4"]


def test_every_declared_method_runs_on_a_buffer():
    buffer = QueryReplayBuffer()
    names = {m.name for m in REPLAY_API}
    assert {
        "add",
        "sample_batch",
        "sample_wrong_answers",
        "get_state",
        "set_state",
        "config",
        "size",
    } <= names
    add = next(m for m in REPLAY_API if m.name == "add")
    assert add.call(buffer, add.packed_arg.unpack(add.packed_arg.pack([_sample(0)]))) == 1
    size = next(m for m in REPLAY_API if m.name == "size")
    assert size.call(buffer) == 1


def test_actor_and_client_carry_the_declared_methods():
    pytest.importorskip("ray")
    from r3_rllib.replay.actor import ReplayBufferActor, ReplayBufferClient

    for method in REPLAY_API:
        served = inspect.signature(getattr(ReplayBufferActor.__ray_actor_class__, method.name))
        forwarded = inspect.signature(getattr(ReplayBufferClient, method.name))
        declared = list(inspect.signature(method.call).parameters)[1:]
        assert list(served.parameters)[1 : 1 + len(declared)] == declared
        assert ("packed" in served.parameters) == (method.packed_result is not None)
        assert list(forwarded.parameters)[1:] == [*declared, "block"]
