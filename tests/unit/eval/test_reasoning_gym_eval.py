"""`r3 eval --reasoning-gym TASKS`: held-out reasoning-gym problems graded by each task's verifier, pass@1 over n."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

pytest.importorskip("reasoning_gym")

from r3_rllib.engines.base import Completion, GenerationEngine  # noqa: E402
from r3_rllib.envs.reasoning_gym import ReasoningGymEnv  # noqa: E402
from r3_rllib.eval.evaluate import add_eval_args, run_eval  # noqa: E402
from r3_rllib.models import default_tiny_model_path  # noqa: E402
from r3_rllib.models.tiny import load_tokenizer  # noqa: E402


class KnowsAnswers(GenerationEngine):
    """Answers each prompt's question right in its first `right` samples, wrong in the rest."""

    def __init__(self, tokenizer, answers: dict[str, str], right: int):
        self.tokenizer, self.answers, self.right = tokenizer, answers, right

    def generate(self, prompt_ids, n, params):
        out = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            gold = next(a for q, a in self.answers.items() if q in text)
            out.append(
                [
                    Completion(
                        list(ids),
                        [1, 2],
                        np.zeros(2),
                        np.zeros(2),
                        "stop",
                        text=f"<answer>{gold if j < self.right else 'no'}</answer>",
                    )
                    for j in range(n)
                ]
            )
        return out

    def update_weights(self, named_tensors, version):
        pass

    def shutdown(self):
        pass


def test_cli_reports_pass_at_1_per_task_on_held_out_problems(tmp_path):
    model = default_tiny_model_path()
    tokenizer = load_tokenizer(model)
    answers = {}
    for task in ("basic_arithmetic", "leg_counting"):
        env = ReasoningGymEnv(tasks=task, split="test", test_size=5, seed=0)
        answers |= {e["question"]: str(e["answer"]) for e in env.entries}
    argv = [
        "--model",
        str(model),
        "--reasoning-gym",
        "basic_arithmetic,leg_counting",
        "--n",
        "4",
        "--max-problems",
        "5",
        "--out",
        str(tmp_path / "rg.json"),
        "--quiet",
    ]
    args = add_eval_args(argparse.ArgumentParser()).parse_args(argv)
    code = run_eval(args, engine_factory=lambda *a, **k: KnowsAnswers(tokenizer, answers, right=1))
    assert code == 0
    report = json.loads((tmp_path / "rg.json").read_text())
    rows = report["benchmarks"]
    assert set(rows) == {"rg:basic_arithmetic", "rg:leg_counting"}
    for row in rows.values():  # 1 of 4 samples right on every problem: pass@1 = 1/4, pass@4 = 1
        assert row["num_problems"] == 5 and row["pass_at_1"] == 0.25 and row["pass_at_n"] == 1.0


def test_cli_evaluates_with_the_training_runs_env_options(tmp_path):
    """--reasoning-gym-env: the task's options and few-shot examples as in training; the prompts hold the examples
    and the problems come from the task at those options."""
    model = default_tiny_model_path()
    tokenizer = load_tokenizer(model)
    config = {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 20}
    env = ReasoningGymEnv(tasks={"gcd": {"config": config}}, split="test", test_size=4, seed=0, few_shot=2)
    answers = {e["question"]: str(e["answer"]) for e in env.entries}
    seen: list[str] = []

    class Recording(KnowsAnswers):
        def generate(self, prompt_ids, n, params):
            seen.extend(self.tokenizer.decode(ids) for ids in prompt_ids)
            return super().generate(prompt_ids, n, params)

    options = json.dumps({"few_shot": 2, "task_config": {"gcd": config}})
    argv = [
        "--model",
        str(model),
        "--reasoning-gym",
        "gcd",
        "--reasoning-gym-env",
        options,
        "--n",
        "2",
        "--max-problems",
        "4",
        "--out",
        str(tmp_path / "rg.json"),
        "--quiet",
    ]
    args = add_eval_args(argparse.ArgumentParser()).parse_args(argv)
    assert run_eval(args, engine_factory=lambda *a, **k: Recording(tokenizer, answers, right=2)) == 0
    report = json.loads((tmp_path / "rg.json").read_text())
    assert report["benchmarks"]["rg:gcd"]["pass_at_1"] == 1.0
    assert len(seen) == 4 and all(env.examples[0]["question"] in p for p in seen)
    with pytest.raises(ValueError, match="set by the evaluation itself"):
        from r3_rllib.eval.reasoning_gym_eval import evaluate_reasoning_gym

        evaluate_reasoning_gym(None, tokenizer, ["gcd"], env_options={"split": "train"})
