"""A verifiers harness that runs its chat loop in this process (harness id ``"r3_in_process"``, registered by
:func:`r3_rllib.envs.adapters.verifiers_env.register_in_process_harness`): no program launched in a runtime, no ``uv``
bootstrap, so a verifiers env rolls out offline on an EnvRunner. verifiers' harness contract allows this: every model
call goes through the rollout's interception endpoint and secret, and the trace verifiers records is the record of
the run.

The loop of one segment: the task's system prompt and prompt, then chat calls until a reply calls no tool (or
``max_tool_turns`` calls were made). The tools are the task's verifiers toolsets (MCP servers verifiers serves per
rollout; ``mcp_urls``), listed and called with verifiers' own MCP helpers and sent in each request's ``tools`` as
``{server}_{tool}``; a reply's ``tool_calls`` are answered with ``tool`` messages. A multi-turn env continues the
exchange through ``resume`` (verifiers' default, which relaunches with the accumulated conversation). Needs the
``verifiers`` extra.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

from openai import AsyncOpenAI
from verifiers.v1 import Harness, HarnessConfig
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult


class InProcessChatHarnessConfig(HarnessConfig):
    """The in-process harness's config: ``max_tool_turns``, the most chat calls of one segment."""

    id: str = "r3_in_process"
    max_tool_turns: int = 8


async def _answer(servers: Any, dispatch: dict[str, Any], call: Any) -> dict[str, Any]:
    """The ``tool`` message answering one tool call (an unknown tool or bad arguments: an error text)."""
    name = call.function.name
    try:
        args = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as exc:
        return {"role": "tool", "tool_call_id": call.id, "content": f"(tool error) bad arguments: {exc}"}
    if name not in dispatch or not isinstance(args, dict):
        content: Any = (
            f"(tool error) unknown tool {name!r}" if name not in dispatch else "(tool error) bad arguments"
        )
    else:
        try:
            content = await call_mcp(servers, dispatch, name, args)
        except Exception as exc:  # a failing tool answers the model; the rollout goes on
            content = f"(tool error) {type(exc).__name__}: {exc}"
    return {"role": "tool", "tool_call_id": call.id, "content": content}


class InProcessChatHarness(Harness[InProcessChatHarnessConfig]):
    """Chat calls with the task's toolsets, in this process, through the interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: Any,
        **_: Any,
    ) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in prompt]
        servers_config = {
            "mcpServers": {n: {"url": u, "timeout": self.config.tool_timeout} for n, u in mcp_urls.items()}
        }
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(client.close)
            tools, dispatch, servers = await connect_mcp(servers_config, stack) if mcp_urls else ([], {}, {})
            extra = {"tools": tools} if tools else {}
            for _ in range(self.config.max_tool_turns):
                response = await client.chat.completions.create(model=ctx.model, messages=messages, **extra)
                message = response.choices[0].message
                if not message.tool_calls:
                    break
                messages.append(message.model_dump(exclude_none=True))
                messages += [await _answer(servers, dispatch, call) for call in message.tool_calls]
        return ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["InProcessChatHarness", "InProcessChatHarnessConfig"]
