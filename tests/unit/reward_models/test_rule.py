"""The rule reward term (r3_rllib/reward_models/rule.py): a user's function by module or file path, the math grader,
and the reasons of a function that raises or returns no usable number."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from r3_rllib.core.objects import ObjectPathError
from r3_rllib.reward_models.rule import RuleScorer, load_rule_function, rule_value
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest, RewardScore, RewardScorer

RULES = """
import math


def length_bonus(prompt, response, gold):
    return len(response) / 10


def exact(prompt, response, gold):
    return float(response.strip() == gold)


def echo_gold(prompt, response, gold):
    return gold is None


def boom(prompt, response, gold):
    raise RuntimeError("rule failed")


def nan(prompt, response, gold):
    return math.nan


def text(prompt, response, gold):
    return "1.0"


NOT_CALLABLE = 3
"""


def _request(response: str, gold: str | None = "7", prompt: str = "3+4=") -> RewardRequest:
    return RewardRequest(
        query_id="q", prompt_text=prompt, response_text=response, env_reward=0.0, env_correct=False, gold=gold
    )


def _spec(function: str | None) -> RewardModelSpec:
    return RewardModelSpec(name="rule", type="rule", function=function)


@pytest.fixture
def rules_file(tmp_path, monkeypatch):
    path = tmp_path / "my_rules.py"
    path.write_text(RULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("my_rules", None)


def test_module_function_scores_each_request(rules_file):
    scorer = RuleScorer(_spec("my_rules:length_bonus"))
    assert isinstance(scorer, RewardScorer) and scorer.name == "rule"
    assert scorer.score([_request("7"), _request("12345")]) == [RewardScore(0.1), RewardScore(0.5)]
    assert scorer.score([]) == []


def test_file_path_function(rules_file, tmp_path):
    scorer = RuleScorer(_spec(f"{rules_file}:exact"))
    assert scorer.score([_request(" 7 "), _request("8")]) == [RewardScore(1.0), RewardScore(0.0)]
    # the gold is passed as given (None when the env exposes none); a bool counts as 1 or 0
    scorer = RuleScorer(_spec(f"{rules_file}:echo_gold"))
    assert scorer.score([_request("7", gold=None), _request("7")]) == [RewardScore(1.0), RewardScore(0.0)]


def test_failures_give_reasons_not_exceptions(rules_file):
    assert (
        RuleScorer(_spec("my_rules:boom")).score([_request("7")] * 2) == [RewardScore(0.0, "rule_error")] * 2
    )
    assert RuleScorer(_spec("my_rules:nan")).score([_request("7")]) == [RewardScore(0.0, "rule_bad_value")]
    assert RuleScorer(_spec("my_rules:text")).score([_request("7")]) == [RewardScore(0.0, "rule_bad_value")]


@pytest.mark.parametrize(
    "value, expected",
    [(1, 1.0), (0.25, 0.25), (True, 1.0), (False, 0.0), (np.float32(0.5), 0.5), (np.int64(2), 2.0)]
    + [(torch.tensor(0.75), 0.75), (-3.0, -3.0)],
)
def test_rule_value_accepts_real_numbers(value, expected):
    assert rule_value(value) == expected


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, None, "1", [1.0], {"reward": 1.0}, torch.tensor([1.0]), 1j]
)
def test_rule_value_refuses_the_rest(value):
    assert rule_value(value) is None


def test_unusable_paths_are_refused_when_built(rules_file, tmp_path):
    with pytest.raises(ValueError, match="needs function"):
        RuleScorer(_spec(None))
    with pytest.raises(ObjectPathError, match="no attribute 'missing'"):
        load_rule_function("my_rules:missing")
    with pytest.raises(ObjectPathError, match="not a function"):
        load_rule_function("my_rules:NOT_CALLABLE")
    with pytest.raises(ObjectPathError, match="no Python file"):
        load_rule_function(f"{tmp_path / 'absent.py'}:exact")
    with pytest.raises(ObjectPathError, match="has no attribute"):
        load_rule_function(f"{rules_file}:missing")
    bad = tmp_path / "broken_rules.py"
    bad.write_text("raise ImportError('no')\n")
    with pytest.raises(ObjectPathError, match="importing"):
        load_rule_function(f"{bad}:exact")
    with pytest.raises(ObjectPathError, match="cannot import module"):
        load_rule_function("no_such_module_here:fn")


def test_math_grader():
    # Answers the grader's fast path decides (no math-verify worker started: a unit test stays fast).
    scorer = RuleScorer(_spec("math"))
    requests = [
        _request("so \\boxed{7}"),
        _request("so \\boxed{8}"),
        _request("no box: 7"),
        _request("\\boxed{\\dfrac{1}{2}}", gold="\\frac{1}{2}"),
        _request("\\boxed{7}", gold=None),
    ]
    assert scorer.score(requests) == [
        RewardScore(1.0),
        RewardScore(0.0),
        RewardScore(0.0),
        RewardScore(1.0),
        RewardScore(0.0, "rule_no_gold"),
    ]
