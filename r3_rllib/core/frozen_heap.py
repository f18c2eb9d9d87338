"""Run a block of heavy imports with the cyclic garbage collector off, then freeze the heap they made.

A module import creates many long-lived objects (functions, classes, constants) and few reference cycles that are
garbage. With the collector on, each full collection while the imports run rescans the whole growing heap, and
every collection after them scans those objects again for nothing. ``gc.freeze()`` moves every object alive at that
moment to the permanent generation, which no collection scans; vLLM's engine does the same after it starts.
Measured on a 2-core AMD EPYC (AVX2), ``python bench/bench_actor_start.py`` (BENCHMARKS.md sections 49, 50): a new Ray
actor importing torch, RLlib and transformers this way spent 11.0 instead of 13.1 CPU-seconds; one that also builds
a vLLM engine, with vLLM's import frozen too, 20.4 instead of 23.2 (``--vllm``).

A frozen object is still freed when nothing refers to it; only a reference cycle among the frozen objects outlives
its use (~15 MB more peak memory for the actor imports above). Whatever the process held before the block is
frozen too.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_off_then_frozen() -> Iterator[None]:
    """The block with the collector off (it would rescan the growing heap many times), then the heap frozen and the
    collector restored as it was; also when the block raises (an optional import that is missing)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
