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
            out.append([
                Completion(list(ids), [1, 2], np.zeros(2), np.zeros(2), "stop",
                           text=f"<answer>{gold if j < self.right else 'no'}</answer>")
                for j in range(n)
            ])  # fmt: skip
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
    argv = ["--model", str(model), "--reasoning-gym", "basic_arithmetic,leg_counting", "--n", "4",
            "--max-problems", "5", "--out", str(tmp_path / "rg.json"), "--quiet"]  # fmt: skip
    args = add_eval_args(argparse.ArgumentParser()).parse_args(argv)
    code = run_eval(args, engine_factory=lambda *a, **k: KnowsAnswers(tokenizer, answers, right=1))
    assert code == 0
    report = json.loads((tmp_path / "rg.json").read_text())
    rows = report["benchmarks"]
    assert set(rows) == {"rg:basic_arithmetic", "rg:leg_counting"}
    for row in rows.values():  # 1 of 4 samples right on every problem: pass@1 = 1/4, pass@4 = 1
        assert row["num_problems"] == 5 and row["pass_at_1"] == 0.25 and row["pass_at_n"] == 1.0
