"""env 'verifiers': verifiers 0.4 tasksets defined in the tests (vf_tiny_taskset.py: three prompts, a rubric of two
weighted rewards; vf_tiny_multiturn.py: an env of two user turns; vf_tiny_tools.py: a taskset with a toolset) rolled out by verifiers' own episode machinery,
its model calls relayed to a real rollout gateway session over the tiny model (HF engine): the reward is the
rubric's, the gateway's records hold the calls, and a later turn's prompt extends the earlier one token for token."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gateway_runs import extends_previous, reply_text, run_episodes

from r3_rllib.envs import make_text_env

# Importing verifiers takes ~6 CPU-s here: every test is in the whole suite only, and the import waits for the
# first of them (a module-level import would cost every collecting process, the fast tier's workers included).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _verifiers():
    pytest.importorskip("verifiers.v1")


def test_verifiers_episodes_run_through_the_gateway_with_the_rubrics_reward(gateway):
    env = make_text_env("verifiers", env={"taskset": {"id": "vf_tiny_taskset"}}, shuffle=False)
    assert env.query_ids == ["vf-0", "vf-1", "vf-2"] and env.agent_task("vf-1")["prompt"] == "say b"
    results, records = run_episodes(gateway, env, env.query_ids, concurrent=True)
    for letter, result, calls in zip("abc", results, records, strict=True):
        assert len(calls) == 1 and calls[0].endpoint == "chat" and len(calls[0].completion_ids) > 0
        has_letter = float(letter in calls[0].text.strip())
        # The rubric, as verifiers records it (weighted): replied (weight 0.5) + has_letter (weight 1), computed by
        # verifiers on the reply the gateway sampled.
        assert result["info"]["rewards"] == {"replied": 0.5, "has_letter": has_letter}
        assert result["reward"] == 0.5 + has_letter


def test_a_multi_turn_verifiers_env_extends_its_first_call(gateway, chat_tokenizer):
    env = make_text_env("verifiers", env={"taskset": {"id": "vf_tiny_multiturn"}}, shuffle=False)
    assert env.query_ids == ["vf-0", "vf-1"] and env.agent_task("vf-1")["prompt"] == "say x"
    results, records = run_episodes(gateway, env, env.query_ids)
    for letters, result, calls in zip(("ab", "xy"), results, records, strict=True):
        # Two calls: the task's prompt, then the env's second user turn after the first reply, whose prompt is the
        # first call's prompt and sampled tokens, then the new turn's tokens (verifiers resends the conversation).
        assert [c.endpoint for c in calls] == ["chat", "chat"] and extends_previous(calls)
        assert calls[1].messages[-1] == {"role": "user", "content": f"now say {letters[1]}"}
        assert calls[1].messages[-2]["content"] == reply_text(chat_tokenizer, calls[0])
        replies = [reply_text(chat_tokenizer, c) for c in calls]
        hits = float(letters[0] in replies[0]) + float(letters[1] in replies[1])
        assert result["info"]["rewards"] == {"answered_both": 0.5, "letters": hits}
        assert result["reward"] == 0.5 + hits


def test_verifiers_errors_are_named():
    with pytest.raises(ValueError, match="cannot load the env.*no_such_taskset"):
        make_text_env("verifiers", env={"taskset": {"id": "no_such_taskset"}})


# The toolset server starts per rollout (~2 s).
def test_a_verifiers_toolset_serves_the_in_process_harness(scripted_gateway, chat_tokenizer, monkeypatch):
    """A verifiers toolset (vf_tiny_tools.py's calculator, served by verifiers as an MCP server in a local
    subprocess) is the harness's tools: sent as the request's ``tools``, rendered by the template; the call the
    model writes is answered with a ``tool`` message and the next prompt extends the first. The model is a scripted
    engine behind the real gateway: an untrained model writes no tool call."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    call = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    gateway = scripted_gateway([call, "It is 5."])
    env = make_text_env("verifiers", env={"taskset": {"id": "vf_tiny_tools"}}, shuffle=False)
    (result,), (records,) = run_episodes(gateway, env, ["vf-0"])
    assert result["reward"] == 1.0 and result["info"]["metrics"] == {"tool_results": 1.0}
    first, second = (chat_tokenizer.decode(list(r.prompt_ids)) for r in records)
    assert first.startswith("<bos>system\ntools: calc_add<eos>\n<bos>user\nWhat is 2 + 3?")
    (tool_call,) = records[1].messages[-2]["tool_calls"]
    assert records[1].messages[-1] == {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}
    assert extends_previous(records) and second.endswith("<bos>tool\n5<eos>\n<bos>assistant\n")
