"""`r3 eval --env NAME`: any text env's held-out queries, scored by the env, pass@1 over n (a stub engine that
answers the first `right` samples of each prompt correctly), with the env built before the engine."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

from r3_rllib.engines.base import Completion, GenerationEngine
from r3_rllib.eval.evaluate import add_eval_args, run_eval
from r3_rllib.models import default_tiny_model_path
from r3_rllib.models.tiny import load_tokenizer

ENVS_TESTS = Path(__file__).resolve().parents[1] / "envs"  # reward_fns.py
ROWS = [
    {"question": f"{a}+{b}=", "answer": str(a + b)}
    for a, b in [(12, 7), (3, 4), (10, 10), (5, 6), (8, 1), (2, 2)]
]


class Sums(GenerationEngine):
    """Answers "a+b=" prompts: the first `right` samples with the sum and the eos token, the others with "0"."""

    def __init__(self, tokenizer, right: int):
        self.tokenizer, self.right, self.params = tokenizer, right, []

    def generate(self, prompt_ids, n, params):
        self.params.append(params)
        out = []
        for ids in prompt_ids:
            a, b = self.tokenizer.decode(ids).rstrip("=").split("+")
            texts = [f"{int(a) + int(b)}<eos>" if j < self.right else "0" for j in range(n)]
            out.append(
                [
                    Completion(list(ids), [5] * len(t), np.zeros(len(t)), np.zeros(len(t)), "stop", text=t)
                    for t in texts
                ]
            )
        return out

    def update_weights(self, named_tensors, version):
        pass

    def shutdown(self):
        pass


@pytest.fixture
def data(tmp_path, monkeypatch) -> str:
    monkeypatch.syspath_prepend(str(ENVS_TESTS))
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def parse(argv):
    return add_eval_args(argparse.ArgumentParser()).parse_args(argv)


def test_reward_fn_env_scored_on_its_held_out_rows(data, tmp_path, capsys):
    tokenizer = load_tokenizer(default_tiny_model_path())
    engine = Sums(tokenizer, right=1)
    config = json.dumps({"data": data, "prompt": "{question}", "test_size": 2, "apply_chat_template": "none"})
    argv = [
        "--model",
        str(default_tiny_model_path()),
        "--env",
        "reward_fn",
        "--env-config",
        config,
        "--set",
        "reward=reward_fns:exact_match",
        "--n",
        "4",
        "--out",
        str(tmp_path / "r.json"),
    ]
    assert run_eval(parse(argv), engine_factory=lambda *a, **k: engine) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    row = report["benchmarks"]["env:reward_fn"]
    # The 2 held-out rows of 6, 1 of 4 samples right each: pass@1 = 1/4, pass@4 = 1, mean reward 1/4.
    assert row["num_problems"] == 2 and row["n"] == 4
    assert row["pass_at_1"] == 0.25 and row["pass_at_n"] == 1.0 and row["mean_reward"] == 0.25
    assert len(set(row["problem_ids"])) == 2 and set(row["problem_ids"]) < {f"sums:{i}" for i in range(6)}
    assert (
        report["config"]["env_config"]["reward"] == "reward_fns:exact_match"
        and report["config"]["split"] == "test"
    )
    assert engine.params[0].temperature == 0.6 and engine.params[0].max_new_tokens == 1024  # --env's default
    assert "env:reward_fn: mean reward 0.2500 over 2 queries x 4" in capsys.readouterr().out


def test_greedy_is_one_response_at_temperature_zero(data, tmp_path):
    tokenizer = load_tokenizer(default_tiny_model_path())
    engine = Sums(tokenizer, right=1)
    argv = [
        "--model",
        str(default_tiny_model_path()),
        "--env",
        "reward_fn",
        "--greedy",
        "--max-new-tokens",
        "6",
        "--env-config",
        json.dumps(
            {"data": data, "prompt": "{question}", "reward": "reward_fns:exact_match", "test_size": 0.5}
        ),
        "--out",
        str(tmp_path / "r.json"),
    ]
    assert run_eval(parse(argv), engine_factory=lambda *a, **k: engine) == 0
    row = json.loads((tmp_path / "r.json").read_text())["benchmarks"]["env:reward_fn"]
    assert row["n"] == 1 and row["num_problems"] == 3 and row["pass_at_1"] == 1.0
    assert engine.params[0].temperature == 0.0 and engine.params[0].max_new_tokens == 6


def test_a_built_in_and_a_module_class_env(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS_TESTS))
    tokenizer = load_tokenizer(default_tiny_model_path())
    for env in ("arithmetic", "reward_fns:SmallArithmetic"):
        out = tmp_path / f"{env.replace(':', '_')}.json"
        argv = [
            "--model",
            str(default_tiny_model_path()),
            "--env",
            env,
            "--n",
            "2",
            "--max-problems",
            "3",
            "--env-config",
            json.dumps({"digits": 1, "operators": "+", "num_queries": 20}) if env == "arithmetic" else "{}",
            "--out",
            str(out),
        ]
        assert run_eval(parse(argv), engine_factory=lambda *a, **k: Sums(tokenizer, right=2)) == 0
        row = json.loads(out.read_text())["benchmarks"][f"env:{env}"]
        assert row["num_problems"] == 3 and row["pass_at_1"] == 1.0


def never_called(*args, **kwargs):
    raise AssertionError("the engine was built before the env's errors were reported")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--env", "reward_fm"], "unknown text env 'reward_fm'.*did you mean 'reward_fn'"),
        (
            ["--env", "reward_fn", "--set", "reward=no_such_module_xyz:f", "--set", "data=[{q: a}]"],
            "cannot import module 'no_such_module_xyz'",
        ),
        (
            [
                "--env",
                "reward_fn",
                "--set",
                "reward=reward_fns:exact_match",
                "--set",
                "data=[{q: a}]",
                "--set",
                "prompt=q",
            ],
            "test_size=None holds none|holds out 1 of 1 rows",
        ),
        (["--env", "reward_fn", "--set", "nonsense"], "--set expects KEY=VALUE"),
    ],
)
def test_env_errors_come_before_the_engine(data, extra, message, capsys):
    assert (
        run_eval(parse(["--model", str(default_tiny_model_path()), *extra]), engine_factory=never_called) == 2
    )
    err = capsys.readouterr().err
    assert "r3 eval: error: --env" in err
    assert re.search(message, err), err
