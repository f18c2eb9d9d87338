"""The agent env (``env: agent``): the program's outcome read as reward / correct, the program resolved and called
with or without the model name, tasks as rows (split, order, lookup), and what it refuses (no model, no Ray)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from r3_rllib.envs.agent import AgentTextEnv, episode_outcome, resolve_run, takes_model, task_text
from r3_rllib.envs.base import supports_agent_runs
from r3_rllib.envs.rows import Row

TASKS = [{"id": f"t{i}", "question": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]


async def with_model(client, task, model):
    return {"reward": 0.5, "model": model, "client": client}


async def without_model(client, task):
    return float(task["answer"] == "3")


@pytest.mark.parametrize(
    ("value", "threshold", "expected"),
    [
        (1, None, {"reward": 1.0, "correct": True}),
        (0.0, None, {"reward": 0.0, "correct": False}),
        (True, None, {"reward": 1.0, "correct": True}),
        (np.float32(0.25), None, {"reward": 0.25, "correct": True}),
        (0.5, 1.0, {"reward": 0.5, "correct": False}),
        (1.0, 1.0, {"reward": 1.0, "correct": True}),
        ({"reward": 0.2, "correct": 1, "why": "x"}, 1.0, {"reward": 0.2, "correct": True, "why": "x"}),
    ],
)
def test_episode_outcome_reads_numbers_and_mappings(value, threshold, expected):
    assert episode_outcome(value, threshold) == expected


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("1.0", TypeError, "returned str"),
        (None, TypeError, "returned NoneType"),
        ({"score": 1.0}, TypeError, "without 'reward'.*score"),
        ({"reward": "1"}, TypeError, "not a number"),
        (math.nan, ValueError, "reward of nan"),
        ({"reward": math.inf}, ValueError, "reward of inf"),
    ],
)
def test_episode_outcome_refuses_what_is_not_a_reward(value, error, match):
    with pytest.raises(error, match=match):
        episode_outcome(value)


def test_the_program_is_called_with_the_model_name_only_when_it_takes_one():
    assert takes_model(with_model) and not takes_model(without_model)
    assert takes_model(lambda client, task, **kw: 0) and takes_model(lambda client, task, *rest: 0)
    env = AgentTextEnv(run=with_model, tasks=TASKS, test_size=0)
    out = asyncio.run(env.run_agent("CLIENT", "policy", env.agent_task("t1")))
    assert out == {"reward": 0.5, "correct": False, "model": "policy", "client": "CLIENT"}
    env = AgentTextEnv(run=without_model, tasks=TASKS, test_size=0)
    assert asyncio.run(env.run_agent(None, "policy", env.agent_task("t2")))["correct"] is True


def test_a_sync_program_and_a_module_path_work():
    env = AgentTextEnv(run="math:floor", tasks=TASKS, test_size=0)
    assert env.run_fn is math.floor
    env = AgentTextEnv(run=lambda client, task: 1.0, tasks=TASKS, test_size=0)
    assert asyncio.run(env.run_agent(None, "policy", env.agent_task("t0"))) == {
        "reward": 1.0,
        "correct": True,
    }
    with pytest.raises(ValueError, match="'run' must be a function"):
        resolve_run(3)


def test_tasks_split_order_and_lookup():
    train = AgentTextEnv(run=without_model, tasks=TASKS, test_size=0.2, seed=1)
    test = AgentTextEnv(run=without_model, tasks=TASKS, test_size=0.2, split="test", seed=1)
    assert len(train) == 8 and len(test) == 2 and not set(train.query_ids) & set(test.query_ids)
    assert supports_agent_runs(train)
    seen = [train.reset()[1]["query_id"] for _ in range(8)]
    assert sorted(seen) == sorted(train.query_ids)  # one epoch: every task once
    text, info = train.reset(options={"query_id": seen[0]})
    assert info["query_id"] == seen[0] and text == info["query_text"] == info["task"]["question"]
    task = train.agent_task(seen[0])
    task["question"] = "changed"  # a copy: the program may change it
    assert train.agent_task(seen[0])["question"] != "changed"
    with pytest.raises(ValueError, match="unknown query_id 'nope'"):
        train.agent_task("nope")


def test_what_the_agent_env_refuses():
    env = AgentTextEnv(run=without_model, tasks=TASKS, test_size=0)
    with pytest.raises(TypeError, match="is an agent env"):
        env.step("12")
    with pytest.raises(ValueError, match="user_content"):
        env.reset(options={"user_content": "x"})
    with pytest.raises(ValueError, match="correct_threshold"):
        AgentTextEnv(run=without_model, tasks=TASKS, correct_threshold=True)


def test_task_text_from_prompt_columns_or_json():
    assert task_text(Row("a", {"question": "q?"}, "row 0"), None) == "q?"
    assert task_text(Row("a", {"prompt": "p", "question": "q"}, "row 0"), None) == "p"
    assert task_text(Row("a", {"x": 1}, "row 0"), None) == '{"x": 1}'
    assert task_text(Row("a", {"x": 1}, "row 0"), "value {x}") == "value 1"
