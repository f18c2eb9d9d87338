"""torch, RLlib and transformers imported once, then moved out of the cyclic garbage collector's sight.

Every EnvRunner, Learner and Tune-trial actor is a new Python process, and most of its start-up is importing these
packages: about 850,000 objects the collector tracks. Each full collection scans every tracked object, and the
imports that follow (this package's modules, transformers' lazily loaded model modules) trigger full collections
over that whole heap. ``gc.freeze()`` after the third-party imports moves their objects to the permanent generation,
which no collection scans; vLLM's engine does the same after it starts. Here the imports also run with the
collector off, so the reference cycles they leave behind are frozen too (15 MB more peak memory, 633 vs 618 MB).
Measured on a 2-core AMD EPYC (AVX2), the CPU-seconds of a new Ray actor importing the runner and learner modules,
Ray's worker start-up included, 6 actors each: 13.1 without this module, 11.0 with it, 0.838x
(``python bench/bench_actor_start.py``, BENCHMARKS.md section 49).

The env runner, learner and algorithm modules import this module first, so it runs in each of those processes. A
frozen object is still freed when nothing refers to it; only a reference cycle among the frozen import-time objects
would outlive its use. At exit the objects are unfrozen first (``atexit``), so that extension modules checking for
leaked objects at interpreter shutdown (nanobind's, in triton) find them collected.
"""

from __future__ import annotations

import atexit
import gc

from r3_rllib.core.frozen_heap import collector_off_then_frozen


def _import_frozen() -> None:
    """The imports with the collector off, then frozen (core/frozen_heap.py)."""
    with collector_off_then_frozen():
        import ray.rllib  # noqa: F401
        import torch  # noqa: F401
        import transformers.generation.utils  # noqa: F401
        import transformers.modeling_utils  # noqa: F401
        from transformers import (  # noqa: F401
            AutoModelForCausalLM,
            AutoTokenizer,
            LlamaForCausalLM,
            Qwen2ForCausalLM,
        )


_import_frozen()
atexit.register(gc.unfreeze)
