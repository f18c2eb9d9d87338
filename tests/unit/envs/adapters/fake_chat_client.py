"""A scripted stand-in for ``openai.AsyncOpenAI`` in the adapter tests: each chat call returns the next scripted
reply (text, or a list of ``(name, arguments)`` tool calls) and is recorded with its request."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any


def _tool_calls(calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    return [
        SimpleNamespace(
            id=f"call_{i}", type="function", function=SimpleNamespace(name=n, arguments=json.dumps(a))
        )
        for i, (n, a) in enumerate(calls)
    ]


class _Message(SimpleNamespace):
    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        calls = [
            {
                "id": c.id,
                "type": c.type,
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in self.tool_calls or []
        ]
        data = {"role": "assistant", "content": self.content, "tool_calls": calls or None}
        return {k: v for k, v in data.items() if v is not None or not exclude_none}


class FakeChatClient:
    """``client.chat.completions.create(...)`` answering from ``replies`` in order; ``calls`` holds each request."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **request: Any) -> Any:
        self.calls.append(json.loads(json.dumps(request, default=str)))
        reply = self.replies.pop(0)
        if isinstance(reply, list):
            message = _Message(content=None, tool_calls=_tool_calls(reply))
        else:
            message = _Message(content=reply, tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")])
