"""On-policy distillation on the tiny arithmetic task: a warm-started teacher distilled into the weaker shipped model,
against GRPO on the task reward and against both together; held-out accuracy against iterations and wall time.

    python bench/bench_distill.py                       # 3 methods x 3 seeds, 120 iterations (~10 min, 2 cores)
    python bench/bench_distill.py --seeds 0 --iterations 6    # a quick look
    python bench/bench_distill.py --smoke               # CI: one method, one seed, one iteration (~30 s)

Student: the shipped tiny model (warm-started on 2-digit addition to held-out greedy accuracy 0.401). Teacher: the
same supervised warm start run on to held-out accuracy >= 0.8 (0.856 at step 1000; ``r3 sft --target-accuracy 0.8
--eval-every 25``, i.e. :func:`r3_rllib.warmstart.arithmetic.warm_start_tiny`; built once, about 3 minutes, then
cached). Same tokenizer, so the teacher scores the student's own tokens. Methods (everything else GRPO's preset):

- ``grpo``: the task reward only;
- ``distill``: the teacher only (``distill_task_reward=False``; ``distill_mode='advantage'``, tinker-cookbook's
  dense per-token reward ``-(log pi_student - log pi_teacher)``, ``distill_coef`` 1);
- ``both``: the task reward's advantage plus the teacher's per-token advantage.

Held-out accuracy is greedy exact match on the env's test split (``--eval-queries``), measured before training and
every ``--eval-interval`` iterations; the wall time is the training time (evaluation excluded).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import common

METHODS = ("grpo", "distill", "both")


def teacher_path(target: float) -> str:
    """The warm-started teacher (cached after the first build)."""
    from r3_rllib.warmstart.arithmetic import warm_start_tiny

    return str(warm_start_tiny(target_accuracy=target, eval_every=25, log=lambda message: None))


def method_config(method: str, args: argparse.Namespace, seed: int, teacher: str):
    from r3_rllib import R3Config

    distill: dict[str, Any] = {}
    if method in ("distill", "both"):
        distill = {
            "distill_teacher": teacher,
            "distill_mode": "advantage",
            "distill_coef": args.coef,
            "distill_task_reward": method == "both",
            "distill_num_cpus_per_worker": 1,
        }
    elif method != "grpo":
        raise ValueError(f"unknown method {method!r}; known: {METHODS}")
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": args.num_queries, "seed": seed})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=seed)
        .reporting(progress=False)
        .training(
            model_path=None,  # the shipped tiny model
            group_size=args.group_size,
            queries_per_iteration=args.queries,
            max_new_tokens=args.max_new_tokens,
            micro_batch_size=512,
            lr=args.lr,
            eval_env_config={"split": "test"},
            **distill,
        )
    )


def run_one(method: str, seed: int, args: argparse.Namespace, teacher: str) -> dict[str, Any]:
    """One run: held-out accuracy before training and every eval_interval iterations, with the training time."""
    algo = method_config(method, args, seed, teacher).build_algo()
    curve: list[tuple[int, float, float]] = []  # (iteration, training seconds, held-out accuracy)
    kl: list[float] = []
    try:
        curve.append((0, 0.0, algo.evaluate_heldout(args.eval_queries)["accuracy"]))
        wall = 0.0
        for it in range(1, args.iterations + 1):
            t0 = time.perf_counter()
            result = algo.train()
            wall += time.perf_counter() - t0
            kl.append(float((result.get("distill") or {}).get("reverse_kl", math.nan)))
            if it % args.eval_interval == 0 or it == args.iterations:
                curve.append((it, wall, algo.evaluate_heldout(args.eval_queries)["accuracy"]))
    finally:
        for stage in algo.coordinator.stages:
            stage.stop()
        algo.stop()
    return {"method": method, "seed": seed, "curve": curve, "reverse_kl": kl}


def tables(runs: list[dict[str, Any]], methods: Sequence[str]) -> str:
    """Per method, the held-out accuracy (mean ± std over seeds) at each evaluation with the mean training time
    until then, and the reverse KL to the teacher (the teacher stage's estimate, mean of the first and of the last
    three iterations)."""
    points = [it for it, _, _ in runs[0]["curve"]]
    headers = ["method", *[f"it {it}: acc (train s)" for it in points], "reverse KL first 3 -> last 3"]
    rows = []
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        cells = []
        for j in range(len(points)):
            wall = sum(r["curve"][j][1] for r in mine) / len(mine)
            cells.append(f"{common.pm([r['curve'][j][2] for r in mine])} ({wall:.0f})")
        kls = [r["reverse_kl"] for r in mine if r["reverse_kl"] and not math.isnan(r["reverse_kl"][0])]
        kl = "-"
        if kls:
            first = sum(sum(k[:3]) / len(k[:3]) for k in kls) / len(kls)
            last = sum(sum(k[-3:]) / len(k[-3:]) for k in kls) / len(kls)
            kl = f"{first:.3f} -> {last:.3f}"
        rows.append([method, *cells, kl])
    return common.markdown_table(headers, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=120)
    ap.add_argument("--eval-interval", type=int, default=20)
    ap.add_argument("--eval-queries", type=int, default=200)
    ap.add_argument("--num-queries", type=int, default=256, help="training pool size")
    ap.add_argument("--queries", type=int, default=16, help="queries per iteration")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--coef", type=float, default=1.0, help="distill_coef")
    ap.add_argument("--teacher-accuracy", type=float, default=0.8, help="the teacher's warm-start target")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: 'both', one seed, one iteration, 8 eval queries, the shipped model as its own teacher (no build)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.methods, args.seeds, args.iterations, args.eval_interval = "both", "0", 1, 1
        args.queries, args.group_size, args.eval_queries = 4, 4, 8
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.print_header("On-policy distillation vs GRPO vs both (tiny arithmetic)", args)
    t0 = time.perf_counter()
    teacher = common.tiny_model_path() if args.smoke else teacher_path(args.teacher_accuracy)
    print(f"teacher: {teacher} (built or found in {time.perf_counter() - t0:.0f} s)", flush=True)
    started = common.start_ray(num_cpus=3)  # runner, teacher actor, and room for the driver's learner
    methods = [m for m in args.methods.split(",") if m]
    runs = []
    try:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for method in methods:
                t_run = time.perf_counter()
                run = run_one(method, seed, args, teacher)
                accs = " ".join(f"{a:.3f}" for _, _, a in run["curve"])
                print(
                    f"{method} seed {seed}: held-out {accs}  ({time.perf_counter() - t_run:.0f} s)",
                    flush=True,
                )
                runs.append(run)
    finally:
        common.stop_ray(started)
    print()
    print(tables(runs, methods))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; {common.load_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
