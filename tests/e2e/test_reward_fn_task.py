"""A user's path with a dataset and a reward function, end to end in fresh processes, as a user runs it: the example
script (examples/reward_fn_task.py --quick: 2 iterations of GRPO on the tiny model over 2-digit sums written as JSONL,
through `.environment("reward_fn", ...)` with the reward function named "my_rewards:exact_match", a module beside
the script that the EnvRunners import by name), then `r3 eval --env reward_fn` on the exported model: the held-out
rows, greedy, scored by the same reward function. ~30 s on 2 idle cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from repo_paths import REPO

EXAMPLES = REPO / "examples"


def _run(argv: list[str], cwd, timeout: float = 240) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_reward_fn_task_trains_exports_and_evaluates(tmp_path):
    out = tmp_path / "run"
    script = EXAMPLES / "reward_fn_task.py"
    printed = _run(
        [sys.executable, str(script), "--quick", "--out", str(out), "--num-cpus", "4"], cwd=tmp_path
    )
    held_out = float(re.search(r"held-out accuracy ([0-9.]+) at iteration 2", printed).group(1))
    assert (out / "model" / "config.json").is_file() and (out / "sums.jsonl").is_file()

    # r3 eval from the examples folder (my_rewards.py is there): the first 16 held-out rows (of 80: 20 % of 400),
    # greedy, which the in-training evaluation scored with the same weights: the same accuracy.
    config = json.dumps({"data": str(out / "sums.jsonl"), "prompt": "{question}", "test_size": 0.2})
    argv = [
        sys.executable,
        "-m",
        "r3_rllib.cli",
        "eval",
        "--env",
        "reward_fn",
        "--model",
        str(out / "model"),
        "--greedy",
        "--max-problems",
        "16",
        "--env-config",
        config,
        "--set",
        "reward=my_rewards:exact_match",
        "--set",
        "apply_chat_template=none",
        "--out",
        str(tmp_path / "eval.json"),
    ]
    printed = _run(argv, cwd=EXAMPLES)
    report = json.loads((tmp_path / "eval.json").read_text())
    row = report["benchmarks"]["env:reward_fn"]
    assert row["num_problems"] == 16 and row["n"] == 1
    assert row["pass_at_1"] == held_out and row["mean_reward"] == held_out
    assert all(q.startswith("sums:") for q in row["problem_ids"])
    assert report["config"]["env_config"]["reward"] == "my_rewards:exact_match"
    assert "| env:reward_fn | 16 |" in printed and "env:reward_fn: mean reward" in printed
