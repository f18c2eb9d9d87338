"""MCP tool servers (``mcp``, stdio transport) as the tools of math problems (``env: mcp``)::

    R3Config().environment("mcp", env_config={
        "data": "problems.jsonl",                             # MathEnv's data, prompts and grading
        "server": {"command": "python", "args": ["my_tools_server.py"]},
        "trust_server": True,                                 # required: the server runs outside the sandbox
    })

**Trust.** The server is a program of the user's, started as a process of this user (``server.command``), with
this user's files and network: r3-rllib's sandbox (:mod:`r3_rllib.tools.sandbox`) runs one-shot code under limits,
not a long-lived server it talks to over pipes. The env refuses to start a server unless ``trust_server: true``
says the user vouches for it (a ``PermissionError`` naming the flag).

**Two ways to roll it out**, one server connection per env (:class:`McpConnection`, held open by a background
thread; calls from any thread or event loop):

- the multi-turn tool loop (:mod:`r3_rllib.rollout.kinds.tool_use`, a :class:`~r3_rllib.envs.base.ToolUseEnv`):
  the prompt lists the server's tools; a model turn that writes
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and ends gets the tool's result back as the next
  user message (``<tool_response>`` block; the chat template's rendering, as for ``python_tool``); a turn without a
  call is the final answer, graded as :class:`~r3_rllib.envs.math_env.MathEnv` grades it;
- an agent run through the rollout gateway (:meth:`McpToolEnv.run_agent`): the tools go in the chat request's
  ``tools`` (OpenAI function format; ``openai_tools: false`` leaves them to the prompt alone), a reply's
  ``tool_calls`` (or ``<tool_call>`` blocks in its text) are answered with the tools' results, until a reply calls
  none; then it is graded.

**Answers.** By default the final answer is the last ``\\boxed{}`` of the model's text (MathEnv's grading).
``answer_format: "plain"`` takes the final reply itself as the answer instead (the text after the last
``</tool_call>``, stripped), graded by the same grader as if it stood in ``\\boxed{}`` (so it is read as a
boxed answer is): for models that answer a bare question (``prompt_template: "{problem}"``) with the answer alone.

Needs the ``mcp`` extra (``pip install 'r3-rllib[mcp]'``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from r3_rllib.envs.adapters.common import require_extra
from r3_rllib.envs.math_env import MathEnv
from r3_rllib.envs.python_tool import tool_message_text
from r3_rllib.rewards.math_grader import shared_grader

TRUST_FLAG = "trust_server"
DEFAULT_MCP_PROMPT = (
    '{problem}\n\nYou may call these tools:\n{tools}\nTo call one, write <tool_call>{"name": NAME, '
    '"arguments": {...}}</tool_call> and end your message; its result will be returned to you. Put the final '
    "answer within \\boxed{}."
)
ANSWER_FORMATS = ("boxed", "plain")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``(name, arguments)`` of every ``<tool_call>{json}</tool_call>`` block of ``text``; a block
    that is not a JSON object with a string ``name`` is a call of the tool ``""`` (answered with an error)."""
    calls = []
    for block in _TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(("", {"_raw": block}))
            continue
        args = data.get("arguments")
        calls.append((data["name"], args if isinstance(args, dict) else {}))
    return calls


def result_text(result: Any) -> str:
    """An MCP ``CallToolResult`` as text: its text blocks joined (other blocks by their type), prefixed
    ``(tool error)`` when the tool reported an error."""
    parts = [getattr(b, "text", None) or f"({getattr(b, 'type', 'content')})" for b in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, default=str)]
    text = "\n".join(parts)
    return f"(tool error) {text}" if result.is_error else text


class McpConnection:
    """One MCP server over stdio: started, initialized and its tools listed at construction (``start_timeout_s``),
    held open by an event loop on a background thread until :meth:`close`. :meth:`call` (any thread) and
    :meth:`acall` (any event loop) run a tool with a ``call_timeout_s`` limit and return its text; a failure comes
    back as error text (a tool episode never raises)."""

    def __init__(self, server: Mapping[str, Any], *, start_timeout_s: float, call_timeout_s: float) -> None:
        mcp = require_extra("mcp", "mcp", "env 'mcp'")
        self._params = mcp.StdioServerParameters(**dict(server))
        self._mcp = mcp
        self.call_timeout_s = float(call_timeout_s)
        self._loop = asyncio.new_event_loop()
        self._ready: Future = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._serve(),), daemon=True
        )
        self._thread.start()
        try:
            self.tools: list[Any] = self._ready.result(timeout=start_timeout_s)
        except Exception as exc:
            self.close()
            raise RuntimeError(
                f"mcp: the server {self._params.command} {' '.join(self._params.args)} did not start and list "
                f"its tools within {start_timeout_s:g} s: {type(exc).__name__}: {exc}"
            ) from exc

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self._mcp.stdio_client(self._params) as (read, write):
                async with self._mcp.ClientSession(read, write) as session:
                    await session.initialize()
                    self._session = session
                    listed = await session.list_tools()
                    self._ready.set_result(list(listed.tools))
                    await self._stop.wait()
        except BaseException as exc:  # a server that fails to start: the constructor reports it
            if not self._ready.done():
                self._ready.set_exception(exc)

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        try:
            result = await asyncio.wait_for(self._session.call_tool(name, arguments), self.call_timeout_s)
        except TimeoutError:
            return f"(tool error) {name} did not answer within {self.call_timeout_s:g} s"
        except Exception as exc:
            return f"(tool error) {type(exc).__name__}: {exc}"
        return result_text(result)

    def _submit(self, name: str, arguments: dict[str, Any]) -> Future:
        known = {t.name for t in self.tools}
        if name not in known:
            done: Future = Future()
            done.set_result(f"(tool error) unknown tool {name!r}; tools: {', '.join(sorted(known))}")
            return done
        return asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool ``name`` (blocking the calling thread)."""
        return self._submit(name, arguments).result(timeout=self.call_timeout_s + 5.0)

    async def acall(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool ``name`` from an event loop other than the connection's own."""
        return await asyncio.wrap_future(self._submit(name, arguments))

    def openai_tools(self) -> list[dict[str, Any]]:
        """The server's tools in the OpenAI chat ``tools`` format."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.input_schema,
                },
            }
            for t in self.tools
        ]

    def close(self) -> None:
        """Stop the session and the server process (idempotent)."""
        if self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10.0)


def tools_listing(tools: Sequence[Any]) -> str:
    """One line per tool: ``- name(json schema of its arguments): description``."""
    return "\n".join(
        f"- {t.name}({json.dumps(t.input_schema.get('properties', {}))}): {t.description or ''}".rstrip()
        for t in tools
    )


@dataclass
class McpToolEpisode:
    """One trajectory's task for the tool-use loop: the prompt, the server's tools and the grader."""

    connection: McpConnection
    prompt: str
    answers: tuple[str, ...]
    tokenizer: Any
    grading_timeout_s: float
    max_output_chars: int

    def tool_reply(self, turn_text: str) -> str | None:
        calls = parse_tool_calls(turn_text)
        if not calls:
            return None
        outputs = [self.connection.call(name, args)[: self.max_output_chars] for name, args in calls]
        content = "\n".join(f"<tool_response>\n{out}\n</tool_response>" for out in outputs)
        return tool_message_text(self.tokenizer, content)

    answer_format: str = "boxed"

    def finish(self, model_text: str) -> tuple[float, bool, dict[str, Any]]:
        final = model_text.rsplit("</tool_call>", 1)[-1]
        return grade(model_text, self.answers, self.grading_timeout_s, self.answer_format, final)


def grade(
    model_text: str,
    answers: Sequence[str],
    timeout_s: float,
    answer_format: str = "boxed",
    final_reply: str = "",
) -> tuple[float, bool, dict[str, Any]]:
    """``(reward, correct, info)`` of a trajectory against the gold ``answers`` (MathEnv's grader): its model
    text's last ``\\boxed{}`` (``answer_format="boxed"``), or its ``final_reply``, stripped, as the boxed answer
    (``"plain"``)."""
    graded = model_text if answer_format == "boxed" else "\\boxed{" + final_reply.strip() + "}"
    result = shared_grader(timeout_s).grade(graded, tuple(answers), think_in_prompt=False)
    return (1.0 if result.correct else 0.0), result.correct, {"grade_reason": result.reason}


class McpToolEnv(MathEnv):
    """:class:`MathEnv`'s problems, prompts and grading, solved with an MCP server's tools over several turns.

    Config (besides every :class:`MathEnv` option; ``prompt_template`` may hold ``{tools}``, the tools' listing):
        server: the stdio server: ``command``, and optionally ``args``, ``env``, ``cwd``.
        trust_server: must be true: the server runs outside the sandbox (see the module docstring).
        start_timeout_s: the server must start and list its tools within it. tool_timeout_s: one call's limit.
        max_tool_output_chars: a tool's output shown to the model is cut here.
        max_turns: model turns of an agent run at most. openai_tools: send the tools in agent runs' requests.
        sampling: extra keyword arguments of each chat call of an agent run.
        answer_format: ``"boxed"`` (default: the last ``\\boxed{}``) or ``"plain"`` (the final reply is the
            answer; see the module docstring).
    """

    def __init__(
        self,
        *,
        server: Mapping[str, Any],
        trust_server: bool = False,
        prompt_template: str = DEFAULT_MCP_PROMPT,
        start_timeout_s: float = 30.0,
        tool_timeout_s: float = 10.0,
        max_tool_output_chars: int = 2000,
        max_turns: int = 4,
        openai_tools: bool = True,
        sampling: Mapping[str, Any] | None = None,
        answer_format: str = "boxed",
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
        **math_config: Any,
    ) -> None:
        if trust_server is not True:
            raise PermissionError(
                f"env 'mcp' would start the MCP server {dict(server).get('command')!r} as a process of this user, "
                f"outside r3-rllib's sandbox (it can read and write this user's files and reach the network); set "
                f"env_config {TRUST_FLAG}: true if you trust that server"
            )
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"mcp: answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        if max_turns < 1 or max_tool_output_chars < 1:
            raise ValueError(
                f"mcp: need max_turns and max_tool_output_chars >= 1, got {max_turns}, "
                f"{max_tool_output_chars}"
            )
        self.connection = McpConnection(
            server, start_timeout_s=start_timeout_s, call_timeout_s=tool_timeout_s
        )
        try:
            super().__init__(
                prompt_template=prompt_template.replace("{tools}", tools_listing(self.connection.tools)),
                model_max_positions=model_max_positions,
                max_new_tokens=max_new_tokens,
                **math_config,
            )
        except BaseException:
            self.connection.close()
            raise
        self.max_tool_output_chars, self.max_turns = int(max_tool_output_chars), int(max_turns)
        self.openai_tools, self.sampling = bool(openai_tools), dict(sampling or {})
        self.answer_format = answer_format

    def close(self) -> None:
        self.connection.close()
        super().close()

    def tool_episode(self, query_id: str, user_content: str | None = None) -> McpToolEpisode:
        """A fresh trajectory task for ``query_id`` (``user_content``: a reflection prompt's user turn instead)."""
        problem = self.problem(query_id)
        prompt = self.render_prompt(self.user_text(problem) if user_content is None else user_content)
        tokenizer = self.tokenizer if self.use_chat_template else None
        return McpToolEpisode(
            self.connection,
            prompt,
            problem.answers,
            tokenizer,
            self.grading_timeout_s,
            self.max_tool_output_chars,
            self.answer_format,
        )

    def agent_task(self, query_id: str) -> dict[str, Any]:
        """The problem as an agent task: ``{"id", "prompt" (the user turn), "answers"}``."""
        problem = self.problem(query_id)
        return {"id": problem.id, "prompt": self.user_text(problem), "answers": list(problem.answers)}

    async def run_agent(self, client: Any, model: str, task: dict[str, Any]) -> dict[str, Any]:
        """An agent run on ``task``: chat calls with the server's tools until a reply calls none; graded then."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}] * bool(
            self.system_prompt
        )
        messages.append({"role": "user", "content": task["prompt"]})
        extra = dict(self.sampling) | ({"tools": self.connection.openai_tools()} if self.openai_tools else {})
        model_text, calls = "", 0
        for _ in range(self.max_turns):
            response = await client.chat.completions.create(model=model, messages=messages, **extra)
            message = response.choices[0].message
            model_text += message.content or ""
            final = message.content or ""
            replies, n_calls = await self._answer_calls(message)
            if not n_calls:
                break
            calls += n_calls
            messages += replies
        reward, correct, info = grade(
            model_text, task["answers"], self.grading_timeout_s, self.answer_format, final
        )
        return {"reward": reward, "correct": correct, "info": info | {"tool_calls": calls}}

    async def _answer_calls(self, message: Any) -> tuple[list[dict[str, Any]], int]:
        """The reply and the messages that answer its tool calls (its native ``tool_calls``, else its
        ``<tool_call>`` blocks), and how many calls it made (0: none, the run ends)."""
        cut = self.max_tool_output_chars
        native = list(message.tool_calls or [])
        if native:
            replies: list[dict[str, Any]] = [message.model_dump(exclude_none=True)]
            for call in native:
                try:
                    args = json.loads(call.function.arguments or "{}")
                except json.JSONDecodeError:
                    args = {"_raw": call.function.arguments}
                output = await self.connection.acall(
                    call.function.name, args if isinstance(args, dict) else {}
                )
                replies.append({"role": "tool", "tool_call_id": call.id, "content": output[:cut]})
            return replies, len(native)
        calls = parse_tool_calls(message.content or "")
        if not calls:
            return [], 0
        outputs = [(await self.connection.acall(name, args))[:cut] for name, args in calls]
        content = "\n".join(f"<tool_response>\n{out}\n</tool_response>" for out in outputs)
        return [{"role": "assistant", "content": message.content}, {"role": "user", "content": content}], len(
            calls
        )
