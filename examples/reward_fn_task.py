"""Your own task from a dataset and a reward function, as TRL's GRPOTrainer takes them: GRPO on the shipped tiny
model, 2-digit sums written as a JSONL file, scored by `my_rewards.exact_match` (beside this script).

    python examples/reward_fn_task.py                   # 20 iterations (~45 s on a 2-core CPU): one progress line
                                                        # per iteration, held-out accuracy every 5; exports the model
    python examples/reward_fn_task.py --quick           # 2 tiny iterations (a smoke test)
    python examples/reward_fn_task.py --data my.jsonl   # your rows: {"question": "12+7=", "answer": "19"} per line

Then score the exported model on the held-out rows (run from this folder, so `my_rewards` is importable):

    r3 eval --env reward_fn --model runs/reward_fn_task/model --greedy \\
        --env-config '{"data": "runs/reward_fn_task/sums.jsonl", "prompt": "{question}", "test_size": 0.2}' \\
        --set reward=my_rewards:exact_match --set apply_chat_template=none

The whole task is the `environment(...)` call in `build_config`: the rows, the prompt (a column or a template over
the columns), and the reward function (a "module:function" path, the run-file form; a function object works too in
Python, and is pickled to reach the EnvRunners). 20 % of the rows are held out (`test_size`), the same rows in every
runner and run, and `eval_interval` scores them greedily during training (`eval/accuracy`).

Measured with the defaults (400 sums, 80 held out; 2026-11-26, 2-core CPU, 44 s): training accuracy 0.33 at the first
iteration, 0.49 at the 20th; held-out accuracy (greedy, all 80) 0.44 at iteration 5, 0.54 at 15 and 20.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

ENV_CONFIG = {
    "prompt": "{question}",  # a template over the row's columns; "question" alone would name the column
    "reward": "my_rewards:exact_match",  # reward(prompt, completion, **row) -> float | dict
    "test_size": 0.2,  # held-out rows (the split the held-out evaluation scores)
    "apply_chat_template": "none",  # the tiny model reads plain "12+7="; an instruct model keeps "auto"
}


def write_sums(path: Path, num_rows: int, seed: int = 0) -> Path:
    """`num_rows` distinct 2-digit sums as JSONL rows {"question": "12+7=", "answer": "19"}."""
    pairs = random.Random(seed).sample([(a, b) for a in range(10, 100) for b in range(10, 100)], num_rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in pairs)
    )
    return path


def build_config(data: str, *, quick: bool, model_path: str | None = None):
    from r3_rllib import R3Config

    sizes = dict(group_size=4, queries_per_iteration=8, micro_batch_size=32, eval_num_queries=16)
    if not quick:
        sizes = dict(group_size=8, queries_per_iteration=32, micro_batch_size=128, eval_num_queries=200)
    return (
        R3Config.grpo_preset()
        .environment("reward_fn", env_config={"data": data, **ENV_CONFIG})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(
            model_path=model_path,  # None: the shipped tiny model (warm-started on 2-digit addition)
            max_new_tokens=4,  # up to 3 digits and the end-of-sequence token
            temperature=1.0,
            lr=1e-4,
            num_minibatches=2,
            eval_interval=2 if quick else 5,
            **sizes,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=None, help="default 20; 2 with --quick")
    parser.add_argument("--quick", action="store_true", help="tiny batches, 2 iterations")
    parser.add_argument(
        "--data", default=None, help="a JSONL of question/answer rows (default: 2-digit sums)"
    )
    parser.add_argument(
        "--out", default="runs/reward_fn_task", help="folder for the data and the exported model"
    )
    parser.add_argument("--model", default=None, help="policy folder (default: the shipped tiny model)")
    parser.add_argument("--num-cpus", type=float, default=None, help="logical CPUs of the local Ray")
    args = parser.parse_args(argv)
    iterations = args.iterations or (2 if args.quick else 20)
    out = Path(args.out).resolve()
    data = args.data or str(write_sums(out / "sums.jsonl", 400))

    import ray

    from r3_rllib.ray_session import init_ray

    init_ray(
        None, num_cpus=args.num_cpus, log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}
    )
    algo = build_config(data, quick=args.quick, model_path=args.model).build_algo()
    held_out = math.nan
    try:
        for _ in range(iterations):  # each iteration prints its progress line
            result = algo.train()
            measured = (result.get("eval") or {}).get("accuracy", math.nan)  # nan between evaluations
            held_out = held_out if math.isnan(measured) else measured
        model = algo.export_policy(out / "model")
        print(f"held-out accuracy {held_out:.3f} at iteration {result['training_iteration']}", flush=True)
        print(f"exported the policy to {model}", flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
