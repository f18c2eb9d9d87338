"""Where our iteration's time goes around generation and the update: the per-iteration fixed costs, profiled.

    python bench/bench_fixed_costs.py                       # tiny setting, HF runner, 20 iterations (~1 min)
    python bench/bench_fixed_costs.py --iterations 40 --engine vllm
    python bench/bench_fixed_costs.py --profile-out fixed.prof   # the whole profile too (python -m pstats)
    python bench/bench_fixed_costs.py --smoke               # CI: two iterations, no warm-up

The path is ``bench_throughput.py``'s ``ours-hf`` (or ``ours-vllm``) in the tiny setting: the real algorithm, one
remote EnvRunner, the learner local in the driver, the default ``cpu_threads='auto'``. After the warm-up it runs two
blocks of N iterations: the first plain (the algorithm's own timers, as ``bench_throughput.py`` reads them), the
second under ``cProfile`` in the driver, where the iteration's loop and the learner run, and in the runner (its
sample call and weight load; the driver's wait on the runner grows by the runner's profiler). Beside them the plain-PyTorch floor (``bench_throughput.FloorSession``, one thread) runs
N iterations on the same setting, the baseline of the same run.

Printed: per iteration, the algorithm's phases (median of the plain block) against the floor's step, then the
driver's cumulative time in each named part, then the runner's (milliseconds per iteration, from the profiled block;
the profiler's own cost inflates Python-heavy parts, so compare parts with each other, not with the plain block). A part's time
includes what it calls: the weight sync's wait holds what is left of the runner's weight load when the driver has
logged the iteration (the synchronous loop's runners load meanwhile).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Sequence

import bench_throughput
import common

#: The parts reported: label -> (the end of the file's path, the function's name). Indented labels are inside
#: the part above them.
PARTS: dict[str, tuple[str, str]] = {
    "the whole iteration (Trainable.train)": ("ray/tune/trainable/trainable.py", "train"),
    "  RLlib's step (training step, metrics, results)": ("ray/rllib/algorithms/algorithm.py", "step"),
    "    the training step": ("r3_rllib/algorithms/r3/r3.py", "training_step"),
    "      batch from the groups (advantages, R^3)": ("r3_rllib/algorithms/r3/r3.py", "_build_batch"),
    "      batch to the learner and its update": ("r3_rllib/algorithms/r3/r3.py", "_update_learners"),
    "        the update (update_from_samples)": ("r3_rllib/algorithms/r3/learner.py", "update_from_samples"),
    "          learner threads: start": ("r3_rllib/algorithms/r3/learner_threads.py", "start"),
    "            runnable tasks read": ("r3_rllib/core/threads.py", "runnable_tasks"),
    "          learner threads: stop": ("r3_rllib/algorithms/r3/learner_threads.py", "stop"),
    "      weight sync: send (pack, put, ask the runner)": (
        "r3_rllib/algorithms/r3/weight_sync.py",
        "start_sync",
    ),
    "      weight sync: wait for the runner's load": ("r3_rllib/algorithms/r3/weight_sync.py", "wait_loads"),
    "      sample records": ("r3_rllib/algorithms/r3/sample_log.py", "record"),
    "      metrics logged": ("r3_rllib/algorithms/r3/r3.py", "_log_metrics"),
    "      health checks": ("r3_rllib/algorithms/r3/health_monitor.py", "observe_health"),
    "    RLlib's metrics reduction": ("ray/rllib/utils/metrics/metrics_logger.py", "reduce"),
    "ray.put, anywhere (batch and weights)": ("ray/_private/worker.py", "put"),
    "ray.get, anywhere (waits on actors)": ("ray/_private/worker.py", "get"),
}


#: The runner's parts, from its own profile of the same iterations. ``{engine}``: the runner's engine (hf, vllm).
RUNNER_PARTS: dict[str, tuple[str, str]] = {
    "the runner's sample call": ("r3_rllib/algorithms/r3/env_runner.py", "sample"),
    "  generation (the engine's generate)": ("r3_rllib/engines/{engine}_engine.py", "generate"),
    "  grading (the env's step, each response)": ("r3_rllib/rollout/kinds/context.py", "score"),
    "  samples and groups from the completions": ("r3_rllib/rollout/kinds/single_step.py", "to_groups"),
    "  the rollout's statistics": ("r3_rllib/rollout/kinds/base.py", "totals"),
    "the result serialized for the driver": ("ray/_private/serialization.py", "_serialize_to_msgpack"),
    "the weight load (update_weights)": ("r3_rllib/algorithms/r3/env_runner.py", "update_weights"),
}

#: pstats' table: (file, line, function) -> (primitive calls, calls, own time, cumulative time, callers).
StatsTable = dict[tuple[str, int, str], tuple]


def part_times(
    stats: StatsTable, iterations: int, parts: dict[str, tuple[str, str]] = PARTS, engine: str = "hf"
) -> dict[str, float]:
    """Cumulative milliseconds per iteration of each of `parts` in a profile's table (nan: never called)."""
    totals: dict[str, float] = {}
    for label, (path_end, name) in parts.items():
        path_end = path_end.format(engine=engine)
        cumulative = [
            ct
            for (filename, _, func), (_, _, _, ct, _) in stats.items()
            if func == name and filename.replace("\\", "/").endswith(path_end)
        ]
        totals[label] = 1e3 * sum(cumulative) / iterations if cumulative else float("nan")
    return totals


def _start_runner_profile(runner) -> None:
    runner._bench_profile = cProfile.Profile()
    runner._bench_profile.enable()


def _stop_runner_profile(runner) -> StatsTable:
    runner._bench_profile.disable()
    return pstats.Stats(runner._bench_profile).stats  # type: ignore[attr-defined]  (a dict: pickles)


def tiny_setting(engine: str, model: str | None) -> bench_throughput.Setting:
    """`bench_throughput.py --setting tiny`'s setting (its defaults: group size, queries, tokens, lr), one path."""
    argv = ["--setting", "tiny", "--paths", f"ours-{engine}"] + (["--model", model] if model else [])
    [setting] = bench_throughput.build_settings(bench_throughput.parse_args(argv))
    return setting


def run(args: argparse.Namespace) -> dict:
    s = tiny_setting(args.engine, args.model)
    ours = bench_throughput.OursSession(s, args.engine, args.seed)
    try:
        ours.run(args.warmup, timed=False)
        ours.run(args.iterations)
        runners = ours.algo.env_runner_group
        runners.foreach_env_runner(_start_runner_profile, local_env_runner=False)
        profiler = cProfile.Profile()
        profiler.enable()
        ours.run(args.iterations, timed=False)
        profiler.disable()
        [runner_stats] = runners.foreach_env_runner(_stop_runner_profile, local_env_runner=False)
        if args.profile_out:
            profiler.dump_stats(args.profile_out)  # for `python -m pstats` or snakeviz
    finally:
        ours.close()
    floor = bench_throughput.FloorSession(s, args.seed, threads=1)
    floor.run(args.warmup, timed=False)
    floor.run(args.iterations)
    phases = {k: common.median(v) for k, v in ours.res.phases.items()}
    return {
        "ours_s_per_iter": common.median(ours.res.iter_s),
        "ours_phases_s": phases,
        "ours_update_threads": common.median(ours.res.learner_threads) if ours.res.learner_threads else 0.0,
        "floor_s_per_iter": common.median(floor.res.iter_s),
        "floor_learner_s": common.median(floor.res.phases["learner"]),
        "parts_ms_per_iter": part_times(pstats.Stats(profiler).stats, args.iterations),  # type: ignore[attr-defined]
        "runner_parts_ms_per_iter": part_times(runner_stats, args.iterations, RUNNER_PARTS, args.engine),
    }


def report(out: dict) -> None:
    ours, floor = out["ours_s_per_iter"], out["floor_s_per_iter"]
    phases = out["ours_phases_s"]
    print(f"\nours {ours:.3f} s/iter, floor (1 thread) {floor:.3f} s/iter: ours / floor {ours / floor:.3f}x")
    print(
        f"  ours' update {phases['learner']:.3f} s on {out['ours_update_threads']:.2f} threads (median), "
        f"the floor's {out['floor_learner_s']:.3f} s on 1"
    )
    print("\nours per phase (median of the plain block, ms per iteration; the algorithm's timers):")
    for k, v in phases.items():
        print(f"  {k:<14} {1e3 * v:8.1f}")
    around = sum(phases[k] for k in ("sample_other", "weight_sync", "train_other", "grade", "r3_batch"))
    print(f"  {'around':<14} {1e3 * around:8.1f}  (everything but generation and the update)")
    print(
        "\nthe driver's time in each part (profiled block, ms per iteration, a part includes what it calls):"
    )
    for label, ms in out["parts_ms_per_iter"].items():
        print(f"  {label:<56} {ms:8.1f}")
    print("\nthe runner's time in each part (the same block, its own profile, ms per iteration):")
    for label, ms in out["runner_parts_ms_per_iter"].items():
        print(f"  {label:<56} {ms:8.1f}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--model", default=None, help="model folder (default: the shipped tiny model)")
    ap.add_argument(
        "--iterations", type=int, default=20, help="iterations per block (plain, profiled, floor)"
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the numbers to this JSON file")
    ap.add_argument("--profile-out", default=None, help="also save the driver's profile (pstats) here")
    ap.add_argument("--smoke", action="store_true", help="CI: two iterations per block, no warm-up")
    args = ap.parse_args(argv)
    if args.smoke:
        args.iterations, args.warmup = 2, 0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(sys.modules[__name__], common, bench_throughput)
    common.print_header("bench_fixed_costs", args)
    started = common.start_ray()
    try:
        out = {"machine": common.machine(), "versions": common.versions(), **run(args)}
    finally:
        common.stop_ray(started)
    report(out)
    if args.json:
        common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
