"""GRPO vs DAPO vs R^3 on a reasoning-gym task with SmolLM2-135M-Instruct, several seeds, in one run.

    python bench/bench_reasoning_gym.py --probe                       # greedy and sampled accuracy of candidate tasks
    python bench/bench_reasoning_gym.py                               # gcd: 3 methods x 3 seeds (see --help)
    python bench/bench_reasoning_gym.py --smoke                       # CI-sized: R^3, one iteration

The env is ``reasoning_gym`` (the ``[envs]`` extra): one task's problems (at the easy settings of ``PROBE_TASKS``
unless ``--task-config`` says otherwise) through SmolLM2's chat template with reasoning-gym's system prompt (answer
inside ``<answer></answer>``) and ``--few-shot`` solved examples as earlier turns (zero-shot, SmolLM2 writes no
answer block), scored by the task's verifier (binary reward:
a group is all wrong or all right exactly when its G rewards agree, the case R^3 is about). ``--probe`` prints, for
each candidate task, sampled accuracy at the training temperature, greedy accuracy and the fraction of groups all
wrong / all right: pick a task at 10-40 % sampled accuracy, where many groups collapse. The three methods share
model, data order and budget (``--iterations`` x ``--queries`` x ``--group-size``); R^3's parts act from the first
epoch. Reported per method (mean ± std over seeds): held-out greedy accuracy before and after, training accuracy,
zero-advantage group fractions (before and after R^3's replay), R^3's work; per-iteration curves of the seed means
(``learning_reasoning_gym.png``; held-out accuracy at the ends, and every ``--eval-every`` iterations where set)
and ``summary.json`` under ``--out``. The loop is synchronous, so the runner and the learner each take both cores'
torch threads (``--runner-threads 2 --learner-threads 2``) while the other waits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_learning
import bench_smollm2_learning
import common

METHODS = ("grpo", "dapo", "r3")
#: Candidate tasks at easy settings (each task's own options), probed by ``--probe``.
PROBE_TASKS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
    },
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 2},
    "gcd": {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 20},
    "letter_counting": {"min_words": 3, "max_words": 5},
    "count_bits": {},
}


def env_config(args: argparse.Namespace, seed: int, task: str | None = None) -> dict[str, Any]:
    task = task or args.task
    config = (
        args.task_config if task == args.task and args.task_config is not None else PROBE_TASKS.get(task, {})
    )
    return {
        "tasks": {task: {"weight": 1.0, "config": config}},
        "size": args.size,
        "test_size": args.eval_queries,
        "seed": seed,
        "reward": "binary",
        "few_shot": args.few_shot,
    }


def method_config(method: str, args: argparse.Namespace, model_path: str):
    from r3_rllib import R3Config

    presets = {"grpo": R3Config.grpo_preset, "dapo": R3Config.dapo_preset, "r3": R3Config.r3_preset}
    if method not in presets:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    config = presets[method]()
    if method == "r3":
        config.r3(replay_start_epoch=0, reflection_start_epoch=0, ranking_start_epoch=0)
    config = config.environment("reasoning_gym", env_config=env_config(args, args.seed))
    return bench_smollm2_learning.one_runner_run(config, args, model_path)


def probe(args: argparse.Namespace, model_path: str) -> list[list[Any]]:
    """Per candidate task: sampled accuracy at the training temperature, greedy accuracy, groups all wrong / right."""
    import numpy as np

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.envs.reasoning_gym import ReasoningGymEnv

    engine = HFEngine(model_path)
    stop = (engine.tokenizer.eos_token_id,)
    rows = []
    for task in PROBE_TASKS:
        env = ReasoningGymEnv(**env_config(args, 0, task), tokenizer=engine.tokenizer)
        queries = [env.reset() for _ in range(args.probe_queries)]
        prompts = [engine.tokenizer(obs, add_special_tokens=False)["input_ids"] for obs, _ in queries]

        def grade(outs, queries=queries, env=env):
            scores = []
            for (_, info), comps in zip(queries, outs, strict=True):
                row = []
                for c in comps:
                    env.reset(options={"query_id": info["query_id"]})
                    row.append(env.step(c.text)[1])
                scores.append(row)
            return np.array(scores)

        sp = SamplingParams(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0, stop_token_ids=stop
        )
        sampled = grade(engine.generate(prompts, args.group_size, sp))
        greedy = grade(
            engine.generate(
                prompts,
                1,
                SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, stop_token_ids=stop),
            )
        )
        k = (sampled > 0).sum(1)
        rows.append(
            [
                task,
                float(sampled.mean()),
                float(greedy.mean()),
                float(np.mean(k == 0)),
                float(np.mean(k == args.group_size)),
            ]
        )
        print(f"  probed {task}: sampled {rows[-1][1]:.3f}, greedy {rows[-1][2]:.3f}", flush=True)
    return rows


def table(runs: list[dict[str, Any]], methods: Sequence[str]) -> str:
    head = [
        "method",
        "held-out before",
        "held-out after",
        "train acc first",
        "train acc last",
        "zero-adv before",
        "zero-adv after R^3",
        "replayed",
        "reflections",
        "ranked",
        "s/it",
        "seeds",
    ]
    rows = []
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        if rs:
            rows.append(
                [m]
                + [
                    common.pm([r[k] for r in rs])
                    for k in (
                        "heldout_before",
                        "heldout_after",
                        "train_acc_first",
                        "train_acc_last",
                        "zero_adv_before",
                        "zero_adv_after",
                    )
                ]
                + [
                    common.pm([r[k] for r in rs], "{:.0f}")
                    for k in ("replay_samples", "reflection_prompts", "ranked_groups", "s_per_iteration")
                ]
                + [len(rs)]
            )
    return common.markdown_table(head, rows)


#: The per-iteration columns: held-out greedy accuracy (where measured), sampled training accuracy, and the
#: fraction of zero-advantage groups before and after R^3's replay / ranking (DAPO's filter refills its batch).
CURVE_KEYS = ("eval/accuracy", "rollout/accuracy", "rollout/zero_adv_frac_before", "rollout/zero_adv_frac")


def runs_on_disk(out_dir: Path, methods: Sequence[str], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The figures of every (method, seed) run whose progress.csv is under `out_dir` (as the run returned them,
    less the build and first-evaluation times): runs of several invocations, copied into one folder, report
    together."""
    import numpy as np

    from r3_rllib.eval.plot import read_progress_csv

    runs = []
    for m in methods:
        for seed in seeds:
            path = out_dir / "runs" / m / f"seed{seed}" / "progress.csv"
            if path.is_file():
                columns = read_progress_csv(path)
                n = len(columns["training_iteration"])
                rows = [{k: float(v[i]) for k, v in columns.items() if not np.isnan(v[i])} for i in range(n)]
                runs.append({**bench_smollm2_learning.summarize_run(m, rows), "seed": seed})
    return runs


def per_iteration_table(out_dir: Path, methods: Sequence[str], seeds: Sequence[int]) -> str:
    """Mean ± std over the seeds' progress.csv files, one row per (method, iteration); "-" where no seed measured
    it, and the count where only some did (runs of different --eval-every)."""
    import numpy as np

    from r3_rllib.eval.plot import read_progress_csv

    head = ["method", "iteration", "held-out", "train acc", "zero-adv before", "zero-adv after", "seeds"]
    rows = []
    for m in methods:
        runs = [
            read_progress_csv(p)
            for seed in seeds
            if (p := out_dir / "runs" / m / f"seed{seed}" / "progress.csv").is_file()
        ]
        if not runs:
            continue
        for i in range(min(len(r["training_iteration"]) for r in runs)):
            cells = []
            for key in CURVE_KEYS:
                vals = [float(r[key][i]) for r in runs if key in r and not np.isnan(r[key][i])]
                cell = common.pm(vals, "{:.2f}") if vals else "-"
                cells.append(cell if len(vals) in (0, len(runs)) else f"{cell} (n={len(vals)})")
            rows.append([m, int(runs[0]["training_iteration"][i]), *cells, len(runs)])
    return common.markdown_table(head, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # gcd of two numbers up to 20: 22 % sampled accuracy at the start with three examples, a third of the groups all
    # wrong (the probe, BENCHMARKS.md section 22): the 10-40 % start the comparison needs.
    ap.add_argument("--task", default="gcd", help="reasoning-gym task name")
    ap.add_argument(
        "--task-config",
        type=json.loads,
        default=None,
        help="the task's options as JSON (default: its PROBE_TASKS entry, else the task's defaults)",
    )
    ap.add_argument(
        "--few-shot", type=int, default=3, help="solved examples before each problem (the env's few_shot)"
    )
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--size", type=int, default=400, help="training problems")
    ap.add_argument("--queries", type=int, default=4, help="queries per iteration")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--eval-queries", type=int, default=64, help="held-out problems (greedy)")
    ap.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="held-out accuracy every N iterations too (0: at the ends only)",
    )
    ap.add_argument(
        "--learner-threads",
        type=int,
        default=2,
        help="the learner's torch threads (2: the runner's core is idle while the synchronous learner trains)",
    )
    ap.add_argument(
        "--runner-threads",
        type=int,
        default=2,
        help="the runner's torch threads (2: the learner is idle while the synchronous runner samples)",
    )
    ap.add_argument("--probe", action="store_true", help="only print the candidate tasks' accuracies")
    ap.add_argument(
        "--report",
        action="store_true",
        help="only report the runs under --out (their tables and curves), e.g. runs of several invocations",
    )
    ap.add_argument("--probe-queries", type=int, default=16)
    ap.add_argument("--out", default="runs/bench_reasoning_gym")
    ap.add_argument(
        "--smoke", action="store_true", help="CI: R^3, one iteration of 2 queries x 2, 2 held out"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.methods, args.seeds, args.iterations, args.queries, args.group_size = "r3", "0", 1, 2, 2
        args.eval_queries, args.size, args.max_new_tokens = 2, 8, 8
    args.num_queries = args.eval_queries  # the held-out problems bench_smollm2_learning.run_one evaluates on
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.report:
        out_dir = Path(args.out)
        print(table(runs_on_disk(out_dir, methods, seeds), methods))
        print("\nper iteration (mean ± std over the seeds; (n=k) where only k of them measured it):\n")
        print(per_iteration_table(out_dir, methods, seeds))
        pngs = bench_learning.plot(out_dir, methods, seeds, {"learning_reasoning_gym.png": methods})
        print("plots: " + ", ".join(str(p) for p in pngs))
        return 0
    common.setup_process()
    from r3_rllib.models.smollm2 import ModelUnavailableError, build_smollm2

    try:
        model_path = str(build_smollm2(download=False))
    except ModelUnavailableError as e:
        print(f"bench_reasoning_gym: SmolLM2-135M is not available: {e}", file=sys.stderr)
        return 2
    common.print_header("bench_reasoning_gym", args)
    if args.probe:
        rows = probe(args, model_path)
        print(
            common.markdown_table(
                ["task", "sampled acc", "greedy acc", "groups all wrong", "groups all right"], rows
            )
        )
        return 0
    common.pickle_by_value(sys.modules[__name__], common, bench_learning, bench_smollm2_learning)
    out_dir = Path(args.out)
    runs: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    started = common.start_ray()
    try:
        for seed in seeds:  # seed-major: an interrupted run still has every method on the first seeds
            for method in methods:
                args.seed = seed
                r = bench_smollm2_learning.run_one(
                    method, args, model_path, out_dir, method_config, f"{method}/seed{seed}"
                )
                runs.append({**r, "seed": seed})
                print(
                    f"[{method} seed {seed}] held-out {r['heldout_before']:.3f} -> {r['heldout_after']:.3f}",
                    flush=True,
                )
    finally:
        common.stop_ray(started)
    print(
        f"\n## results: {args.task}, {args.iterations} iterations of {args.queries} x {args.group_size}, "
        f"{len(seeds)} seeds, {time.perf_counter() - t_all:.0f}s in total\n"
    )
    print(table(runs, methods))
    print("\nper iteration (mean ± std over the seeds; held-out at 0, every --eval-every and the last):\n")
    print(per_iteration_table(out_dir, methods, seeds))
    pngs = bench_learning.plot(out_dir, methods, seeds, {"learning_reasoning_gym.png": methods})
    print("plots: " + ", ".join(str(p) for p in pngs))
    common.write_json(
        out_dir / "summary.json",
        {"args": vars(args), "runs": runs, "machine": common.machine(), "versions": common.versions()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
