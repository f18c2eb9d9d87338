"""The group judge (r3_rllib/reward_models/group_judge.py): its prompt, relative scores read end to end from a scripted
engine, groups of different sizes in one engine call, wrong counts and garbage (the whole group unparsable), engine
errors, too-long prompts, and the real HF engine on the tiny model (garbage: unparsable)."""

from __future__ import annotations

import json
import re

import pytest
from scripted_judges import ENGINE, use_scripted_engine

from r3_rllib.reward_models.group_judge import (
    DEFAULT_GROUP_RUBRIC,
    GroupJudge,
    group_prompt,
    numbered_responses,
)
from r3_rllib.reward_models.judge import NO_GOLD
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import GroupRewardScorer, RewardRequest, RewardScore


def _group(*responses: str, gold: str | None = "42", prompt: str = "What is 12+30?") -> list[RewardRequest]:
    return [RewardRequest(f"q{i}", prompt, r, 0.0, False, gold) for i, r in enumerate(responses)]


def _spec(model: str, engine: str = ENGINE, **kwargs) -> RewardModelSpec:
    return RewardModelSpec(name="ruler", type="group_judge", model=model, engine=engine, **kwargs)


def _responses(prompt: str) -> list[str]:
    return re.findall(r"Response \d+:\n(.*?)(?=\n\nResponse \d+:|\n\nScore each)", prompt, re.DOTALL)


def _scripted_reply(prompt: str) -> str:
    """A group judge that ranks answers of 42 first, and misbehaves on cue."""
    responses = _responses(prompt)
    if "boom" in responses:
        raise RuntimeError("judge engine crashed")
    if "garbage" in responses:
        return "these all look fine to me"
    if "short" in responses:
        return json.dumps({"scores": [0.5] * (len(responses) - 1)})
    scores = [1.0 if r.strip() == "42" else 0.25 if "42" in r else 0.0 for r in responses]
    return "Response 1 is best.\n```json\n" + json.dumps({"scores": scores}) + "\n```"


def test_group_prompt():
    text = group_prompt(None, "What is 12+30?", ["42", "41"], "42")
    assert text.startswith("You are comparing 2 responses to the same question.")
    assert "Reference answer:\n42" in text
    assert "Response 1:\n42\n\nResponse 2:\n41\n\nScore each response" in text
    assert text.endswith('{"scores": [score of response 1, ..., score of response 2]}')
    assert "Reference answer" not in group_prompt(None, "Q", ["a"], None)
    assert group_prompt("{n}|{gold}|{responses}|{response}", "Q", ["a", "b"], None) == (
        f"2|{NO_GOLD}|{numbered_responses(['a', 'b'])}|{{response}}"
    )
    assert DEFAULT_GROUP_RUBRIC.count("{responses}") == 1


def test_relative_scores_end_to_end(tiny_random_model, monkeypatch):
    engine = use_scripted_engine(monkeypatch, _scripted_reply)
    judge = GroupJudge(_spec(tiny_random_model, batch_size=2))
    assert isinstance(judge, GroupRewardScorer) and judge.name == "ruler"
    groups = [_group("41", "42", "it is 42"), _group("42"), _group("7", "8", "42", "9"), []]
    out = judge.score_groups(groups)
    assert out == [
        [RewardScore(0.0), RewardScore(1.0), RewardScore(0.25)],
        [RewardScore(1.0)],
        [RewardScore(0.0), RewardScore(0.0), RewardScore(1.0), RewardScore(0.0)],
        [],
    ]
    # one prompt per non-empty group, batch_size prompts per engine call, greedy
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 1]
    assert engine.calls[0][0][0] == group_prompt(None, "What is 12+30?", ["41", "42", "it is 42"], "42")
    assert engine.calls[0][1].temperature == 0.0
    assert judge.score_groups([]) == []


def test_unparsable_errors_and_too_long(tiny_random_model, monkeypatch):
    engine = use_scripted_engine(monkeypatch, _scripted_reply)
    judge = GroupJudge(_spec(tiny_random_model, batch_size=2, max_new_tokens=100))
    groups = [
        _group("42", "garbage"),  # no scores at all
        _group("42", "short", "7"),  # one score missing
        _group("42", "boom"),  # the engine raises: this call's groups fail
        _group("42", "7"),
        _group("42", "4" * 2000),  # too long for the model: not sent
        _group("7", "42"),
    ]
    out = judge.score_groups(groups)
    assert out == [
        [RewardScore(0.0, "judge_unparsable")] * 2,
        [RewardScore(0.0, "judge_unparsable")] * 3,
        [RewardScore(0.0, "judge_error")] * 2,
        [RewardScore(0.0, "judge_error")] * 2,
        [RewardScore(0.0, "judge_too_long")] * 2,
        [RewardScore(0.0), RewardScore(1.0)],
    ]
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 2, 1]


def test_tiny_hf_group_judge_writes_garbage(tiny_random_model):
    judge = GroupJudge(_spec(tiny_random_model, engine="hf", max_new_tokens=8))
    out = judge.score_groups([_group("42", "41"), _group("a", "b", "c", gold=None)])
    assert out == [[RewardScore(0.0, "judge_unparsable")] * 2, [RewardScore(0.0, "judge_unparsable")] * 3]


def test_missing_model_is_refused():
    with pytest.raises(ValueError, match="needs model"):
        GroupJudge(RewardModelSpec(name="ruler", type="group_judge"))
