"""Where an iteration's CPU goes, process by process: our GRPO loop on ``bench_throughput.py``'s gen setting.

    python bench/bench_cpu_by_process.py                 # the overlap loop, a vLLM runner: 2 warm-up + 6 iterations
    python bench/bench_cpu_by_process.py --sync          # the synchronous loop
    python bench/bench_cpu_by_process.py --engine hf --iterations 4
    python bench/bench_cpu_by_process.py --smoke         # the tiny model, a few tokens

Prints the CPU-seconds per timed iteration of every process that worked during them (this process, which holds the
driver and its learner; the EnvRunner; Ray's raylet, GCS and agents; anything else on the machine), their sums by
part (driver, actors, Ray's own processes, the rest), the machine's busy CPU-seconds over the same span, and the
algorithm's own phase timers. On a 2-core machine an iteration cannot
take less than its CPU-seconds / 2: the split shows which process that time is spent in (BENCHMARKS.md section 43).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_throughput
import common
import psutil


def process_label(name: str, argv: list[str]) -> str:
    """A process's name and what it runs: the script's file name for a Python process (Ray's daemons are Python
    scripts under an interpreter path too long to tell apart), else its command line's start."""
    script = next((a for a in argv[1:] if a.endswith(".py")), None)
    if script is not None:
        return f"{name} {Path(script).name}" + (" (ray)" if "/ray/" in script else "")
    command = " ".join(argv)
    return (command if command.startswith(name or "\0") else f"{name} {command}").strip()[:70]


def process_group(row: str) -> str:
    """Which part of the run a row of :func:`cpu_by_process` is: this process (the driver and its learner), a Ray
    actor (``ray::Class``: the EnvRunner, the replay actor), Ray's own processes (raylet, GCS, its Python services,
    its agents and idle workers), or the rest of the machine."""
    pid, _, label = row.partition(" ")
    if int(pid) == os.getpid():
        return "driver"
    ray_own = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
    if label.startswith("ray::") and not label.startswith(ray_own):
        return "actors"
    if label.startswith(("raylet", "gcs_server", *ray_own)) or label.endswith("(ray)"):
        return "ray's own"
    return "rest"


def process_cpu_s() -> dict[int, tuple[str, float]]:
    """Every process's label (:func:`process_label`) and its CPU-seconds so far (user + system)."""
    out = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            times = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone, or not ours to read
            continue
        argv = proc.info["cmdline"] or []
        out[proc.pid] = (process_label(proc.info["name"] or "", argv), times.user + times.system)
    return out


def cpu_by_process(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], iterations: int
) -> list[tuple[str, float]]:
    """CPU-seconds per iteration of each process that worked between the two readings, largest first; a process
    started in between counts from 0."""
    rows = []
    for pid, (name, cpu) in after.items():
        spent = cpu - before.get(pid, (name, 0.0))[1]
        if spent > 0:
            rows.append((f"{pid} {name}", spent / iterations))
    return sorted(rows, key=lambda row: -row[1])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sync", action="store_true", help="the synchronous loop (default: overlap_generation)")
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--top", type=int, default=10, help="processes listed")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, 4 tokens, 1 + 1 iterations")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(bench_throughput, common)
    common.print_header("bench_cpu_by_process", args)
    gen = ["--setting", "gen"] + (["--smoke", "--gen-tokens", "4"] if args.smoke else [])
    setting = bench_throughput.build_settings(bench_throughput.parse_args(gen))[0]
    iterations, warmup = (1, 1) if args.smoke else (args.iterations, args.warmup)
    started = common.start_ray()
    try:
        session = bench_throughput.OursSession(setting, args.engine, seed=0, overlap=not args.sync)
        try:
            session.run(warmup, timed=False)
            before, busy0, t0 = process_cpu_s(), common.cpu_busy_s(), time.perf_counter()
            session.run(iterations)
            seconds, busy = time.perf_counter() - t0, common.cpu_busy_s() - busy0
            rows = cpu_by_process(before, process_cpu_s(), iterations)
        finally:
            session.close()
    finally:
        common.stop_ray(started)
    summary = session.res.summary()
    print(
        f"\n## {session.res.path}: {iterations} iterations, {seconds / iterations:.2f} s each; the machine busy "
        f"{busy / iterations:.2f} CPU-s per iteration (the least time on 2 cores: {busy / iterations / 2:.2f} s)"
    )
    shown = rows[: args.top]
    rest = sum(cpu for _, cpu in rows[args.top :])
    print(common.markdown_table(["process", "CPU-s / iteration"], [*shown, ("(the others)", rest)]))
    groups = {g: 0.0 for g in ("driver", "actors", "ray's own", "rest")}
    for row, cpu in rows:
        groups[process_group(row)] += cpu
    print("by part (CPU-s / iteration):", ", ".join(f"{g} {cpu:.2f}" for g, cpu in groups.items()))
    phases = {k: common.median(v) for k, v in session.res.phases.items()}
    print("phase timers (median s):", ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    if session.res.learner_threads:
        print(
            "learner threads per update (time-averaged):", [round(t, 2) for t in session.res.learner_threads]
        )
    out: dict[str, Any] = {
        "machine": common.machine(),
        "versions": common.versions(),
        "path": session.res.path,
        "summary": summary,
        "busy_cpu_s_per_iter": busy / iterations,
        "processes": rows,
        "groups": groups,
        "phases": phases,
    }
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
