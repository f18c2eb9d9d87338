"""Where a synchronous iteration's driver time goes: `cProfile` over `algo.train()` calls of the tiny setting.

    python bench/profile_iteration.py                            # 30 iterations, the default threads
    python bench/profile_iteration.py --cpu-threads auto --iterations 30 --top 60

The config is ``bench_throughput``'s tiny setting (``common.grpo_config``: the shipped model, one remote EnvRunner
with the HF engine, a local learner in the driver, G=8, Q=16, 8-token answers). After ``--warmup`` iterations,
``--iterations`` more run under ``cProfile``; printed: seconds per profiled iteration (profiling adds a little), then
the functions of r3-rllib and RLlib by cumulative time. Time spent waiting on the runner shows up in Ray's ``wait``;
what is neither generation nor the update is the iteration's fixed cost (BENCHMARKS.md section 28).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import common


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-threads", default="auto", choices=("auto", "reserved"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--top", type=int, default=45, help="rows of the profile to print")
    args = parser.parse_args(argv)
    common.setup_process()
    common.print_header("profile_iteration", args)
    started = common.start_ray()
    config = common.grpo_config(common.tiny_model_path(), queries=16, group_size=8, max_new_tokens=8)
    config.training(cpu_threads=args.cpu_threads)
    algo = config.build_algo()
    try:
        for _ in range(args.warmup):
            algo.train()
        profile = cProfile.Profile()
        t0 = time.perf_counter()
        profile.enable()
        for _ in range(args.iterations):
            algo.train()
        profile.disable()
        print(f"s/iteration under cProfile: {(time.perf_counter() - t0) / args.iterations:.4f}")
        stats = pstats.Stats(profile)
        stats.sort_stats("cumulative").print_stats(r"r3_rllib|ray/rllib|ray/_private/worker", args.top)
    finally:
        algo.stop()
        common.stop_ray(started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
