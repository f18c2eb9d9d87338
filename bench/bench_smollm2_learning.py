"""Learning on a real pretrained LM: GRPO and R^3 on SmolLM2-135M-Instruct, one-digit sums asked through its chat
template, held-out greedy accuracy before and after, in one run.

    python bench/bench_smollm2_learning.py                    # GRPO and R^3, 12 iterations each (8-15 min, 2 cores)
    python bench/bench_smollm2_learning.py --methods r3 --iterations 6
    python bench/bench_smollm2_learning.py --smoke            # CI: R^3, one tiny iteration (skips without the model)

Policy: ``smollm2-135m`` (built by ``scripts/setup.sh`` into ``~/.cache/r3_rllib``). Task: :class:`ChatArithmeticEnv`
with one-digit operands and ``+`` ("What is 7+4? Answer with the number only." in SmolLM2's ChatML template),
graded on the last integer of the response; the model answers "The answer is 11." or "7 + 4 = 11" and gets roughly
a third to a half of them right, so groups are mixed and GRPO has a signal. There are only 100 one-digit sums: the
training pool and the disjoint held-out pool take ``--num-queries`` each. R^3's parts are on from dataset epoch
``--start-epoch`` (default 0: the run is too short for a plain-GRPO first epoch; replay and reflection then act
once queries come back, from iteration pool / queries + 1 on).

Both methods start from the same weights and draw the same queries (same seed). Reports per method: held-out
greedy accuracy (and mean reward, the same number here: no length bonus) before and after, sampled training
accuracy of the first and last iterations, zero-advantage group fractions, R^3's work, seconds per iteration and
the learner's peak memory when the learner reports it. Writes ``runs/<method>/progress.csv`` (``r3 plot`` reads
it) and ``summary.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_learning
import common

METHODS = ("grpo", "r3")


def method_config(method: str, args: argparse.Namespace, model_path: str):
    from r3_rllib import R3Config
    from r3_rllib.envs.chat_arithmetic import ChatArithmeticEnv

    if method == "grpo":
        config = R3Config.grpo_preset()
    elif method == "r3":
        config = R3Config.r3_preset().r3(
            replay_start_epoch=args.start_epoch,
            reflection_start_epoch=args.start_epoch,
            ranking_start_epoch=args.start_epoch,
        )
    else:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    env_config = {"digits": 1, "operators": "+", "num_queries": args.num_queries, "seed": args.seed}
    return one_runner_run(config.environment(ChatArithmeticEnv, env_config=env_config), args, model_path)


def one_runner_run(config, args: argparse.Namespace, model_path: str):
    """`config` (its env set) with one HF runner, one local learner, the seed and the training settings of `args`,
    held-out evaluation on `args.num_queries` problems of the test split. The runner's and the learner's torch
    threads are `args.runner_threads` and `args.learner_threads` (default 1 each): the loop is synchronous, so
    either may take both cores while the other waits."""
    return (
        config.env_runners(num_env_runners=1, num_cpus_per_env_runner=getattr(args, "runner_threads", 1))
        .learners(num_learners=0, num_cpus_per_learner=getattr(args, "learner_threads", 1))
        .debugging(seed=args.seed)
        .training(
            model_path=model_path,
            group_size=args.group_size,
            queries_per_iteration=args.queries,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            lr=args.lr,
            micro_batch_size=args.micro_batch_size,
            learner_entropy=False,  # a 49k-token vocabulary: the rollout entropies are the ones to watch
            eval_env_config={"split": "test"},
            eval_num_queries=args.num_queries,
        )
    )


def run_one(
    method: str,
    args: argparse.Namespace,
    model_path: str,
    out_dir: Path,
    make_config=None,
    tag: str | None = None,
) -> dict[str, Any]:
    """Held-out accuracy before, `args.iterations` iterations, held-out accuracy after (and every
    `args.eval_every` iterations where set), of `method`'s config (`make_config(method, args, model_path)`,
    default this bench's); its progress.csv goes to runs/<tag>."""
    t0 = time.perf_counter()
    algo = (make_config or method_config)(method, args, model_path).build_algo()
    build_s = time.perf_counter() - t0
    rows: list[dict[str, float]] = []
    try:
        t0 = time.perf_counter()
        before = algo.evaluate_heldout(args.num_queries)
        eval_s = time.perf_counter() - t0
        rows.append({"training_iteration": 0.0, "time_total_s": 0.0, "eval/accuracy": before["accuracy"]})
        total = 0.0
        for it in range(1, args.iterations + 1):
            t0 = time.perf_counter()
            result = algo.train()
            total += time.perf_counter() - t0
            row = bench_learning.flatten_result(result)
            row.update({"training_iteration": float(it), "time_total_s": total})
            every = getattr(args, "eval_every", 0)
            if every and it % every == 0 and it < args.iterations:  # the last one is made below
                row["eval/accuracy"] = algo.evaluate_heldout(args.num_queries)["accuracy"]
            rows.append(row)
            print(
                f"  [{tag or method}] it {it}: train acc {row.get('rollout/accuracy', math.nan):.3f}, zero-adv "
                f"{row.get('rollout/zero_adv_frac_before', math.nan):.2f} -> "
                f"{row.get('rollout/zero_adv_frac', math.nan):.2f}, "
                f"{total / it:.0f} s/it ({common.load_note()})",
                flush=True,
            )
        after = algo.evaluate_heldout(args.num_queries)
    finally:
        algo.stop()
    rows[-1]["eval/accuracy"] = after["accuracy"]
    bench_learning.write_progress(out_dir / "runs" / (tag or method), rows)
    return {**summarize_run(method, rows), "build_s": build_s, "eval_s": eval_s}


def summarize_run(method: str, rows: Sequence[dict[str, float]]) -> dict[str, Any]:
    """One run's figures from its progress rows (row 0: the held-out start; the last row holds the held-out end
    and the total time), as `run_one` returns them and `--report`-style readers rebuild them from progress.csv."""
    train = rows[1:]
    k = max(1, min(3, len(train) // 2))

    def mean_of(rs: Sequence[dict[str, float]], key: str) -> float:
        vals = [r[key] for r in rs if key in r and not math.isnan(r[key])]
        return sum(vals) / len(vals) if vals else math.nan

    peaks = [r[key] for r in train for key in ("learner/peak_rss_gb",) if key in r and not math.isnan(r[key])]
    return {
        "method": method,
        "heldout_before": rows[0]["eval/accuracy"],
        "heldout_after": rows[-1]["eval/accuracy"],
        "train_acc_first": mean_of(train[:k], "rollout/accuracy"),
        "train_acc_last": mean_of(train[-k:], "rollout/accuracy"),
        "avg_k": k,
        "zero_adv_before": mean_of(train, "rollout/zero_adv_frac_before"),
        "zero_adv_after": mean_of(train, "rollout/zero_adv_frac"),
        "response_len": mean_of(train, "rollout/response_len_mean"),
        "replay_samples": sum(r.get("r3/train_replayed", 0.0) for r in train),
        "reflection_prompts": sum(r.get("r3/reflection_prompts", 0.0) for r in train),
        "ranked_groups": sum(r.get("r3/ranked_groups", 0.0) for r in train),
        "s_per_iteration": rows[-1]["time_total_s"] / max(1, len(train)),
        "sample_s": mean_of(train, "timers_s/sample_s"),
        "update_s": mean_of(train, "timers_s/learner_update_s"),
        "peak_rss_gb": max(peaks) if peaks else math.nan,
    }


def table(runs: list[dict[str, Any]]) -> str:
    head = [
        "method",
        "held-out before",
        "held-out after",
        "delta",
        "train acc first",
        "train acc last",
        "zero-adv before",
        "zero-adv after R^3",
        "replayed",
        "reflections",
        "ranked",
        "resp len",
        "s/it (sample, update)",
        "learner peak GB",
    ]
    rows = [
        [
            r["method"],
            f"{r['heldout_before']:.3f}",
            f"{r['heldout_after']:.3f}",
            f"{r['heldout_after'] - r['heldout_before']:+.3f}",
            f"{r['train_acc_first']:.3f}",
            f"{r['train_acc_last']:.3f}",
            f"{r['zero_adv_before']:.2f}",
            f"{r['zero_adv_after']:.2f}",
            f"{r['replay_samples']:.0f}",
            f"{r['reflection_prompts']:.0f}",
            f"{r['ranked_groups']:.0f}",
            f"{r['response_len']:.1f}",
            f"{r['s_per_iteration']:.0f} ({r['sample_s']:.0f}, {r['update_s']:.0f})",
            "n/a" if math.isnan(r["peak_rss_gb"]) else f"{r['peak_rss_gb']:.1f}",
        ]
        for r in runs
    ]
    return common.markdown_table(head, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--num-queries", type=int, default=40, help="training pool = held-out pool size (<= 50)")
    ap.add_argument("--queries", type=int, default=4, help="queries per iteration")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward/backward pass")
    ap.add_argument("--start-epoch", type=int, default=0, help="dataset epoch from which R^3's parts are on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_smollm2_learning")
    ap.add_argument(
        "--smoke", action="store_true", help="CI: R^3, one iteration of 2 queries x 4, 4 held out"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.methods, args.iterations, args.num_queries, args.queries = "r3", 1, 4, 2
        args.group_size = 4
    if not 1 <= args.num_queries <= 50:
        ap.error("--num-queries must be in [1, 50]: there are 100 one-digit sums for both pools together")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    from r3_rllib.models.smollm2 import ModelUnavailableError, build_smollm2

    try:
        model_path = str(build_smollm2(download=False))
    except ModelUnavailableError as e:
        print(f"bench_smollm2_learning: SmolLM2-135M is not available: {e}", file=sys.stderr)
        return 2
    common.pickle_by_value(sys.modules[__name__], common, bench_learning)
    common.print_header("bench_smollm2_learning", args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"unknown method {m!r}; known: {', '.join(METHODS)}")
    out_dir = Path(args.out)
    started = common.start_ray()
    runs: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    try:
        for method in methods:
            runs.append(run_one(method, args, model_path, out_dir))
            r = runs[-1]
            print(
                f"[{method}] held-out {r['heldout_before']:.3f} -> {r['heldout_after']:.3f} "
                f"({r['build_s']:.0f}s build, {r['eval_s']:.0f}s per evaluation)",
                flush=True,
            )
    finally:
        common.stop_ray(started)
    print(
        f"\n## results ({args.iterations} iterations of {args.queries} queries x {args.group_size}, held-out "
        f"greedy accuracy on {args.num_queries} queries, {time.perf_counter() - t_all:.0f}s in total)\n"
    )
    print(table(runs))
    common.write_json(
        out_dir / "summary.json",
        {"args": vars(args), "runs": runs, "machine": common.machine(), "versions": common.versions()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
