"""R^2PO (residual rollout head) against GRPO and R^2PO + R^3 on 2-digit arithmetic, same budget, several seeds.

    python bench/bench_r2po.py                          # 3 methods x 3 seeds x 40 iterations (~5 min on 2 cores)
    python bench/bench_r2po.py --methods grpo,r2po --seeds 0 --iterations 20
    python bench/bench_r2po.py --smoke                  # CI: every method, one seed, 2 iterations, small eval

Policy: the shipped tiny arithmetic model. Every method runs the same number of iterations with the same queries
per iteration and group size (the same sampling budget); R^2PO spends ``head_iters`` of every cycle on its head, so
its base policy gets fewer updates. Reported per method (mean +- std over seeds):

- held-out greedy accuracy of the base policy (head OFF: what is exported), before and after;
- on a probe rollout after training (64 training queries x G, sampled as training samples them: head ON):
  distinct answers per group, mean token entropy, format-error rate (answer not an integer), response length.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import common

METHODS = ("grpo", "r2po", "r2po_r3")
_INTEGER = re.compile(r"-?\d+")


def make_config(method: str, seed: int, args: argparse.Namespace):
    from r3_rllib import R3Config

    config = R3Config.grpo_preset() if method == "grpo" else R3Config.r3_preset()
    if method == "r2po":
        config = R3Config.grpo_preset()
    config = (
        config.environment("arithmetic", env_config={"digits": 2, "num_queries": 2000})
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=seed)
        .training(
            group_size=args.group_size,
            queries_per_iteration=args.queries,
            max_new_tokens=4,
            lr=1e-4,
            num_minibatches=2,
            micro_batch_size=128,
        )
    )
    if method != "grpo":
        config = config.training(
            rollout_head=True,
            rollout_head_head_iters=args.head_iters,
            rollout_head_base_iters=args.base_iters,
            rollout_head_lr=args.head_lr,
            rollout_head_stage_b_weight=args.stage_b_weight,
        )
    if method == "r2po_r3":
        config = config.r3(replay_start_epoch=0, reflection_start_epoch=0, ranking_start_epoch=0)
    return config


def probe(algo, num_queries: int) -> dict[str, float]:
    """Sample like training does (head on for R^2PO) and measure the rollout's diversity and form."""
    out = algo.env_runner_group.foreach_env_runner(
        lambda r, _n=num_queries: r.sample(num_queries=_n), local_env_runner=False
    )[0]
    groups = [g for g in out.groups if not g.is_reflection]
    samples = [s for g in groups for s in g.samples]
    answers = [s.response_text.replace("<eos>", "").strip() for s in samples]
    return {
        "distinct": sum(len({s.response_text for s in g.samples}) for g in groups) / max(1, len(groups)),
        "entropy": sum(float(s.entropies.mean()) for s in samples if len(s.entropies)) / max(1, len(samples)),
        "format_err": sum(not _INTEGER.fullmatch(a) for a in answers) / max(1, len(answers)),
        "length": sum(len(s.response_ids) for s in samples) / max(1, len(samples)),
        "rollout_acc": sum(s.correct for s in samples) / max(1, len(samples)),
    }


def run(method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    algo = make_config(method, seed, args).build_algo()
    try:
        t0 = time.perf_counter()
        before = algo.evaluate_heldout(args.eval_queries)["accuracy"]
        for _ in range(args.iterations):
            algo.train()
        after = algo.evaluate_heldout(args.eval_queries)["accuracy"]
        return {
            "before": before,
            "after": after,
            **probe(algo, args.probe_queries),
            "s": time.perf_counter() - t0,
        }
    finally:
        algo.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--head-iters", type=int, default=1)
    parser.add_argument("--base-iters", type=int, default=3)
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--stage-b-weight", default="truncated_is", choices=("truncated_is", "none"))
    parser.add_argument("--eval-queries", type=int, default=500)
    parser.add_argument("--probe-queries", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="every method, seed 0, 2 iterations, small eval")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.iterations, args.eval_queries, args.probe_queries, args.queries = "0", 2, 32, 8, 8
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; known: {METHODS}")
    seeds = [int(s) for s in args.seeds.split(",")]
    common.setup_process()
    common.print_header("R^2PO vs GRPO vs R^2PO + R^3 (arithmetic, shipped tiny model)", args)
    started = common.start_ray()
    try:
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        for m in methods:
            for s in seeds:
                results[m].append(run(m, s, args))
                print(
                    f"{m} seed {s}: " + ", ".join(f"{k} {v:.3f}" for k, v in results[m][-1].items()),
                    flush=True,
                )
    finally:
        common.stop_ray(started)
    keys = ("before", "after", "distinct", "entropy", "format_err", "length", "rollout_acc", "s")
    rows = [[m, *(common.pm([r[k] for r in results[m]]) for k in keys)] for m in methods]
    headers = [
        "method",
        "acc before (head off)",
        "acc after (head off)",
        "distinct answers / group",
        "rollout entropy",
        "format errors",
        "response len",
        "rollout acc",
        "wall s",
    ]
    print(common.markdown_table(headers, rows))


if __name__ == "__main__":
    main()
