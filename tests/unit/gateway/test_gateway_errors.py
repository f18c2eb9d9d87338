"""Bad requests get OpenAI-style errors with the right status, and the server serves on after each."""

from __future__ import annotations

import httpx
import pytest
from gateway_helpers import DEFAULTS, TIMEOUT_S, ScriptedEngine

from r3_rllib.gateway import Gateway

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.base_url.removesuffix("/v1"), timeout=TIMEOUT_S) as c:
        yield c


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def chat(http, body, path="/v1/chat/completions"):
    return http.post(path, json={"model": "policy", **body})


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": USER, "presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
        ({"messages": USER, "frequency_penalty": 1}, "frequency_penalty", "unsupported_parameter"),
        ({"messages": USER, "logit_bias": {"5": 10}}, "logit_bias", "unsupported_parameter"),
        (
            {"messages": USER, "response_format": {"type": "json_schema"}},
            "response_format",
            "unsupported_parameter",
        ),
        ({"messages": USER, "top_logprobs": 2, "logprobs": True}, "top_logprobs", "unsupported_parameter"),
        ({"messages": USER, "tool_choice": "required", "tools": []}, "tool_choice", "unsupported_parameter"),
        ({"messages": USER, "no_such_option": 1}, "no_such_option", "unsupported_parameter"),
        ({"messages": USER, "stop": ["ab"]}, "stop", "unsupported_parameter"),
        ({"messages": USER, "temperature": "hot"}, "temperature", "invalid_value"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"messages": USER, "n": 0}, "n", "invalid_value"),
        ({}, "messages", "missing_messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "invalid_value"),
    ],
)
def test_bad_chat_parameters_are_400_naming_the_parameter(http, body, param, code):
    error = error_of(chat(http, body), 400)
    assert error["param"] == param and error["code"] == code and error["type"] == "invalid_request_error"
    if code == "unsupported_parameter":
        assert param in error["message"]


def test_invalid_json_missing_prompt_unknown_model_and_unknown_session(http):
    assert error_of(http.post("/v1/chat/completions", content=b"{not json"), 400)["code"] == "invalid_json"
    assert error_of(http.post("/v1/completions", content=b"[1, 2]"), 400)["code"] == "invalid_json"
    assert error_of(http.post("/v1/completions", json={"model": "policy"}), 400)["code"] == "missing_prompt"
    unknown = error_of(chat(http, {"model": "gpt-9", "messages": USER}), 404)
    assert unknown["code"] == "model_not_found" and "gpt-9" in unknown["message"]
    assert (
        error_of(chat(http, {"messages": USER}, "/sessions/nope/v1/chat/completions"), 404)["param"]
        == "session_id"
    )
    assert error_of(http.get("/sessions/nope/v1/models"), 404)["code"] == "session_not_found"
    assert error_of(http.get("/v2/anything"), 404)["code"] == "not_found"
    assert chat(http, {"messages": USER}).status_code == 200  # still serving


def test_single_token_stop_strings_become_stop_tokens(gateway, http):
    sid = gateway.open_session()
    try:
        r = chat(
            http,
            {"messages": USER, "stop": ["a", "b"], "max_tokens": 40},
            f"/sessions/{sid}/v1/chat/completions",
        )
    finally:
        (record,) = gateway.close_session(sid)
    assert r.status_code == 200, r.text
    ids = record.completion_ids.tolist()
    a, b = gateway.tokenizer.encode("ab", add_special_tokens=False)
    assert not set(ids[:-1]) & {a, b}  # nothing sampled after a stop token
    assert record.finish_reason == "length" or ids[-1] in {a, b, gateway.tokenizer.eos_token_id}


def test_context_limit_refuses_a_long_prompt_and_clamps_max_tokens(gateway, http):
    long = [{"role": "user", "content": "x" * 300}]  # over max_context = 256 tokens
    error = error_of(chat(http, {"messages": long}), 400)
    assert error["code"] == "context_length_exceeded" and "256" in error["message"]
    sid = gateway.open_session()
    try:
        prompt = [10 + i % 80 for i in range(240)]  # 240 tokens: 16 left for the completion
        r = http.post(f"/sessions/{sid}/v1/completions", json={"prompt": prompt, "max_tokens": 100})
    finally:
        (record,) = gateway.close_session(sid)
    assert r.status_code == 200 and record.extra["max_tokens_clamped"] is True
    assert len(record.completion_ids) <= 16
    assert error_of(http.post("/v1/completions", json={"prompt": [5, 10_000]}), 400)["param"] == "prompt"


def test_an_engine_exception_is_a_500_and_the_server_serves_on(chat_tokenizer):
    engine = ScriptedEngine(chat_tokenizer, ["fine"])
    with Gateway(engine, chat_tokenizer, defaults=DEFAULTS) as gw, httpx.Client(timeout=TIMEOUT_S) as c:
        bad = c.post(f"{gw.base_url}/completions", json={"prompt": "boom!"})
        error = error_of(bad, 500)
        assert error["type"] == "server_error" and "scripted engine failure" in error["message"]
        good = c.post(f"{gw.base_url}/completions", json={"prompt": "ok"})
        assert good.status_code == 200 and good.json()["choices"][0]["text"] == "fine"


def test_the_server_binds_the_loopback_address_by_default(gateway):
    assert gateway.host == "127.0.0.1" and gateway.base_url.startswith("http://127.0.0.1:")
    with pytest.raises(KeyError):
        gateway.close_session("never-opened")
    with pytest.raises(ValueError, match="session ids are"):
        gateway.open_session("a/b")
