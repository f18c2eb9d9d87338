"""R^3's per-query replay of correct and incorrect responses.

:mod:`r3_rllib.replay.buffer` is pure Python (no Ray); the Ray actor wrapper in :mod:`r3_rllib.replay.actor` is
imported lazily, on first access of its names, so importing the buffer never imports Ray.
"""

from typing import Any

from r3_rllib.replay.buffer import (
    PRIORITY_FNS,
    QueryReplayBuffer,
    QueryStats,
    ReplayConfig,
    SampleRequest,
    from_columns,
    register_priority,
    to_columns,
)
from r3_rllib.types.samples import ReplaySample

_ACTOR_NAMES = ("ReplayBufferActor", "ReplayBufferClient", "create_replay_actor")

__all__ = [
    "PRIORITY_FNS",
    "QueryReplayBuffer",
    "QueryStats",
    "ReplayConfig",
    "ReplaySample",
    "SampleRequest",
    "to_columns",
    "register_priority",
    "from_columns",
    *_ACTOR_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _ACTOR_NAMES:
        from r3_rllib.replay import actor

        return getattr(actor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
