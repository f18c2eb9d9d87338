"""The replay buffer's remote API, declared once: every method the Ray actor serves and its client calls.

:class:`~r3_rllib.replay.actor.ReplayBufferActor` and :class:`~r3_rllib.replay.actor.ReplayBufferClient` are built
from :data:`REPLAY_API`: the actor runs each entry's ``call`` on its :class:`QueryReplayBuffer`, the client forwards
to the actor and waits. A new buffer method reaches both by one entry here.

Samples cross the process boundary in columnar form (:func:`~r3_rllib.replay.buffer.to_columns`: about ten times
cheaper to serialise than a list of dataclasses). An entry says which of its values travel packed: its first
argument (the client packs it; the actor also takes it unpacked), its result (the actor packs it when called with
``packed=True``, which the client always asks for). Pure Python: no Ray here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from r3_rllib.replay.buffer import QueryReplayBuffer, from_columns, to_columns
from r3_rllib.types.samples import ReplaySample


class Packing(NamedTuple):
    """A value's packed form on the wire (always a dict): ``pack`` where it is sent, ``unpack`` where it arrives."""

    pack: Callable[[Any], dict[str, Any]]
    unpack: Callable[[dict[str, Any]], Any]


def pack_groups(groups: Sequence[Sequence[ReplaySample]]) -> dict[str, Any]:
    """``{"samples": to_columns(all), "counts": [...]}``: one list of samples per request."""
    return {"samples": to_columns([s for g in groups for s in g]), "counts": [len(g) for g in groups]}


def unpack_groups(packed: dict[str, Any]) -> list[list[ReplaySample]]:
    """Inverse of :func:`pack_groups`."""
    flat = from_columns(packed["samples"])
    groups, i = [], 0
    for n in packed["counts"]:
        groups.append(flat[i : i + n])
        i += n
    return groups


def pack_found(found: Sequence[ReplaySample | None]) -> dict[str, Any]:
    """``{"samples": to_columns(found ones), "found": [bool...]}``: a sample or None per query."""
    return {
        "samples": to_columns([s for s in found if s is not None]),
        "found": [s is not None for s in found],
    }


def unpack_found(packed: dict[str, Any]) -> list[ReplaySample | None]:
    """Inverse of :func:`pack_found`."""
    it = iter(from_columns(packed["samples"]))
    return [next(it) if f else None for f in packed["found"]]


SAMPLES = Packing(to_columns, from_columns)
GROUPS = Packing(pack_groups, unpack_groups)
FOUND = Packing(pack_found, unpack_found)


@dataclass(frozen=True)
class RemoteMethod:
    """One method of the remote API: ``call(buffer, *args, **kwargs)`` runs it on the actor's buffer."""

    name: str
    call: Callable[..., Any]
    packed_arg: Packing | None = None  # the first argument's packed form
    packed_result: Packing | None = None  # the result's packed form, on request

    def signature(self, *flags: str) -> inspect.Signature:
        """``call``'s signature (its first parameter standing for the actor or client) with the keyword-only
        boolean ``flags`` added (the actor's ``packed``, the client's ``block``)."""
        sig = inspect.signature(self.call)
        added = [
            inspect.Parameter(f, inspect.Parameter.KEYWORD_ONLY, default=f == "block", annotation=bool)
            for f in flags
        ]
        return sig.replace(parameters=[*sig.parameters.values(), *added])


def _config(buffer: QueryReplayBuffer) -> dict[str, Any]:
    """The buffer's ReplayConfig as a dict (what it was started with)."""
    return asdict(buffer.config)


def _size(buffer: QueryReplayBuffer) -> int:
    """How many samples are stored."""
    return len(buffer)


REPLAY_API: tuple[RemoteMethod, ...] = (
    RemoteMethod("add", QueryReplayBuffer.add, packed_arg=SAMPLES),
    RemoteMethod("sample_opposite", QueryReplayBuffer.sample_opposite),
    RemoteMethod("sample_batch", QueryReplayBuffer.sample_batch, packed_result=GROUPS),
    RemoteMethod("sample_wrong_answer", QueryReplayBuffer.sample_wrong_answer),
    RemoteMethod("sample_wrong_answers", QueryReplayBuffer.sample_wrong_answers, packed_result=FOUND),
    RemoteMethod("query_stats", QueryReplayBuffer.query_stats),
    RemoteMethod("mean_past_rewards", QueryReplayBuffer.mean_past_rewards),
    RemoteMethod("evict_stale", QueryReplayBuffer.evict_stale),
    RemoteMethod("size", _size),
    RemoteMethod("nbytes", QueryReplayBuffer.nbytes),
    RemoteMethod("metrics", QueryReplayBuffer.metrics),
    RemoteMethod("config", _config),
    RemoteMethod("get_state", QueryReplayBuffer.get_state),
    RemoteMethod("set_state", QueryReplayBuffer.set_state),
)
