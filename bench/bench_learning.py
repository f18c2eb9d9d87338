"""Learning: GRPO, DAPO-style dynamic sampling and R^3 on an arithmetic task where GRPO groups often collapse, plus
the R^3 ablation (without replay / reflection / ranking), several seeds each, in one run.

    python bench/bench_learning.py                        # probe + 12 methods x 3 seeds (~25 min on 2 CPU cores)
    python bench/bench_learning.py --quick                # GRPO, DAPO, R^3; 1 seed; 30 iterations (~3 min)
    python bench/bench_learning.py --methods grpo,r3 --seeds 0,1 --iterations 30
    python bench/bench_learning.py --methods grpo,rloo,reinforce_plus_plus_baseline,gspo,cispo --no-probe   # estimators and losses
    python bench/bench_learning.py --methods grpo,ppo --no-probe   # verl's PPO: a critic and GAE token advantages
    python bench/bench_learning.py --methods reinforce_plus_plus,reinforce_plus_plus-kl --no-probe   # token returns
    python bench/bench_learning.py --smoke                # CI: R^3, one iteration
    r3 plot runs/bench_learning/runs/r3 runs/bench_learning/runs/grpo   # curves of individual runs

Policy: the shipped tiny model (warm-started on 2-digit addition only). Task (default): 2-digit ``+`` and ``-``
with a pool of 256 training queries, so an 80-iteration run of 16 queries per iteration passes the pool 5 times
and R^3's parts (on from dataset epoch ``--start-epoch``) act for most of the run. The probe printed first shows why
this task: with the shipped model about 60 % of the groups are all wrong (every subtraction, some additions)
while 40 % of the queries are solvable. Held-out accuracy is greedy, on the env's disjoint test pool.

Writes, under ``OUT`` (``--out``, default ``runs/bench_learning``): ``runs/<method>/seed<k>/progress.csv`` (Tune's
column names, so ``r3 plot`` reads them), ``mean/<method>/progress.csv`` (seed means), ``learning_main.png`` (GRPO,
DAPO, R^3), ``learning_ablation.png`` (R^3 and its ablations), ``learning_overlap.png`` (GRPO on-policy vs with
``overlap_generation``, one step off-policy), ``learning_estimators.png`` (GRPO against RLOO, REINFORCE++-baseline,
GSPO, CISPO, ... and ``ppo``, verl's PPO with ``advantage_estimator`` 'gae' and a critic at the policy's ``--lr``:
GRPO's preset with the advantage estimator or the policy loss replaced, ``ESTIMATOR_VARIANTS``), ``learning_lora.png``
(GRPO training a rank-16 LoRA adapter against full fine-tuning) and ``summary.json``;
prints the tables.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common

#: GRPO with one part replaced: the advantage estimator, the policy loss or the rollout weights (everything else as
#: GRPO's preset).
ESTIMATOR_VARIANTS: dict[str, dict[str, Any]] = {
    "rloo": {"advantage_estimator": "rloo"},
    "reinforce_plus_plus_baseline": {"advantage_estimator": "reinforce_plus_plus_baseline"},
    "gspo": {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
    "cispo": {"policy_loss": "cispo"},
    "gpg": {"policy_loss": "gpg"},
    "sapo": {"policy_loss": "sapo", "loss_agg_mode": "seq-mean-token-mean"},
    # TRL's loss_type 'vespo' (its token-mean normalisation is GRPO's preset's).
    "vespo": {"policy_loss": "vespo"},
    # The same two with the rollout importance weights on (truncated at is_cap, per token): the staleness and
    # engine-mismatch correction VESPO folds into its sequence weight and GRPO multiplies into each token's term.
    "grpo-is": {"off_policy_correction": True},
    "vespo-is": {"policy_loss": "vespo", "off_policy_correction": True},
    "kl_cov": {"policy_loss": "kl_cov"},
    # TRL's loss_type 'luspo': GSPO's sequence terms, each times its length.
    "luspo": {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-sum"},
    # A KL term toward the initial policy, and the same term toward a reference that follows the policy (TRL's
    # sync_ref_model: 80 iterations of one optimizer step, so 10 syncs at 8 steps apart).
    "opo": {"advantage_estimator": "opo"},
    "grpo_passk": {"advantage_estimator": "grpo_passk"},
    "remax": {"advantage_estimator": "remax"},
    # GPG's paper pairs its estimator (the batch over its rewarded responses as a scale) with its loss (no ratio).
    "gpg-full": {"advantage_estimator": "gpg", "policy_loss": "gpg"},
    "grpo-kl": {"kl_coef": 0.04},
    "grpo-kl-sync": {"kl_coef": 0.04, "sync_ref_model": True, "ref_model_sync_steps": 8},
    # verl's PPO: a critic on the learners and GAE token advantages (gamma = lambda = 1, verl's defaults), read by
    # GRPO's clipped_pg; critic_lr is set in method_config (PPO_CRITIC_LR_SCALE).
    "ppo": {"advantage_estimator": "gae"},
    # verl's REINFORCE++ without and with the KL in the reward (beta at verl's kl_ctrl.kl_coef, 0.001): with it the
    # learners train each token on its return of the KL-penalised token rewards, whitened over the batch's tokens.
    "reinforce_plus_plus": {"advantage_estimator": "reinforce_plus_plus"},
    "reinforce_plus_plus-kl": {"advantage_estimator": "reinforce_plus_plus", "use_kl_in_reward": True},
}
#: The 'ppo' arm's critic_lr is PPO_CRITIC_LR_SCALE times the policy's ``--lr``. verl's critic.optim.lr 1e-5 is set
#: for 1.5B-7B models, 5x below this tiny model's policy rate (5e-5); the critic is the same small transformer with a
#: fresh value head and 80 updates to fit the returns, so it takes the policy's rate; 10x read no better over 3
#: seeds (held-out 0.224 +- 0.018 against 0.228 +- 0.008, BENCHMARKS 58).
PPO_CRITIC_LR_SCALE = 1.0
#: GRPO training a LoRA adapter only (rank 16 on every linear layer); LoRA's updates are smaller per step, so its
#: learning rate is LORA_LR_SCALE times the full fine-tuning one (``--lr``): 3x read best of 3x, 10x, 20x (seed 0).
LORA_VARIANT: dict[str, Any] = {"lora_rank": 16, "lora_alpha": 32.0}
LORA_LR_SCALE = 3.0
METHODS = (
    "grpo",
    "dapo",
    "r3",
    "r3-no-replay",
    "r3-no-reflection",
    "r3-no-ranking",
    "grpo-overlap",
    *ESTIMATOR_VARIANTS,
    "grpo-lora",
)
MAIN_METHODS = ("grpo", "dapo", "r3")
ABLATION_METHODS = ("r3", "r3-no-replay", "r3-no-reflection", "r3-no-ranking")
OVERLAP_METHODS = ("grpo", "grpo-overlap")  # on-policy vs one-step off-policy (overlap_generation)
ESTIMATOR_METHODS = ("grpo", *ESTIMATOR_VARIANTS)
LORA_METHODS = ("grpo", "grpo-lora")
PROBE_TASKS: tuple[dict[str, Any], ...] = (
    {"digits": 2},
    {"digits": 2, "operators": "+-"},
    {"digits": [1, 2]},
    {"digits": 2, "num_operands": 3},
    {"digits": 3},
)
RESULT_SECTIONS = ("rollout", "learner", "r3", "timers_s", "eval", "replay")
PLOT_METRICS = (
    "eval/accuracy",
    "rollout/accuracy",
    "rollout/zero_adv_frac_before",
    "rollout/zero_adv_frac",
    "rollout/response_len_mean",
)


# ------------------------------------------------------------------------------------------------------------------
# Task probe: how often groups collapse with the shipped model
# ------------------------------------------------------------------------------------------------------------------
def probe(model_path: str, group_size: int, max_new_tokens: int, n: int = 128) -> list[list[Any]]:
    """Per candidate task: sampled and greedy accuracy, fraction of groups all wrong / all right, solvable."""
    import numpy as np

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    engine = HFEngine(model_path)
    tok = engine.tokenizer
    stop = (tok.eos_token_id,)
    rows = []
    for task in PROBE_TASKS:
        env = ArithmeticEnv(**task, num_queries=n, seed=0)
        queries = [env.reset() for _ in range(n)]
        prompts = [tok(obs, add_special_tokens=False)["input_ids"] for obs, _ in queries]
        out = engine.generate(
            prompts, group_size, SamplingParams(max_new_tokens=max_new_tokens, seed=0, stop_token_ids=stop)
        )
        correct = np.array(
            [
                [common.grade_answer(c.text, info["gold"]) for c in comps]
                for (_, info), comps in zip(queries, out, strict=True)
            ]
        )
        greedy = engine.generate(
            prompts, 1, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stop)
        )
        g_acc = np.mean(
            [
                common.grade_answer(c[0].text, info["gold"])
                for (_, info), c in zip(queries, greedy, strict=True)
            ]
        )
        k = correct.sum(1)
        rows.append(
            [
                str(task),
                float(correct.mean()),
                float(g_acc),
                float(np.mean(k == 0)),
                float(np.mean(k == group_size)),
                float(np.mean(k > 0)),
            ]
        )
    return rows


# ------------------------------------------------------------------------------------------------------------------
# One run
# ------------------------------------------------------------------------------------------------------------------
def method_config(method: str, args, seed: int):
    from r3_rllib import R3Config
    from r3_rllib.core.reflection import COMPACT_REFLECTION_TEMPLATE

    variant: dict[str, Any] = {}
    if method in ("grpo", "grpo-overlap") or method in ESTIMATOR_VARIANTS:
        config = R3Config.grpo_preset()
        variant = ESTIMATOR_VARIANTS.get(method, {})
        if method == "ppo":
            variant = {**variant, "critic_lr": args.lr * PPO_CRITIC_LR_SCALE}
    elif method == "grpo-lora":
        config = R3Config.grpo_preset()
        variant = {**LORA_VARIANT, "lr": args.lr * LORA_LR_SCALE}
    elif method == "dapo":
        config = R3Config.dapo_preset()
    elif method.startswith("r3"):
        config = R3Config.r3_preset()
        off = {"r3-no-replay": "replay", "r3-no-reflection": "reflection", "r3-no-ranking": "ranking"}
        if method in off:
            config.r3(**{off[method]: False})
        elif method != "r3":
            raise ValueError(f"unknown method {method!r}; known: {METHODS}")
    else:
        raise ValueError(f"unknown method {method!r}; known: {METHODS}")
    return (
        config.environment(
            "arithmetic", env_config={**args.task, "num_queries": args.num_queries, "seed": seed}
        )
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=seed)
        .training(
            model_path=args.model,
            group_size=args.group_size,
            queries_per_iteration=args.queries,
            max_new_tokens=args.max_new_tokens,
            micro_batch_size=512,
            num_minibatches=args.minibatches,
            eval_interval=args.eval_interval,
            eval_env_config={"split": "test"},
            eval_num_queries=args.eval_queries,
            overlap_generation=method.endswith("-overlap"),
            dtype=args.dtype,
            **{"lr": args.lr, **variant},
        )
        .r3(
            replay_start_epoch=args.start_epoch,
            reflection_start_epoch=args.start_epoch,
            ranking_start_epoch=args.start_epoch,
            reflection_template=COMPACT_REFLECTION_TEMPLATE,
        )
    )


def flatten_result(result: dict) -> dict[str, float]:
    row: dict[str, float] = {}
    for section in RESULT_SECTIONS:
        for key, value in (result.get(section) or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                row[f"{section}/{key}"] = float(value)
    row["num_env_steps_sampled_lifetime"] = float(result.get("num_env_steps_sampled_lifetime", 0.0) or 0.0)
    return row


def write_progress(path: Path, rows: list[dict[str, float]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    keys: dict[str, None] = {"training_iteration": None, "time_total_s": None}
    for row in rows:
        keys.update(dict.fromkeys(row))
    with open(path / "progress.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(keys))
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if k not in row or math.isnan(row[k]) else row[k]) for k in keys})


def run_one(method: str, seed: int, args, out_dir: Path) -> dict[str, Any]:
    config = method_config(method, args, seed)
    t_build = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t_build
    rows: list[dict[str, float]] = []
    try:
        initial = algo.evaluate_heldout(args.eval_queries)["accuracy"]
        rows.append({"training_iteration": 0.0, "time_total_s": 0.0, "eval/accuracy": initial})
        total = 0.0
        for it in range(1, args.iterations + 1):
            t0 = time.perf_counter()
            result = algo.train()
            total += time.perf_counter() - t0
            row = flatten_result(result)
            row.update({"training_iteration": float(it), "time_total_s": total})
            if method == "dapo":
                # The fraction over every sampled group: the groups that passed the filter (before the batch is
                # trimmed to queries_per_iteration) against those sampled, from the sample counter.
                prev = rows[-1].get("num_env_steps_sampled_lifetime", 0.0)
                sampled_groups = (row["num_env_steps_sampled_lifetime"] - prev) / args.group_size
                if sampled_groups > 0:
                    passed = row.get("rollout/dynamic_sampling_passed", row.get("r3/groups", 0.0))
                    row["rollout/zero_adv_frac_before"] = 1.0 - passed / sampled_groups
            rows.append(row)
        final = algo.evaluate_heldout(args.eval_queries)["accuracy"]
    finally:
        algo.stop()
    rows[-1]["eval/accuracy"] = final  # the last iteration's row carries the final held-out accuracy
    write_progress(out_dir / "runs" / method / f"seed{seed}", rows)
    train = [r for r in rows[1:]]
    last = train[-min(len(train), 5) :]
    active = [r for r in train if r.get("rollout/dataset_epoch", 0.0) >= args.start_epoch] or train
    evals = [r["eval/accuracy"] for r in rows if not math.isnan(r.get("eval/accuracy", math.nan))]

    def mean_of(rs, key):
        vals = [r[key] for r in rs if key in r]
        return sum(vals) / len(vals) if vals else math.nan

    return {
        "method": method,
        "seed": seed,
        "initial_eval": initial,
        "final_eval": final,
        "best_eval": max(evals),
        "train_acc_last5": mean_of(last, "rollout/accuracy"),
        "zero_adv_before": mean_of(active, "rollout/zero_adv_frac_before"),
        "zero_adv_after": mean_of(active, "rollout/zero_adv_frac"),
        "response_len": mean_of(train, "rollout/response_len_mean"),
        "wall_s": total,
        "build_s": build_s,
        "fresh_samples": train[-1].get("num_env_steps_sampled_lifetime", math.nan),
        "reflection_prompts": sum(r.get("r3/reflection_prompts", 0.0) for r in train),
        "replay_samples": sum(r.get("r3/train_replayed", 0.0) for r in train),
        "ranked_groups": sum(r.get("r3/ranked_groups", 0.0) for r in train),
    }


# ------------------------------------------------------------------------------------------------------------------
# Seed means and plots
# ------------------------------------------------------------------------------------------------------------------
def write_means(out_dir: Path, method: str, seeds: Sequence[int]) -> Path | None:
    from r3_rllib.eval.plot import read_progress_csv

    runs = []
    for seed in seeds:
        path = out_dir / "runs" / method / f"seed{seed}" / "progress.csv"
        if path.is_file():
            runs.append(read_progress_csv(path))
    if not runs:
        return None
    import numpy as np

    n = min(len(r["training_iteration"]) for r in runs)
    keys = sorted(set.intersection(*(set(r) for r in runs)))
    rows = []
    for i in range(n):
        row = {}
        for k in keys:
            vals = np.array([r[k][i] for r in runs], dtype=float)
            row[k] = float(np.nanmean(vals)) if not np.all(np.isnan(vals)) else math.nan
        rows.append(row)
    dest = out_dir / "mean" / method
    write_progress(dest, rows)
    return dest


def plot(
    out_dir: Path,
    methods: Sequence[str],
    seeds: Sequence[int],
    groups: dict[str, Sequence[str]] | None = None,
) -> list[Path]:
    """Seed means of each method's runs, and one PNG per group of methods (`groups`: file name -> methods;
    default this bench's figures)."""
    from r3_rllib.eval.plot import plot_runs

    means = {m: write_means(out_dir, m, seeds) for m in methods}
    pngs = []
    groups = groups or {
        "learning_main.png": MAIN_METHODS,
        "learning_ablation.png": ABLATION_METHODS,
        "learning_overlap.png": OVERLAP_METHODS,
        "learning_estimators.png": ESTIMATOR_METHODS,
        "learning_lora.png": LORA_METHODS,
    }
    for name, group in groups.items():
        chosen = [m for m in group if means.get(m) is not None]
        if len(chosen) >= 1:
            pngs.append(
                plot_runs(
                    [means[m] for m in chosen],
                    out_dir / name,
                    metrics=PLOT_METRICS,
                    labels=[f"{m} (mean of {len(seeds)})" for m in chosen],
                )
            )
    return pngs


# ------------------------------------------------------------------------------------------------------------------
def tables(runs: list[dict[str, Any]], methods: Sequence[str]) -> str:
    by = {m: [r for r in runs if r["method"] == m] for m in methods}
    head = [
        "method",
        "held-out acc (final)",
        "best held-out",
        "train acc (last 5)",
        "zero-adv groups before",
        "zero-adv after R^3",
        "response len",
        "fresh samples",
        "wall s",
        "seeds",
    ]
    rows = []
    for m in methods:
        rs = by[m]
        if not rs:
            continue
        rows.append(
            [
                m,
                common.pm([r["final_eval"] for r in rs]),
                common.pm([r["best_eval"] for r in rs]),
                common.pm([r["train_acc_last5"] for r in rs]),
                common.pm([r["zero_adv_before"] for r in rs]),
                common.pm([r["zero_adv_after"] for r in rs]),
                common.pm([r["response_len"] for r in rs], "{:.2f}"),
                common.pm([r["fresh_samples"] for r in rs], "{:.0f}"),
                common.pm([r["wall_s"] for r in rs], "{:.0f}"),
                len(rs),
            ]
        )
    text = common.markdown_table(head, rows)
    initial = [r["initial_eval"] for r in runs]
    text += f"\n\nheld-out accuracy before training: {common.pm(initial)} (all runs)\n"
    if by.get("r3"):
        base = common.mean_std([r["final_eval"] for r in by["r3"]])[0]
        abl = []
        for m in ABLATION_METHODS:
            if by.get(m):
                acc = [r["final_eval"] for r in by[m]]
                abl.append(
                    [
                        m,
                        common.pm(acc),
                        f"{common.mean_std(acc)[0] - base:+.3f}",
                        f"{sum(r['replay_samples'] for r in by[m]) / len(by[m]):.0f}",
                        f"{sum(r['reflection_prompts'] for r in by[m]) / len(by[m]):.0f}",
                        f"{sum(r['ranked_groups'] for r in by[m]) / len(by[m]):.0f}",
                    ]
                )
        text += (
            "\nablation (final held-out accuracy; delta against full R^3; per-run totals of R^3's work):\n\n"
        )
        text += common.markdown_table(
            [
                "variant",
                "held-out acc",
                "delta vs R^3",
                "replayed samples trained",
                "reflection prompts",
                "ranked groups",
            ],
            abl,
        )
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=80)
    ap.add_argument("--model", default=None, help="policy folder (default: the shipped tiny model)")
    ap.add_argument("--digits", default="2", help="operand digits: N or MIN,MAX")
    ap.add_argument("--operators", default="+-")
    ap.add_argument("--num-operands", type=int, default=2)
    ap.add_argument("--num-queries", type=int, default=256, help="training pool size (epochs = pool / Q)")
    ap.add_argument("--queries", type=int, default=16, help="queries per iteration")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument(
        "--minibatches",
        type=int,
        default=1,
        help="optimizer steps per batch (> 1: later steps are off-policy)",
    )
    ap.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="the run's dtype (auto: fp32 on CPU; bfloat16: fp32 master weights, bf16 autocast and engine)",
    )
    ap.add_argument("--start-epoch", type=int, default=1, help="dataset epoch from which R^3's parts are on")
    ap.add_argument("--eval-interval", type=int, default=10)
    ap.add_argument("--eval-queries", type=int, default=256)
    ap.add_argument("--out", default="runs/bench_learning")
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument(
        "--replot", action="store_true", help="only redraw the PNGs from the progress files in --out"
    )
    ap.add_argument("--quick", action="store_true", help="GRPO, DAPO, R^3; one seed; 30 iterations")
    ap.add_argument("--smoke", action="store_true", help="CI: R^3, one seed, one iteration, no probe")
    args = ap.parse_args(argv)
    if args.quick:
        args.methods, args.seeds, args.iterations = ",".join(MAIN_METHODS), "0", 30
    if args.smoke:
        args.methods, args.seeds, args.iterations, args.no_probe = "r3", "0", 1, True
        args.num_queries, args.queries, args.group_size, args.eval_queries, args.eval_interval = 8, 4, 4, 8, 1
        args.start_epoch = 0
    digits = [int(x) for x in args.digits.split(",")]
    args.task = {
        "digits": digits[0] if len(digits) == 1 else digits,
        "operators": args.operators,
        "num_operands": args.num_operands,
    }
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common.setup_process()
    common.pickle_by_value(sys.modules[__name__], common)
    args.model = args.model or common.tiny_model_path()
    common.print_header("bench_learning", args)
    out_dir = Path(args.out)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"unknown method {m!r}; known: {', '.join(METHODS)}")
    if args.replot:
        print("plots: " + ", ".join(str(p) for p in plot(out_dir, methods, seeds)))
        return 0
    if not args.no_probe:
        print("## task probe (shipped model, G samples per query at temperature 1, 128 queries each)")
        print(
            common.markdown_table(
                [
                    "task",
                    "sample acc",
                    "greedy acc",
                    "groups all wrong",
                    "groups all right",
                    "queries solvable",
                ],
                probe(args.model, args.group_size, args.max_new_tokens),
            )
        )
        print(flush=True)
    started = common.start_ray()
    runs: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    try:
        for seed in seeds:  # seeds outermost: a cut-short run still has every method at the first seeds
            for method in methods:
                t0 = time.perf_counter()
                runs.append(run_one(method, seed, args, out_dir))
                r = runs[-1]
                print(
                    f"[{method} seed {seed}] held-out {r['initial_eval']:.3f} -> {r['final_eval']:.3f}, "
                    f"train acc {r['train_acc_last5']:.3f}, zero-adv {r['zero_adv_before']:.2f} -> "
                    f"{r['zero_adv_after']:.2f}, {r['wall_s']:.0f}s train + {r['build_s']:.0f}s build "
                    f"({time.perf_counter() - t0:.0f}s; {common.load_note()})",
                    flush=True,
                )
    finally:
        common.stop_ray(started)
    print(
        f"\n## results ({len(seeds)} seeds, {args.iterations} iterations, task {args.task}, "
        f"{time.perf_counter() - t_all:.0f}s in total)\n"
    )
    print(tables(runs, methods))
    pngs = plot(out_dir, methods, seeds)
    print("\nplots: " + ", ".join(str(p) for p in pngs))
    common.write_json(
        out_dir / "summary.json",
        {
            "args": {k: v for k, v in vars(args).items()},
            "runs": runs,
            "machine": common.machine(),
            "versions": common.versions(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
