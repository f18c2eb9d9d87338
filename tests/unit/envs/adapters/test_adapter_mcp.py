"""env 'mcp': an MCP stdio server written in the test (mcp_calc_server.py: a calculator tool) as the tools of the
multi-turn tool loop and of an agent run; the trust flag is required."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from fake_chat_client import FakeChatClient  # noqa: E402

from r3_rllib.envs import make_text_env  # noqa: E402
from r3_rllib.envs.adapters.mcp_tools import parse_tool_calls  # noqa: E402
from r3_rllib.envs.base import supports_agent_runs, supports_tool_episodes  # noqa: E402
from r3_rllib.envs.data import MathProblem  # noqa: E402

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


def test_mcp_agent_run_answers_native_and_text_tool_calls(env):
    task = env.agent_task("q0")
    text_call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    client = FakeChatClient([[("add", {"a": 2, "b": 3})], text_call, "So \\boxed{5}."])
    result = asyncio.run(asyncio.wait_for(env.run_agent(client, "policy", task), 20))
    assert result["reward"] == 1.0 and result["correct"] and result["info"]["tool_calls"] == 2
    tools = client.calls[0]["tools"]
    assert [t["function"]["name"] for t in tools] == ["add", "fail"] and tools[0]["type"] == "function"
    second = client.calls[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_0", "content": "5"}
    assert json.loads(second[-2]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    third = client.calls[2]["messages"]
    assert third[-1] == {"role": "user", "content": "<tool_response>\n2\n</tool_response>"}
