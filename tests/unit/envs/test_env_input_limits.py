"""Every text env (not only MathEnv) refuses prompts past the model's context naming the query, follows one
chat-template rule (envs/chat.py), and grades a scorer it does not own that hangs as a 'timeout'."""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
import time

import pytest
from char_tokenizer import CharTokenizer

from r3_rllib.envs.arithmetic import ArithmeticEnv
from r3_rllib.envs.chat import _WARNED_NO_TEMPLATE, use_chat_template
from r3_rllib.envs.chat_arithmetic import ChatArithmeticEnv
from r3_rllib.envs.context import check_prompts_fit, drop_long_prompts
from r3_rllib.envs.data import DataError
from r3_rllib.envs.gridworld import GridWorldEnv
from r3_rllib.envs.python_tool import PythonToolEnv


class ChatCharTokenizer(CharTokenizer):
    """A character tokenizer with a (tiny) chat template."""

    chat_template = "{{ messages }}"
    name_or_path = "/models/chat-char-tok"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"


# -- the context check, one implementation ----------------------------------------------------------------------
def test_check_prompts_fit_names_the_query_its_length_and_the_limit():
    prompts = [("q-short", "abc"), ("q-long", "x" * 30)]
    check_prompts_fit(prompts, CharTokenizer(), 40, 10)  # 30 + 10 fits exactly
    with pytest.raises(DataError) as error:
        check_prompts_fit(prompts, CharTokenizer(), 39, 10, env_name="demo")
    assert str(error.value).startswith(
        "demo: query 'q-long': prompt has 30 tokens + max_new_tokens=10 > the model's max_position_embeddings=39"
    )


def test_no_limit_or_no_tokenizer_checks_nothing_and_renders_nothing():
    def never():
        raise AssertionError("prompts rendered without a limit")
        yield

    check_prompts_fit(never(), CharTokenizer(), None, 10)
    check_prompts_fit(never(), None, 40, 10)


def test_arithmetic_prompts_are_checked_against_the_context():
    with pytest.raises(
        DataError, match=r"arithmetic: query 'arith:\d+\+\d+': prompt has 6 tokens \+ max_new_tokens=8"
    ):
        ArithmeticEnv(
            num_queries=4, digits=2, tokenizer=CharTokenizer(), model_max_positions=13, max_new_tokens=8
        )
    assert (
        len(ArithmeticEnv(num_queries=4, tokenizer=CharTokenizer(), model_max_positions=14, max_new_tokens=8))
        == 4
    )


def test_chat_arithmetic_checks_its_rendered_chat_prompts():
    tok = ChatCharTokenizer()
    env = ChatArithmeticEnv(tokenizer=tok, digits=1, num_queries=4)
    longest = max(len(env.reset(options={"query_id": q})[0]) for q in env.query_ids)
    with pytest.raises(DataError, match=rf"chat_arithmetic: query .*prompt has {longest} tokens"):
        ChatArithmeticEnv(
            tokenizer=tok, digits=1, num_queries=4, model_max_positions=longest + 3, max_new_tokens=4
        )
    ChatArithmeticEnv(
        tokenizer=tok, digits=1, num_queries=4, model_max_positions=longest + 4, max_new_tokens=4
    )


def test_gridworld_checks_each_layouts_first_prompt():
    env = GridWorldEnv(num_queries=3, size=3)
    longest = max(len(env.episode(q).prompt) for q in env.query_ids)
    with pytest.raises(DataError, match=rf"gridworld: query .*prompt has {longest} tokens"):
        GridWorldEnv(
            num_queries=3, size=3, tokenizer=CharTokenizer(), model_max_positions=longest, max_new_tokens=1
        )
    GridWorldEnv(
        num_queries=3, size=3, tokenizer=CharTokenizer(), model_max_positions=longest + 1, max_new_tokens=1
    )


@pytest.fixture
def math_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [
        {"id": "short", "problem": "1+1?", "answer": "2"},
        {"id": "long", "problem": "x" * 300, "answer": "3"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_python_tool_names_the_context_options_so_the_runner_fills_them_in(math_rows):
    import inspect

    assert "model_max_positions" in inspect.signature(PythonToolEnv).parameters
    with pytest.raises(DataError, match="query 'long': prompt has"):
        PythonToolEnv(
            data=math_rows,
            tokenizer=CharTokenizer(),
            apply_chat_template="none",
            model_max_positions=400,
            max_new_tokens=16,
            tool_isolation="rlimits",
        )


def test_every_shipped_env_names_the_context_options():
    import inspect

    from r3_rllib.envs.base import AgentEnv
    from r3_rllib.envs.registry import get_text_env_factory, registered_text_envs

    for name in registered_text_envs():
        factory = get_text_env_factory(name)
        if isinstance(factory, type) and issubclass(factory, AgentEnv):
            # An agent env's prompts are its program's: the rollout gateway refuses a call past the model's context
            # (tests/unit/gateway/test_gateway_errors.py); one that also renders prompts (mcp's tool loop) takes them.
            continue
        params = inspect.signature(factory).parameters
        assert {"model_max_positions", "max_new_tokens"} <= set(params), name


# -- reflection prompts: generated, so dropped and counted, not fatal ----------------------------------------------
def test_reflection_prompts_too_long_are_dropped_with_a_warning(caplog):
    prompts = [("q1", "fits", "a" * 20), ("q2", "too long", "b" * 50), ("q3", "fits", "c" * 30)]
    with caplog.at_level(logging.WARNING):
        kept, dropped = drop_long_prompts(prompts, CharTokenizer(), model_max_positions=40, max_new_tokens=10)
    assert [p[0] for p in kept] == ["q1", "q3"] and dropped == 1
    assert (
        "dropped 1 reflection prompt(s)" in caplog.text
        and "query 'q2': reflection prompt has 50 tokens" in caplog.text
    )
    assert drop_long_prompts(prompts, CharTokenizer()) == (prompts, 0)  # no context known: all kept


# -- the held-out env is built with the model's context -----------------------------------------------------------
def test_the_held_out_env_gets_the_models_context(tiny_random_model):
    from r3_rllib.algorithms.r3.config import R3Config
    from r3_rllib.algorithms.r3.runner_setup import eval_env_config, model_context

    config = (
        R3Config()
        .environment("math", env_config={"data": "x.jsonl", "split": "train"})
        .training(model_path=tiny_random_model)
    )
    config.eval_env_config = {"split": "test"}
    cfg = eval_env_config(config)
    assert cfg["split"] == "test" and cfg["data"] == "x.jsonl"
    assert cfg["model_max_positions"] == model_context(config)["model_max_positions"] >= 64


# -- one chat-template rule -------------------------------------------------------------------------------------
def test_chat_arithmetic_requires_a_template_by_default_through_the_shared_rule():
    with pytest.raises(
        ValueError, match="ChatArithmeticEnv: tokenizer '/models/char-tok' has no chat template"
    ):
        ChatArithmeticEnv(tokenizer=CharTokenizer(), digits=1, num_queries=4)
    with pytest.raises(ValueError, match="chat template"):
        ChatArithmeticEnv(digits=1, num_queries=4)
    plain = ChatArithmeticEnv(tokenizer=CharTokenizer(), digits=1, num_queries=4, apply_chat_template="none")
    prompt, info = plain.reset()
    assert prompt == info["query_text"]


def test_python_tool_messages_follow_the_envs_chat_mode(math_rows):
    env = PythonToolEnv(
        data=math_rows, tokenizer=ChatCharTokenizer(), apply_chat_template="none", tool_isolation="rlimits"
    )
    episode = env.tool_episode("short")
    assert episode.tokenizer is None and not episode.prompt.startswith("<|user|>")


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        (
            "tool_timeout_s",
            1e6,
            "tool_timeout_s must be a finite number > 0 and <= 86400 (seconds), got 1000000.0",
        ),
        ("tool_timeout_s", float("inf"), "tool_timeout_s must be a finite number > 0 and <= 86400"),
        ("tool_timeout_s", float("nan"), "tool_timeout_s must be a finite number"),
        ("tool_timeout_s", 0, "tool_timeout_s must be a finite number > 0"),
        ("tool_timeout_s", "5", "tool_timeout_s must be a finite number > 0 and <= 86400 (seconds), got '5'"),
        (
            "tool_memory_mb",
            2**21,
            "tool_memory_mb must be a whole number >= 64 and <= 1048576 (MiB), got 2097152",
        ),
        ("tool_memory_mb", 32, "tool_memory_mb must be a whole number >= 64"),
        ("tool_memory_mb", 100.5, "tool_memory_mb must be a whole number"),
        ("tool_memory_mb", True, "tool_memory_mb must be a whole number"),
        ("max_tool_output_chars", 0, "max_tool_output_chars must be a whole number >= 1, got 0"),
    ],
)
def test_python_tool_limits_the_sandbox_would_refuse_are_refused_when_the_env_is_built(
    math_rows, setting, value, message
):
    # accepted, they turned every tool call of the run into a "(tool error: ...)" message to the model
    with pytest.raises(ValueError) as error:
        PythonToolEnv(data=math_rows, tool_isolation="rlimits", **{setting: value})
    assert message in str(error.value)


def test_python_tool_accepts_the_sandboxs_top_limits_and_the_sandbox_does_too(math_rows):
    from r3_rllib.tools import sandbox

    env = PythonToolEnv(
        data=math_rows, tool_isolation="rlimits", tool_timeout_s=86_400, tool_memory_mb=float(2**20)
    )
    assert (env.tool_timeout_s, env.tool_memory_mb) == (86_400.0, 2**20)
    sandbox._check_limits(sandbox._Limits(env.tool_timeout_s, env.tool_memory_mb))  # one set of bounds


def test_math_env_and_the_shared_module_are_one_implementation():
    from r3_rllib.envs import math_env

    assert math_env.use_chat_template is use_chat_template
    assert not hasattr(math_env, "_WARNED_NO_TEMPLATE")  # the warn-once state lives in envs/chat.py only


# -- reasoning_gym (optional extra) -----------------------------------------------------------------------------
needs_reasoning_gym = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="the reasoning-gym extra is not installed"
)


@needs_reasoning_gym
def test_reasoning_gym_hanging_verifier_is_graded_as_a_timeout(monkeypatch):
    from r3_rllib.envs.reasoning_gym import GRADE_REASONS, ReasoningGymEnv

    env = ReasoningGymEnv(tasks="basic_arithmetic", size=10, test_size=2, seed=4, reward_timeout_s=0.2)
    release = threading.Event()

    def hang(answer, entry):
        release.wait(30)  # a verifier stuck on this answer
        return 1.0

    monkeypatch.setattr(env.dataset, "score_answer", hang)
    env.reset()
    start = time.monotonic()
    try:
        _, reward, terminated, _, info = env.step("<answer>3</answer>")
    finally:
        release.set()
    # Did not wait for the hang (30 s): 10 s is 50x the 0.2 s limit (measured 0.20 s), room for a loaded machine.
    assert time.monotonic() - start < 10.0
    assert (reward, terminated, info["correct"], info["grade_reason"]) == (0.0, True, False, "timeout")
    assert "0.2 s" in info["grade_detail"] and "timeout" in GRADE_REASONS


@needs_reasoning_gym
def test_reasoning_gym_reward_timeout_defaults_to_30_s_and_must_be_positive():
    from r3_rllib.envs.reasoning_gym import ReasoningGymEnv

    assert ReasoningGymEnv(tasks="leg_counting", size=5, test_size=2).reward_timeout_s == 30.0
    with pytest.raises(ValueError, match="reward_timeout_s must be > 0"):
        ReasoningGymEnv(tasks="leg_counting", size=5, test_size=2, reward_timeout_s=0)


@needs_reasoning_gym
def test_reasoning_gym_prompts_are_checked_against_the_context():
    from r3_rllib.envs.reasoning_gym import ReasoningGymEnv

    kw = dict(
        tasks="leg_counting", size=5, test_size=2, tokenizer=CharTokenizer(), apply_chat_template="none"
    )
    env = ReasoningGymEnv(**kw)
    longest = max(len(env.reset(options={"query_id": q})[0]) for q in env.query_ids)
    with pytest.raises(DataError, match=rf"reasoning_gym: query 'train/\d+': prompt has {longest} tokens"):
        ReasoningGymEnv(**kw, model_max_positions=longest + 15, max_new_tokens=16)
    ReasoningGymEnv(**kw, model_max_positions=longest + 16, max_new_tokens=16)


@needs_reasoning_gym
def test_reasoning_gym_chat_template_modes(caplog):
    from r3_rllib.envs.reasoning_gym import ReasoningGymEnv

    kw = dict(tasks="leg_counting", size=5, test_size=2)
    _WARNED_NO_TEMPLATE.discard("/models/char-tok")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            env = ReasoningGymEnv(**kw, tokenizer=CharTokenizer())
    assert not env.use_chat_template
    assert caplog.text.count("tokenizer '/models/char-tok' has no chat template") == 1
    with pytest.raises(ValueError, match="tokenizer '/models/char-tok' has no chat template"):
        ReasoningGymEnv(**kw, tokenizer=CharTokenizer(), apply_chat_template="required")
    plain = ReasoningGymEnv(**kw, tokenizer=ChatCharTokenizer(), apply_chat_template="none")
    assert not plain.reset()[0].startswith("<|system|>")
    assert ReasoningGymEnv(**kw, tokenizer=ChatCharTokenizer()).reset()[0].startswith("<|system|>")
