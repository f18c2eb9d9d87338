"""Learning through the rollout gateway with a plain OpenAI-SDK agent program (``env: agent``): 2-digit sums, the
shipped tiny model, GRPO; training accuracy before and after, and the same run again to show it is reproducible.

    python bench/bench_agent_learning.py                      # 16 iterations, seed 0, run twice
    python bench/bench_agent_learning.py --iterations 8 --seed 1 --runs 1

The agent (:func:`sums_agent`) asks ``"a+b="`` through ``client.chat.completions.create`` and returns reward 1.0
when the reply starts with the sum. The policy is the shipped tiny model (warm-started on 2-digit addition) saved with
a chat template that renders the messages' contents alone, so the gateway's chat prompt is the ``"12+7="`` the model
knows. GRPO, one EnvRunner on the HF engine and a local learner, G = 8, 8 queries per iteration, T = 1.0, lr 1e-4,
seeded (``--seed``: the run's seed and the task pool's). "before" is the training accuracy of the first ``--window``
iterations, "after" of the last ones (each iteration's samples, graded by the agent).

Each run's batches go when every open session has a call waiting (``gateway_max_batch_wait_s`` is a fallback that
does not fire here), so a second run with the same seed samples the same tokens and prints the same accuracies: the
script says whether the runs agree, iteration by iteration.

Measured (2026-11-26, 2 CPU cores shared with other jobs; ``python bench/bench_agent_learning.py``, seed 0, 16
iterations, lr 1e-4): both runs printed the same numbers, every iteration (held-out greedy accuracy 0.438 before and
0.375 after; training accuracy 0.262 over the first 4 iterations, 0.336 over the last 4; ~40 s a run). No reliable
learning effect at this budget: over 40 iterations (``--iterations 40 --window 8 --runs 1``) training accuracy went
0.275 -> 0.344 while held-out greedy accuracy went 0.438 -> 0.328, and lr 5e-4 collapsed training accuracy to 0-0.05
by iteration 7. The bench shows the agent path trains reproducibly; a task the tiny model learns through an agent is
still to be found.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import common

#: Tasks held out for the greedy evaluation before and after training.
HELD_OUT = 64
#: A chat template that writes the messages' contents only: the tiny model's prompts are "12+7=".


def sums_agent():
    """The agent program (built here so it reaches the runners by value): one chat call on ``"a+b="``, reward 1.0
    when the reply starts with the sum."""

    async def run(client, task, model):
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4, timeout=120
        )
        text = (reply.choices[0].message.content or "").strip()
        digits = text[: len(text) - len(text.lstrip("0123456789"))] if text else ""
        return float(digits == task["answer"])

    return run


def sums_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` 2-digit sums, drawn with ``seed``."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        tasks.append({"id": f"s{i}", "question": f"{a}+{b}=", "answer": str(a + b)})
    return tasks


def build_config(model_path: str, args: argparse.Namespace) -> Any:
    env_config = {
        "run": sums_agent(),
        "tasks": sums_tasks(256 + HELD_OUT, args.seed),
        "test_size": HELD_OUT,
        "seed": args.seed,
    }
    return common.sums_agent_config(
        "agent",
        env_config,
        model_path,
        seed=args.seed,
        runners=1,
        group_size=args.group_size,
        queries=args.queries,
        lr=args.lr,
    )


def run_once(model_path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One training run: held-out greedy accuracy before and after, per-iteration training accuracy and trained
    tokens, and the wall time."""
    algo = build_config(model_path, args).build_algo()
    start, accuracy, tokens = time.perf_counter(), [], []
    try:
        heldout_before = float(algo.evaluate_heldout(HELD_OUT)["accuracy"])
        for i in range(args.iterations):
            result = algo.train()
            accuracy.append(float(result["rollout"]["accuracy"]))
            tokens.append(float(result["learner"]["trained_tokens"]))
            print(f"  iter {i + 1}: accuracy {accuracy[-1]:.3f}, trained tokens {tokens[-1]:.0f}", flush=True)
        heldout_after = float(algo.evaluate_heldout(HELD_OUT)["accuracy"])
    finally:
        algo.stop()
    k = min(args.window, max(1, len(accuracy) // 2))
    return {
        "accuracy": accuracy,
        "trained_tokens": tokens,
        "before": sum(accuracy[:k]) / k,
        "after": sum(accuracy[-k:]) / k,
        "heldout_before": heldout_before,
        "heldout_after": heldout_after,
        "seconds": time.perf_counter() - start,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=16)
    p.add_argument("--window", type=int, default=4, help="iterations averaged for 'before' and 'after'")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=2, help="identical runs (the second checks reproducibility)")
    p.add_argument("--out", default="runs/bench_agent_learning")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true", help="one run of one iteration, 2 queries x 2")
    args = p.parse_args(argv)
    if args.smoke:
        args.iterations, args.queries, args.group_size, args.runs, args.window = 1, 2, 2, 1, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.setup_process()
    common.print_header("agent env: GRPO on 2-digit sums through the rollout gateway", args)
    model_path = common.chat_tiny_model(Path(args.out))
    started = common.start_ray(num_cpus=2)
    try:
        runs = [run_once(model_path, args) for _ in range(args.runs)]
    finally:
        common.stop_ray(started)
    keys = ("before", "after", "heldout_before", "heldout_after")
    rows = [[i + 1, *(f"{r[k]:.3f}" for k in keys), f"{r['seconds']:.0f}"] for i, r in enumerate(runs)]
    headers = ["run", "train before", "train after", "held-out before", "held-out after", "seconds"]
    print(common.markdown_table(headers, rows))
    if len(runs) > 1:
        same = all(r[k] == runs[0][k] for r in runs for k in ("accuracy", "trained_tokens", *keys[2:]))
        print(f"runs identical (held-out accuracies; accuracy and trained tokens, every iteration): {same}")
    common.write_json(args.json, {"args": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
