"""env 'mcp': an MCP stdio server written in the test (mcp_calc_server.py: a calculator tool) as the tools of the
multi-turn tool loop and of agent runs through a real rollout gateway (the tools sent as the request's ``tools``,
rendered by the chat template, a call answered with a ``tool`` message); the trust flag is required."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gateway_runs import extends_previous, reply_text, run_episodes

from r3_rllib.envs import make_text_env
from r3_rllib.envs.adapters.mcp_tools import grade, parse_tool_calls
from r3_rllib.envs.base import supports_agent_runs, supports_tool_episodes
from r3_rllib.envs.data import MathProblem

# Each test starts the MCP server as a subprocess (~1 s): the whole suite runs them, not the fast tier, which then
# does not import mcp either (the import waits for the first test).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _mcp():
    pytest.importorskip("mcp")


SERVER = {"command": sys.executable, "args": [str(Path(__file__).with_name("mcp_calc_server.py"))]}
DATA = [MathProblem("q0", "What is 2 + 3?", ("5",))]


@pytest.fixture(scope="module")
def env():
    env = make_text_env(
        "mcp", data=DATA, server=SERVER, trust_server=True, tool_timeout_s=10.0, shuffle=False
    )
    yield env
    env.close()


def test_mcp_server_is_refused_without_the_trust_flag():
    with pytest.raises(PermissionError, match="trust_server: true"):
        make_text_env("mcp", data=DATA, server=SERVER)


def test_mcp_tools_serve_the_tool_use_loop(env):
    assert supports_tool_episodes(env) and supports_agent_runs(env)
    episode = env.tool_episode("q0")
    assert "- add(" in episode.prompt and "Add two integers." in episode.prompt
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    # Without a chat template the reply is a plain ```output block (python_tool's rendering).
    assert (
        episode.tool_reply(f"Let me add. {call}")
        == "\n```output\n<tool_response>\n5\n</tool_response>\n```\n"
    )
    failing = episode.tool_reply('<tool_call>{"name": "fail", "arguments": {"reason": "boom"}}</tool_call>')
    assert "(tool error)" in failing and "boom" in failing
    assert "unknown tool 'sub'" in episode.tool_reply(
        '<tool_call>{"name": "sub", "arguments": {}}</tool_call>'
    )
    assert episode.tool_reply("The answer is \\boxed{5}.") is None
    assert episode.finish("The answer is \\boxed{5}.")[:2] == (1.0, True)
    assert episode.finish("The answer is \\boxed{6}.")[:2] == (0.0, False)
    assert parse_tool_calls("<tool_call>not json</tool_call>") == [("", {"_raw": "not json"})]


ADD_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_mcp_agent_run_answers_a_native_tool_call(env, scripted_gateway, chat_tokenizer):
    """A scripted engine behind the gateway writes the Hermes tool call (an untrained model does not): the
    gateway returns it as ``tool_calls``, the env answers with a ``tool`` message, the next prompt extends the
    first token for token, and the final answer is graded."""
    gateway = scripted_gateway([ADD_CALL, "So \\boxed{5}."])
    (result,), (records,) = run_episodes(gateway, env, ["q0"])
    assert result["reward"] == 1.0 and result["correct"] and result["info"]["tool_calls"] == 1
    first, second = (chat_tokenizer.decode(list(r.prompt_ids)) for r in records)
    assert first.startswith("<bos>system\ntools: add,fail<eos>\n<bos>user\nWhat is 2 + 3?")  # tools rendered
    (call,) = records[1].messages[-2]["tool_calls"]
    assert call["function"]["name"] == "add" and records[1].messages[-2]["role"] == "assistant"
    assert records[1].messages[-1] == {"role": "tool", "tool_call_id": call["id"], "content": "5"}
    assert extends_previous(records) and second.endswith("<bos>tool\n5<eos>\n<bos>assistant\n")


def test_mcp_agent_run_answers_a_tool_call_in_the_text(scripted_gateway, chat_tokenizer):
    """``openai_tools: false``: no ``tools`` in the request (the prompt's text lists them), so the call stays in the
    reply's text; it is answered with a user message holding the ``<tool_response>``, and that prompt extends the
    first one too."""
    env = make_text_env("mcp", data=DATA, server=SERVER, trust_server=True, openai_tools=False, shuffle=False)
    try:
        gateway = scripted_gateway([f"Let me add. {ADD_CALL}", "\\boxed{5}"])
        (result,), (records,) = run_episodes(gateway, env, ["q0"])
    finally:
        env.close()
    assert result["reward"] == 1.0 and result["info"]["tool_calls"] == 1 and extends_previous(records)
    assert records[1].messages[-1] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}
    assert chat_tokenizer.decode(list(records[0].prompt_ids)).startswith("<bos>user\nWhat is 2 + 3?")


def test_mcp_agent_runs_on_the_tiny_model(env, gateway, chat_tokenizer):
    """The untrained tiny model with the tools in its prompt: its replies call none, so each run is one call,
    graded on the reply the gateway returned."""
    results, records = run_episodes(gateway, env, ["q0", "q0"], concurrent=True)
    for result, calls in zip(results, records, strict=True):
        assert len(calls) == 1 and result["info"]["tool_calls"] == 0
        assert chat_tokenizer.decode(list(calls[0].prompt_ids)).startswith(
            "<bos>system\ntools: add,fail<eos>"
        )
        assert result["reward"] == grade(reply_text(chat_tokenizer, calls[0]), ["5"], 10.0)[0]


def test_mcp_plain_answers_grade_the_final_reply(scripted_gateway):
    """``answer_format: "plain"``: the final reply itself is the answer (no ``\\boxed{}``), in the tool loop (the
    text after the last tool call) and in agent runs (the last reply); an unknown format is refused."""
    with pytest.raises(ValueError, match="answer_format"):
        make_text_env("mcp", data=DATA, server=SERVER, trust_server=True, answer_format="last")
    env = make_text_env(
        "mcp",
        data=DATA,
        server=SERVER,
        trust_server=True,
        prompt_template="{problem}",
        answer_format="plain",
        shuffle=False,
    )
    try:
        episode = env.tool_episode("q0")
        assert episode.prompt == "What is 2 + 3?"
        assert episode.finish(" 5\n")[:2] == (1.0, True)
        assert episode.finish(f"5 {ADD_CALL}\n6")[:2] == (0.0, False)  # the reply after the call is graded
        assert episode.finish(f"{ADD_CALL} 5")[:2] == (1.0, True)
        (result,), _ = run_episodes(scripted_gateway([ADD_CALL, "5"]), env, ["q0"])
        assert result["reward"] == 1.0 and result["info"]["tool_calls"] == 1
        (result,), _ = run_episodes(scripted_gateway(["5", "6"]), env, ["q0"])
        assert (
            result["reward"] == 1.0 and result["info"]["tool_calls"] == 0
        )  # no call: the first reply is final
        (result,), _ = run_episodes(scripted_gateway(["6"]), env, ["q0"])
        assert result["reward"] == 0.0 and not result["correct"]
    finally:
        env.close()
