"""The algorithm's side of the replay actor: keeps training going when the actor crashes.

The actor is started with ``max_restarts=-1``, so Ray brings a crashed one back, empty. The supervisor notices
(every actor start has a new incarnation id), refills it with the replay state of the last checkpoint (kept in
Ray's object store: Tune moves checkpoint folders, so a path would not do), then replays its journal into it, and
counts the restart. While the actor is down, calls return a caller-given default: an iteration without replay, not
a failed run.

The journal: every call of the driver that changes the buffer since the last checkpoint (:meth:`add` of the fresh
samples, :meth:`sample_batch` of the replay draws, which advance the buffer's RNG and counters), in order. Replayed
after the checkpoint's state it gives the buffer that crashed, so a run whose replay actor crashed between two
iterations trains what the uninterrupted run trains (tests/e2e/test_chaos.py). It holds the samples added since
the last checkpoint (checkpoint_frequency bounds it; a run without checkpoints keeps them all since its start, a
copy of every fresh sample in the driver's memory: checkpoint to bound it). Not journaled, so not exact: the
reflection reads the runners make themselves (reflection on), and a crash in the middle of an iteration (the calls
of that iteration are then lost or answered by the default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray

from r3_rllib.replay.actor import ReplayBufferClient

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ReplaySupervisor:
    """Wraps a :class:`ReplayBufferClient`; ``client`` is what runners get (they handle failures themselves)."""

    def __init__(self, client: ReplayBufferClient, *, restart_timeout_s: float = 60.0) -> None:
        self.client = client
        self.restart_timeout_s = restart_timeout_s
        self.restarts = 0
        self._ok = True
        self._incarnation: str | None = None
        self._snapshot: ray.ObjectRef | None = None
        self._journal: list[tuple[str, Any]] = []  # (method, argument) since the snapshot, in call order

    @property
    def available(self) -> bool:
        """False from a failed call until a :meth:`check` finds the actor up again."""
        return self._ok

    def call(self, fn: Callable[[ReplayBufferClient], T], default: T) -> T:
        """``fn(client)``. An actor that is restarting is waited for (and refilled), then asked once more; one
        that is gone gives ``default``."""
        try:
            return fn(self.client)
        except ray.exceptions.ActorUnavailableError:
            self.check()
            if not self._ok:
                return default
            try:
                return fn(self.client)
            except ray.exceptions.RayActorError as err:
                return self._lost(err, default)
        except ray.exceptions.RayActorError as err:
            return self._lost(err, default)

    def add(self, samples: list) -> None:
        """Add fresh samples without waiting, journaled (see the module docstring)."""
        self._journal.append(("add", samples))
        self.call(lambda replay: replay.add(samples, block=False), None)

    def sample_batch(self, requests: list[tuple], default: list) -> list:
        """The buffer's ``sample_batch(requests)`` (``default`` while it is down), journaled: the draw advances the
        buffer's RNG, which a refill must advance the same way."""
        self._journal.append(("sample_batch", requests))
        return self.call(lambda replay: replay.sample_batch(requests), default)

    def _lost(self, err: Exception, default: T) -> T:
        logger.warning("replay actor unavailable, this iteration goes on without it: %s", err)
        self._ok = False
        return default

    def check(self) -> None:
        """Is the actor up, and is it the one holding our samples? Waits up to ``restart_timeout_s`` for one that
        Ray is restarting; refills a restarted one from the last snapshot."""
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                remaining = max(0.0, deadline - time.monotonic())
                incarnation = ray.get(self.client.handle.incarnation.remote(), timeout=remaining)
                break
            except ray.exceptions.ActorUnavailableError:  # restarting: ask again until it is back
                if time.monotonic() > deadline:
                    self._ok = False
                    return
                time.sleep(0.1)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                self._lost(err, None)
                return
        self._ok = True
        if self._incarnation is not None and incarnation != self._incarnation:
            self.restarts += 1
            restored = 0
            if self._snapshot is not None:
                self.client.set_state(ray.get(self._snapshot))
            for method, arg in self._journal:  # in order, waiting: the buffer as it was before the crash
                getattr(self.client, method)(arg)
            restored = int(self.client.metrics().get("size", 0))
            logger.warning(
                "replay actor restarted (restart %d): refilled with %d samples from the last checkpoint%s and "
                "%d journaled calls since",
                self.restarts,
                restored,
                "" if self._snapshot is not None else " (none yet)",
                len(self._journal),
            )
        self._incarnation = incarnation

    def remember(self, state: dict[str, Any]) -> None:
        """Keep ``state`` (the replay state just saved in, or loaded from, a checkpoint) for a refill."""
        self._snapshot = ray.put(state)
        self._journal = []  # what it held is in the state

    def health_metrics(self) -> dict[str, float]:
        return {"actor_restarts": float(self.restarts), "available": float(self._ok)}
