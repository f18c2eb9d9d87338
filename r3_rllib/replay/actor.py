"""The replay buffer as a Ray actor, shared by the algorithm's driver and all env runners.

The actor lives outside the env runners and learners, so their restarts (fault tolerance, elastic scaling) lose no
replay data; the algorithm saves and restores it with :meth:`ReplayBufferActor.get_state` /
:meth:`ReplayBufferActor.set_state` as part of its checkpoint. It asks for no CPU by default (``num_cpus=0``): it is
mostly idle bookkeeping and must never take a slot the runners or learners need, nor block scheduling (under Tune,
an actor asking for resources its trial's placement group does not hold waits forever). Ray runs its methods one at
a time, which is what the pure-Python buffer needs.

Every method is batched (lists in, lists out) so one round trip serves a whole batch of groups: a Ray call costs far
more than a buffer operation. Both classes take their methods from one declaration, :data:`r3_rllib.replay.api.
REPLAY_API`: samples travel in the columnar form of :func:`~r3_rllib.replay.buffer.to_columns` when asked (``add``
accepts it; ``packed=True`` on the sampling methods returns it), which is about ten times cheaper to serialise than
a list of dataclasses; :class:`ReplayBufferClient` does this packing for the caller.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import ray

from r3_rllib.replay.api import REPLAY_API, RemoteMethod
from r3_rllib.replay.buffer import QueryReplayBuffer, ReplayConfig

C = TypeVar("C", bound=type)


def _as_config(config: ReplayConfig | dict[str, Any] | None) -> ReplayConfig:
    if config is None:
        return ReplayConfig()
    if isinstance(config, ReplayConfig):
        return config
    return ReplayConfig.from_dict(config)


def _with_methods(make: Callable[[RemoteMethod], Callable[..., Any]]) -> Callable[[C], C]:
    """Class decorator adding ``make(method)`` (a function carrying its ``__signature__``: Ray checks a call's
    arguments against it) for every method of :data:`REPLAY_API`, named and documented as the buffer's."""

    def deco(cls: C) -> C:
        for method in REPLAY_API:
            fn = make(method)
            fn.__name__ = method.name
            fn.__qualname__ = f"{cls.__qualname__}.{method.name}"
            fn.__module__ = cls.__module__
            fn.__doc__ = method.call.__doc__
            setattr(cls, method.name, fn)
        return cls

    return deco


def _served(method: RemoteMethod) -> Callable[..., Any]:
    """The actor's side of ``method``: unpack a packed first argument, run it on the buffer, pack the result when
    asked (``packed=True``)."""
    sig = method.signature("packed") if method.packed_result is not None else method.signature()
    first = list(sig.parameters)[1] if method.packed_arg is not None else None

    def serve(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        packed = bound.arguments.pop("packed", False)
        if first is not None and isinstance(bound.arguments.get(first), dict):
            bound.arguments[first] = method.packed_arg.unpack(bound.arguments[first])  # type: ignore[union-attr]
        out = method.call(self._buffer, *bound.args[1:], **bound.kwargs)
        return method.packed_result.pack(out) if packed else out  # type: ignore[union-attr]

    serve.__signature__ = sig  # type: ignore[attr-defined]
    return serve


@ray.remote(num_cpus=0)
@_with_methods(_served)
class ReplayBufferActor:
    """A :class:`~r3_rllib.replay.buffer.QueryReplayBuffer` behind a Ray actor (the methods of
    :data:`~r3_rllib.replay.api.REPLAY_API`, batched), plus ``ping`` and ``incarnation``."""

    def __init__(self, config: ReplayConfig | dict[str, Any] | None = None) -> None:
        self._buffer = QueryReplayBuffer(_as_config(config))
        # New on every (re)start: a caller that sees it change knows the buffer restarted empty.
        self._incarnation = uuid.uuid4().hex

    def ping(self) -> bool:
        return True

    def incarnation(self) -> str:
        return self._incarnation


def create_replay_actor(
    config: ReplayConfig | dict[str, Any] | None = None,
    *,
    name: str | None = None,
    namespace: str | None = None,
    num_cpus: float = 0,
    **actor_options: Any,
) -> ray.actor.ActorHandle:
    """Start a :class:`ReplayBufferActor`.

    ``name``/``namespace`` make it reachable with ``ray.get_actor`` from any runner; ``actor_options`` go to
    ``.options()`` (e.g. ``get_if_exists=True``, ``scheduling_strategy``, ``max_restarts``).
    """
    options: dict[str, Any] = {"num_cpus": num_cpus, **actor_options}
    if name is not None:
        options["name"] = name
    if namespace is not None:
        options["namespace"] = namespace
    return ReplayBufferActor.options(**options).remote(_as_config(config))


def _shippable(value: Any) -> Any:
    """Iterators, views and sets become lists: some do not pickle (generators, dict views) and the actor takes
    sequences."""
    if isinstance(value, (str, bytes, list, tuple, dict, np.ndarray)) or not isinstance(value, Iterable):
        return value
    return list(value)


def _forwarded(method: RemoteMethod) -> Callable[..., Any]:
    """The client's side of ``method``: pack what travels packed, call the actor and wait for the result
    (``block=False``: return the ObjectRef of the result as the actor sends it, packed where it packs)."""
    sig = method.signature("block")
    first = list(sig.parameters)[1] if method.packed_arg is not None else None

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        block = bound.arguments.pop("block", True)
        if first is not None and first in bound.arguments:
            bound.arguments[first] = method.packed_arg.pack(bound.arguments[first])  # type: ignore[union-attr]
        call_args = [_shippable(a) for a in bound.args[1:]]
        call_kwargs = {k: _shippable(v) for k, v in bound.kwargs.items()}
        if method.packed_result is not None:
            call_kwargs["packed"] = True
        ref = getattr(self.handle, method.name).remote(*call_args, **call_kwargs)
        if not block:
            return ref
        out = ray.get(ref)
        return method.packed_result.unpack(out) if method.packed_result is not None else out

    forward.__signature__ = sig  # type: ignore[attr-defined]
    return forward


@_with_methods(_forwarded)
class ReplayBufferClient:
    """Synchronous wrapper around a :class:`ReplayBufferActor` handle with the methods of
    :data:`~r3_rllib.replay.api.REPLAY_API`, shipping samples packed; each also takes ``block=False`` to return
    the result's ObjectRef instead of waiting.

    Cheap to construct and picklable (it only holds the handle): pass it to env runners and learners.
    """

    def __init__(self, handle: ray.actor.ActorHandle) -> None:
        self.handle = handle
