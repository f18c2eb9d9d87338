"""A verifiers harness that runs its chat loop in this process (harness id ``"r3_in_process"``, registered by
:func:`r3_rllib.envs.adapters.verifiers_env.register_in_process_harness`): no program launched in a runtime, no ``uv`` bootstrap, so a
verifiers env rolls out offline on an EnvRunner. verifiers' harness contract allows this: every model call goes
through the rollout's interception endpoint and secret, and the trace verifiers records is the record of the run.

The loop: the task's system prompt and prompt, one non-streaming chat call, then the call's tool calls (none: the
harness offers no tools of its own) end the segment; a multi-turn env continues it through ``resume`` (verifiers'
default, which relaunches with the accumulated conversation). Needs the ``verifiers`` extra.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI
from verifiers.v1 import Harness, HarnessConfig
from verifiers.v1.runtimes import ProgramResult


class InProcessChatHarnessConfig(HarnessConfig):
    """The in-process harness's config (no options of its own)."""

    id: str = "r3_in_process"


class InProcessChatHarness(Harness[InProcessChatHarnessConfig]):
    """One chat call per segment, in this process, through the interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
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
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["InProcessChatHarness", "InProcessChatHarnessConfig"]
