"""Chat pieces without a model: Hermes tool calls in and out, the continuation rule (tool turns, a template that
is not append-only, the end of turn after a stop token or the length limit), parameter parsing, batch seeds."""

from __future__ import annotations

import json

import openai
import pytest
from gateway_helpers import DEFAULTS, TIMEOUT_S, ScriptedEngine

from r3_rllib.engines.base import SamplingParams
from r3_rllib.gateway import Gateway, GatewayError
from r3_rllib.gateway.batcher import Pending, batch_seed, groups
from r3_rllib.gateway.chat import parse_tool_calls, same_reply
from r3_rllib.gateway.protocol import clamp_to_context, sampling_request
from r3_rllib.gateway.sessions import Reply, Session, Turn, chat_prompt

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_parse_tool_calls_hermes_blocks():
    text = (
        'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{bad}</tool_call>'
    )
    content, calls = parse_tool_calls(text, "c")
    assert content == "Let me add.<tool_call>{bad}</tool_call>"
    assert calls == [{"id": "c_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    assert parse_tool_calls("no calls", "c") == ("no calls", [])
    assert parse_tool_calls('<tool_call>{"name": "f"}</tool_call>', "c")[0] is None
    returned = {"role": "assistant", "content": None, "tool_calls": calls}
    sent = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "other", "function": {"name": "add", "arguments": '{"a":1}'}}],
    }
    assert same_reply(sent, returned) and not same_reply({**sent, "content": "x"}, returned)


def test_tool_call_round_trip_through_the_sdk_extends_the_session(chat_tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    engine = ScriptedEngine(chat_tokenizer, [call, "3"])
    with Gateway(engine, chat_tokenizer, defaults=DEFAULTS) as gw:
        sid = gw.open_session()
        sdk = openai.OpenAI(
            base_url=gw.session_base_url(sid), api_key="none", timeout=TIMEOUT_S, max_retries=0
        )
        messages = [{"role": "user", "content": "1+2?"}]
        first = sdk.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=100)
        (tool_call,) = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
        assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {
            "a": 1,
            "b": 2,
        }
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": tool_call.id, "content": "3"}]
        second = sdk.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        records = gw.close_session(sid)
    p0, c0 = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    assert c0 == encode(chat_tokenizer, call) + [
        chat_tokenizer.eos_token_id
    ]  # the model's own text, eos included
    assert chat_tokenizer.decode(p0).startswith("<bos>system\ntools: add<eos>\n")  # tools reach the template
    # The model's tool-call tokens stay as sampled (the template would render the call with other spacing).
    assert second.model_extra["prompt_token_ids"] == p0 + c0 + encode(
        chat_tokenizer, "\n<bos>tool\n3<eos>\n<bos>assistant\n"
    )
    assert records[1].extra["extended"] and second.choices[0].message.content == "3"


def turn_of(tok, messages, completion, reason, template_kwargs=None):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    reply = {
        "role": "assistant",
        "content": tok.decode([t for t in completion if t != tok.eos_token_id], skip_special_tokens=True),
    }
    return Turn(
        0, messages, None, template_kwargs, encode(tok, text), text, [Reply(reply, completion, reason)]
    )


def test_continuation_after_the_length_limit_closes_the_turn(chat_tokenizer):
    tok = chat_tokenizer
    session = Session("s", 0)
    user = [{"role": "user", "content": "q"}]
    session.turns.append(turn_of(tok, user, encode(tok, "ab"), "length"))
    nxt = [*user, {"role": "assistant", "content": "ab"}, {"role": "user", "content": "go on"}]
    prompt = chat_prompt(tok, session, nxt, None, None)
    turn = session.turns[0]
    assert prompt.source == "extended" and prompt.reused_tokens == len(turn.prompt_ids) + 2
    # Stopped at the length limit: the template's whole end of turn follows the sampled tokens.
    assert prompt.prompt_ids == turn.prompt_ids + encode(
        tok, "ab<eos>\n<bos>user\ngo on<eos>\n<bos>assistant\n"
    )
    # A history rebuilt from SDK objects (null fields added) is the same history.
    rebuilt = [{**user[0], "name": None}, {"role": "assistant", "content": "ab", "refusal": None}, nxt[-1]]
    assert chat_prompt(tok, session, rebuilt, None, None).prompt_ids == prompt.prompt_ids
    # A different tool list, or other template options: rendered fresh.
    assert chat_prompt(tok, session, nxt, TOOLS, None).source == "history_rewritten"
    assert chat_prompt(tok, session, nxt, None, {"x": 1}).source == "history_rewritten"
    assert chat_prompt(tok, None, nxt, None, None).source == "first_call"


def test_a_template_that_rewrites_earlier_turns_is_rendered_fresh(chat_tokenizer):
    class Dropping:  # renders only the last two messages: not append-only
        eos_token_id = chat_tokenizer.eos_token_id
        chat_template = "x"

        def apply_chat_template(self, messages, **kw):
            return chat_tokenizer.apply_chat_template(messages[-2:], **kw)

        def __getattr__(self, name):
            return getattr(chat_tokenizer, name)

    tok = Dropping()
    session = Session("s", 0)
    user = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    completion = encode(chat_tokenizer, "a") + [chat_tokenizer.eos_token_id]
    session.turns.append(turn_of(tok, user, completion, "stop"))
    nxt = [*user, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    prompt = chat_prompt(tok, session, nxt, None, None)
    assert prompt.source == "template_not_append_only"
    assert prompt.prompt_ids == encode(
        chat_tokenizer, tok.apply_chat_template(nxt, tokenize=False, add_generation_prompt=True)
    )


def test_sampling_request_defaults_stops_and_clamp(chat_tokenizer):
    req = sampling_request({"messages": []}, "chat", DEFAULTS, chat_tokenizer)
    assert req.params == DEFAULTS and req.n == 1 and not req.logprobs
    body = {
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 3,
        "max_completion_tokens": 9,
        "n": 2,
        "seed": 4,
        "stop": "a",
    }
    req = sampling_request(body, "chat", DEFAULTS, chat_tokenizer)
    (a,) = encode(chat_tokenizer, "a")
    assert req.params == SamplingParams(
        max_new_tokens=9, temperature=0.0, top_p=0.5, top_k=3, stop_token_ids=(a,), seed=4
    )
    assert req.n == 2 and req.seed_given
    harmless = {
        "user": "u",
        "metadata": {},
        "parallel_tool_calls": True,
        "stream_options": None,
        "presence_penalty": 0,
    }
    assert sampling_request(harmless, "chat", DEFAULTS, chat_tokenizer).params == DEFAULTS
    clamped, cut = clamp_to_context(req, 100, 105)
    assert cut and clamped.params.max_new_tokens == 5 and clamp_to_context(req, 10, 105) == (req, False)
    with pytest.raises(GatewayError, match="maximum context length is 105"):
        clamp_to_context(req, 105, 105)
    with pytest.raises(GatewayError, match="logprobs=0"):
        sampling_request({"logprobs": 2}, "completions", DEFAULTS, chat_tokenizer)


def test_batch_seeds_and_groups():
    assert batch_seed(None, 3) is None
    seeds = [batch_seed(7, k) for k in range(100)]
    assert seeds == [batch_seed(7, k) for k in range(100)] and len(set(seeds)) == 100
    assert batch_seed(8, 0) != seeds[0] and all(0 <= s < 2**31 for s in seeds)
    hot, cold = SamplingParams(temperature=1.0), SamplingParams(temperature=0.5)
    batch = [
        Pending([1], 1, hot, "a", (0, 0)),
        Pending([2], 1, cold, "b", (1, 0)),
        Pending([3], 1, hot, "c", (2, 0)),
    ]
    batch.append(Pending([4], 2, hot, "d", (3, 0)))
    assert [[p.prompt_ids[0] for p in g] for g in groups(batch)] == [[1, 3], [2], [4]]
