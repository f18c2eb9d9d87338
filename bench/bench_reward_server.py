"""The reward server's cost per iteration: the same GRPO run with no reward term, with a rule term, and with a
generative judge term, in one process; seconds per iteration and the seconds the learner waited
on grading (``reward_server/wait_s``), as ratios against the run without a term.

    python bench/bench_reward_server.py                                # none, rule, judge-tiny; overlap on
    python bench/bench_reward_server.py --paths none,judge-smollm2      # SmolLM2-135M-Instruct as the judge
    python bench/bench_reward_server.py --no-overlap --iterations 6 --warmup 2

Setting: the shipped tiny model on 2-digit sums, one EnvRunner (HF engine), a local learner, G = 8, 16 queries per
iteration (128 responses), up to 4 new tokens, seed 0; ``overlap_generation`` on unless ``--no-overlap`` (then
grading cannot hide behind generation). One reward worker (1 CPU). Paths:

- ``none``: no ``reward_models`` (no reward server);
- ``rule``: a rule term (this file's :func:`digits_only`, a Python function per response) weighted 0.5;
- ``judge-tiny``: a generative judge on the HF engine whose model is the shipped tiny model itself, prompted with
  the question and the answer, 8 new tokens per verdict (it writes digits, not verdicts: every score is
  ``judge_unparsable``; the cost of generating them is real);
- ``judge-smollm2``: SmolLM2-135M-Instruct as the judge, 8 new tokens (the named model ``smollm2-135m``).

The paths' algorithms are built first and then take turns, one iteration each (a shared machine's load slows them
alike). Per path, over the timed iterations (after ``--warmup`` untimed ones): the median of ``timers_s/iteration_s``, its
ratio to ``none`` of the same run, the median ``reward_server/wait_s`` (time ``resolve`` waited for the grades) and
``reward_server/grade_s`` (the worker's grading seconds). The load average is printed with every row (2 shared
cores: compare rows of one run only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# The rule term's function is this file's: the reward worker imports the file, from a process whose path may lack
# bench/ (where common.py is).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def digits_only(prompt_text: str, response_text: str, gold: str | None) -> float:
    """The rule term: 1.0 when the answer is digits only."""
    return 1.0 if response_text.strip().isdigit() else 0.0


def reward_terms(path: str) -> list[dict] | None:
    """The ``reward_models`` of a path (None for ``none``)."""
    if path == "none":
        return None
    if path == "rule":
        return [{"name": "rule", "type": "rule", "function": f"{__file__}:digits_only", "weight": 0.5}]
    model = {"judge-tiny": common.tiny_model_path(), "judge-smollm2": "smollm2-135m"}[path]
    rubric = (
        "{question}{response}"
        if path == "judge-tiny"
        else 'Check the addition {question}{response}\nIs it correct? End your reply with "Verdict: correct" '
        'or "Verdict: incorrect".'
    )
    return [
        {
            "name": "judge",
            "type": "judge",
            "model": model,
            "rubric": rubric,
            "max_new_tokens": 8,
            "weight": 0.5,
        }
    ]


def build(path: str, args: argparse.Namespace) -> tuple[object, float]:
    """A path's algorithm and the seconds it took to build (the reward workers' start included)."""
    config = common.grpo_config(common.tiny_model_path(), group_size=8, queries=16, max_new_tokens=4)
    config.training(overlap_generation=args.overlap, eval_interval=0, progress=False)
    terms = reward_terms(path)
    if terms is not None:
        config.training(reward_models=terms, reward_workers=1, reward_num_cpus_per_worker=1)
    start = time.perf_counter()
    algo = config.build_algo()
    return algo, time.perf_counter() - start


def run_paths(paths: list[str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every path's medians over its timed iterations; the paths take turns iteration by iteration (a shared
    machine's load slows them alike)."""
    algos, results, measured = {}, {p: [] for p in paths}, {}
    try:
        for path in paths:
            algos[path] = build(path, args)
        for i in range(args.warmup + args.iterations):
            for path in paths:
                result = algos[path][0].train()
                if i >= args.warmup:
                    results[path].append(result)
    finally:
        for algo, _ in algos.values():
            for (
                stage
            ) in algo.coordinator.stages:  # the reward workers freed here, whatever the algorithm's stop does
                stage.stop()
            algo.stop()
    for path, rs in results.items():
        server = [r.get("reward_server", {}) for r in rs]
        measured[path] = {
            "iteration_s": common.median([r["timers_s"]["iteration_s"] for r in rs]),
            "wait_s": common.median([s.get("wait_s", 0.0) for s in server]),
            "grade_s": common.median([s.get("grade_s", 0.0) for s in server]),
            "build_s": algos[path][1],
        }
        print(f"{path}: {measured[path]}", flush=True)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default="none,rule,judge-tiny")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-overlap", dest="overlap", action="store_false")
    parser.add_argument("--json", default=None, help="write the numbers here")
    parser.add_argument("--smoke", action="store_true", help="paths none and rule, one iteration, no warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.paths, args.iterations, args.warmup = "none,rule", 1, 0
    paths = args.paths.split(",")
    unknown = set(paths) - {"none", "rule", "judge-tiny", "judge-smollm2"}
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}")
    common.setup_process()
    common.print_header("Reward server: cost per iteration", args)
    started = common.start_ray(num_cpus=2 * len(paths))  # a runner and a reward worker per path
    rows = []
    try:
        measured = run_paths(paths, args)
    finally:
        common.stop_ray(started)
    print(common.load_note())
    base = measured.get("none", {}).get("iteration_s", float("nan"))
    for path, m in measured.items():
        rows.append(
            [path, m["iteration_s"], m["iteration_s"] / base, m["wait_s"], m["grade_s"], m["build_s"]]
        )
    print()
    headers = ["path", "s/iteration", "x none", "reward_server/wait_s", "grade_s", "build_s"]
    print(common.markdown_table(headers, rows))
    common.write_json(args.json, {"args": vars(args), "measured": measured})


if __name__ == "__main__":
    main()
