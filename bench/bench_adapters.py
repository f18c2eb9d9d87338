"""Learning through the env adapters: one short GRPO run per adapter (OpenEnv, GEM, verifiers, MCP) on 2-digit sums, each
rollout an agent run through the EnvRunners' rollout gateways, training accuracy before and after.

    python bench/bench_adapters.py                                  # openenv, gem, verifiers, mcp, native; 20 iterations each
    python bench/bench_adapters.py --adapters gem --iterations 20 --seed 1
    python bench/bench_adapters.py --smoke                          # one adapter, two iterations (CI)

Policy: the shipped tiny model (warm-started on 2-digit addition) with a chat template that renders the messages'
contents alone, so the gateway's chat prompt is the ``"12+7="`` the model knows. Every adapter wraps the same task,
2-digit sums with reward 1.0 for the right sum at the start of the reply:

- ``openenv``: examples/openenv_sums.py's ``SumsEnvironment`` (an OpenEnv ``Environment``, in-process);
- ``gem``: :class:`GemSums` below, a GEM env registered on each EnvRunner through ``entry_point``;
- ``verifiers``: examples/vf_sums.py's verifiers taskset (its rubric's reward), run by verifiers' episode machinery
  with r3-rllib's in-process harness;
- ``mcp``: the MCP adapter (``env: mcp``, examples/mcp_calculator_server.py's calculator tools in each chat
  request) on the OpenEnv sums written as MathEnv data, with the bare question as the prompt
  (``prompt_template: "{problem}"``) and ``answer_format: "plain"`` (the final reply, stripped, is the answer,
  graded by MathEnv's grader as if boxed: the right sum as the whole reply): the tiny model answers without tool
  calls or ``\\boxed{}``, so each run is one turn;
- ``native`` (the reference, no adapter and no gateway): the same sums as the ``reward_fn`` text env (plain prompt,
  examples/my_rewards.py's exact match), rolled out by the single-step kind.

GRPO, 2 EnvRunners on HF engines and a local learner, G = 8, 32 queries per iteration, T = 1.0, seeded
(``--seed``: the runs' and the task pools' seed). "before" is the training accuracy of the first ``--window``
iterations, "after" of the last ones (the samples of those iterations, graded by the env). The runners import the
user modules (examples/, bench/) through ``PYTHONPATH``, as a run file's ``PYTHONPATH=examples`` gives them.

Measured (2026-11-26, 2-core CPU shared with other work, ``python bench/bench_adapters.py --adapters
native,openenv,gem,verifiers``, seed 0; accuracy = mean of 3 iterations): native 0.286 -> 0.428 (8 s of training),
openenv 0.322 -> 0.457 (123 s), gem 0.322 -> 0.457 (113 s: the same sums, seeds and samples as openenv, so the same
tokens), verifiers 0.283 -> 0.388 (278 s; its own 256 sums). The adapters learn as the native env does; an
adapter's iteration costs more (an HTTP agent run per sample, one engine call per batch of runs in lockstep).
Later the same day, load average 6-26 (a full test run beside it), ``python bench/bench_adapters.py --adapters
native,mcp``, seed 0: native 0.286 -> 0.428 again (12 s), mcp 0.292 -> 0.414 (520 s; iterations of 13-42 s under
that load). At equal load (``--adapters openenv,mcp --iterations 3``) openenv took 75 s and mcp 63 s, the mcp
run repeating the 20-iteration run's first accuracies (0.324, 0.336, 0.215): its cost is the load's, not the adapter's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import common

REPO = Path(__file__).resolve().parents[1]
#: A chat template that writes the messages' contents only: the tiny model's prompts are "12+7=".
ADAPTERS = ("openenv", "gem", "verifiers", "mcp", "native")
NUM_TASKS = 256
DEFAULT_OUT = "runs/bench_adapters"


def leading_number(text: str) -> str:
    """The digits ``text`` starts with (after spaces)."""
    digits = ""
    for ch in text.strip():
        if not ch.isdigit():
            break
        digits += ch
    return digits


def _gem_base() -> type:
    import gem

    return gem.Env


class GemSums(_gem_base()):
    """A GEM env of 2-digit sums: ``reset(seed)`` asks ``"a+b="``, one ``step`` grades the reply (reward 1.0 for
    the right sum at its start) and ends the episode."""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        self.a, self.b = rng.randint(10, 99), rng.randint(10, 99)
        return f"{self.a}+{self.b}=", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        right = leading_number(action) == str(self.a + self.b)
        return "", 1.0 if right else 0.0, True, False, {}


def adapter_env(adapter: str, seed: int, data_dir: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The env name and env_config of ``adapter``'s sums task (``mcp``: its data file is written to ``data_dir``)."""
    order = {"seed": seed, "shuffle": True}
    if adapter == "openenv":
        return "openenv", {
            "environment": "openenv_sums:SumsEnvironment",
            "action": "openenv_sums:SumAction",
            "action_field": "answer",
            "observation_field": "question",
            "num_tasks": NUM_TASKS,
            "max_turns": 1,
            **order,
        }
    if adapter == "gem":
        return "gem", {
            "env_id": "bench:Sums-v0",
            "entry_point": "bench_adapters:GemSums",
            "num_tasks": NUM_TASKS,
            "max_turns": 1,
            **order,
        }
    if adapter == "verifiers":
        return "verifiers", {"env": {"taskset": {"id": "vf_sums"}}, **order}
    if adapter == "mcp":
        return "mcp", {
            "data": str(write_sums_jsonl(data_dir or Path(DEFAULT_OUT))),
            "problem_key": "question",
            "prompt_template": "{problem}",
            "answer_format": "plain",
            "server": {
                "command": sys.executable,
                "args": [str(REPO / "examples" / "mcp_calculator_server.py")],
            },
            "trust_server": True,
            "max_turns": 1,
            **order,
        }
    if adapter == "native":
        return "reward_fn", {
            "data": [{"question": q, "answer": a} for q, a in sums_rows()],
            "prompt": "{question}",
            "reward": "my_rewards:exact_match",
            "test_size": 0,
            "apply_chat_template": "none",
            **order,
        }
    raise ValueError(f"unknown adapter {adapter!r}; one of {ADAPTERS}")


def sums_rows() -> list[tuple[str, str]]:
    """The OpenEnv and GEM tasks' sums (reset seeds 0 .. NUM_TASKS-1) as (question, answer) rows."""
    rows = []
    for seed in range(NUM_TASKS):
        rng = random.Random(seed)
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append((f"{a}+{b}=", str(a + b)))
    return rows


def write_sums_jsonl(data_dir: Path) -> Path:
    """:func:`sums_rows` as a ``{"question", "answer"}`` jsonl file in ``data_dir`` (absolute: the runners read it)."""
    path = data_dir.resolve() / "mcp_sums.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in sums_rows()))
    return path


def build_config(adapter: str, model_path: str, args: argparse.Namespace) -> Any:
    env, env_config = adapter_env(adapter, args.seed, Path(args.out))
    return common.sums_agent_config(
        env,
        env_config,
        model_path,
        seed=args.seed,
        runners=2,
        group_size=args.group_size,
        queries=args.queries,
        lr=args.lr,
    )


def run_adapter(adapter: str, model_path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One training run; per-iteration training accuracy and reward, and the wall time."""
    algo = build_config(adapter, model_path, args).build_algo()
    start, accuracy, reward = time.perf_counter(), [], []
    try:
        for i in range(args.iterations):
            rollout = algo.train()["rollout"]
            accuracy.append(float(rollout["accuracy"]))
            reward.append(float(rollout["reward_mean"]))
            print(
                f"  {adapter} iter {i + 1}: accuracy {accuracy[-1]:.3f}, reward {reward[-1]:.3f}", flush=True
            )
    finally:
        algo.stop()
    k = min(args.window, max(1, len(accuracy) // 2))
    return {
        "accuracy": accuracy,
        "reward": reward,
        "before": sum(accuracy[:k]) / k,
        "after": sum(accuracy[-k:]) / k,
        "seconds": time.perf_counter() - start,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--adapters", default=",".join(ADAPTERS), help="comma-separated, of " + ", ".join(ADAPTERS)
    )
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--window", type=int, default=3, help="iterations averaged for 'before' and 'after'")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--queries", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true", help="openenv, 2 iterations, G = 2, 2 queries")
    args = p.parse_args(argv)
    if args.smoke:
        args.adapters, args.iterations, args.group_size, args.queries = "openenv", 2, 2, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    adapters = [a.strip() for a in args.adapters.split(",") if a.strip()]
    for a in adapters:
        adapter_env(a, 0, Path(args.out))  # an unknown adapter fails before Ray starts
    common.setup_process()
    # The runners import the user modules (examples/openenv_sums.py, vf_sums.py, this file) from PYTHONPATH.
    paths = [str(REPO / "examples"), str(REPO / "bench"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    sys.path[:0] = paths[:2]
    common.print_header("env adapters: GRPO on 2-digit sums through the rollout gateway", args)
    model_path = common.chat_tiny_model(Path(args.out))
    started = common.start_ray(num_cpus=3)
    try:
        results = {a: run_adapter(a, model_path, args) for a in adapters}
    finally:
        common.stop_ray(started)
    rows = [
        [
            a,
            f"{r['before']:.3f}",
            f"{r['after']:.3f}",
            f"{r['after'] - r['before']:+.3f}",
            f"{r['seconds']:.0f}",
        ]
        for a, r in results.items()
    ]
    print(common.markdown_table(["adapter", "accuracy before", "after", "change", "seconds"], rows))
    common.write_json(args.json, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
