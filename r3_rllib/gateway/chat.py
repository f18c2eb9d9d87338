"""Chat messages in and out of the tokenizer's chat template.

Prompts are rendered as the text envs render theirs: ``apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)`` then tokenized without added special tokens (the template writes them), with the
request's ``tools`` passed to the template when it has some. Tool calls come back in Hermes style: the model writes
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks, which a request with tools gets as ``tool_calls``
(the blocks removed from the content).
"""

from __future__ import annotations

import json
import re
from typing import Any

from r3_rllib.gateway.protocol import GatewayError, invalid

_ROLES = {"system", "developer", "user", "assistant", "tool"}
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _text_content(content: Any, where: str) -> str | None:
    """A message's content as text: a string, None, or a list of ``{"type": "text"}`` parts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise GatewayError(
                    f"{where}: only text content parts are supported",
                    param="messages",
                    code="unsupported_content",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid("messages", f"{where}: content must be a string, a list of text parts or null")


def checked_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages, validated (a non-empty list of dicts with a known role), content parts joined to
    text; 400 errors naming the message otherwise."""
    if not isinstance(messages, list) or not messages:
        raise GatewayError("'messages' must be a non-empty list", param="messages", code="missing_messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise invalid("messages", f"messages[{i}] must be an object with a role in {sorted(_ROLES)}")
        out.append({**m, "content": _text_content(m.get("content"), f"messages[{i}]")})
    return out


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as chat templates expect it: tool-call arguments given as JSON strings (the OpenAI wire format)
    become objects, as vLLM's server passes them."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        function = dict((call or {}).get("function") or {})
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass  # left as written: the template renders the string
        fixed.append({**call, "function": function})
    return {**message, "tool_calls": fixed}


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat template's text for ``messages`` (``tools`` passed when given); a template error is a 400."""
    if not getattr(tokenizer, "chat_template", None):
        raise GatewayError(
            "the model's tokenizer has no chat template: use /v1/completions", code="no_chat_template"
        )
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    try:
        return tokenizer.apply_chat_template(
            [_template_message(m) for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except Exception as e:  # a jinja error raised by the template on these messages
        raise GatewayError(f"the chat template failed on these messages: {e}", param="messages") from None


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids, no special token added (a rendered template writes its own)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def parse_tool_calls(text: str, call_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The content left after the Hermes ``<tool_call>`` blocks of ``text`` and the calls they hold, as OpenAI
    ``tool_calls`` (arguments as a JSON string; ids ``{call_id}_{k}``). A block that is not a JSON object with a
    ``name`` stays in the content."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    at = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        args = payload.get("arguments", {})
        kept.append(text[at : match.start()])
        at = match.end()
        calls.append(
            {
                "id": f"{call_id}_{len(calls)}",
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def _calls_key(calls: Any) -> list[tuple[str, Any]] | None:
    """Tool calls compared by name and parsed arguments (their ids and JSON spacing do not matter)."""
    if not calls:
        return None
    key = []
    for call in calls:
        function = (call or {}).get("function") or {}
        args = function.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        key.append((function.get("name"), args))
    return key


def _message_key(message: dict[str, Any]) -> dict[str, Any]:
    """A message as compared across calls: null fields dropped, null content as empty, tool calls by name and
    parsed arguments (a client that rebuilds its history from SDK objects adds null fields and new call ids)."""
    key = {k: v for k, v in message.items() if v is not None and k not in ("content", "tool_calls")}
    key["content"] = message.get("content") or ""
    key["tool_calls"] = _calls_key(message.get("tool_calls"))
    return key


def same_messages(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two message lists are the same history (:func:`_message_key` equal, message by message)."""
    return len(a) == len(b) and all(_message_key(x) == _message_key(y) for x, y in zip(a, b, strict=True))


def same_reply(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether the assistant message a client sent back is the one the gateway returned (same content, empty and
    null alike, and the same tool calls)."""
    if sent.get("role") != "assistant":
        return False
    if (sent.get("content") or "") != (returned.get("content") or ""):
        return False
    return _calls_key(sent.get("tool_calls")) == _calls_key(returned.get("tool_calls"))
