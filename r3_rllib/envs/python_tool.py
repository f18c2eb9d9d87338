"""Math problems solved with a Python tool: multi-turn tool use, one trajectory per training sample.

The model may write a fenced ```` ```python ```` block and end its turn; the block runs in the sandbox
(:func:`r3_rllib.tools.sandbox.run_python`: separate process, limits, throwaway directory; private filesystem
and no network under its ``namespaces`` isolation, see ``tool_isolation``) and its output
comes back as the next message, in an ```` ```output ```` block; the model continues, and ends with a ``\\boxed{}``
answer graded as :class:`~r3_rllib.envs.math_env.MathEnv` grades it (the outcome reward, at the end). The loop that
runs these episodes token in, token out is :func:`r3_rllib.rollout.kinds.tool_use.rollout_tool_use`.

The tool's message is rendered with the tokenizer's chat template as a user turn followed by the assistant's
generation prompt, appended right after the model's end-of-turn token (the difference between two renderings, so
earlier turns are never re-tokenized); without a chat template it is a plain ```` ```output ```` block.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from r3_rllib.envs.data import MathProblem
from r3_rllib.envs.math_env import MathEnv
from r3_rllib.rewards.math_grader import shared_grader
from r3_rllib.tools.sandbox import LIMIT_MAXIMA as SANDBOX_MAX
from r3_rllib.tools.sandbox import (
    MIN_MEMORY_MB,
    landlock_abi,
    namespaces_unavailable_reason,
    resolve_isolation,
    run_python,
    sandbox_user_unavailable_reason,
)

logger = logging.getLogger(__name__)
_warned_fallback = False

DEFAULT_TOOL_PROMPT = (
    "{problem}\n\nYou may run Python code: write it in a ```python block and end your message; its output will "
    "be returned to you. Put the final answer within \\boxed{}."
)
_PYTHON_BLOCK = re.compile(r"```python\s*\n(.*?)```", re.DOTALL)


def last_python_block(text: str) -> str | None:
    """The code of the last complete ```python block of `text`, or None."""
    blocks = _PYTHON_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def tool_message_text(tokenizer: Any, content: str) -> str:
    """The text to append after a model turn that ended with the tokenizer's eos token so that the sequence reads as
    a user message with `content` followed by the assistant's generation prompt (chat template), or a plain
    ```output block when the tokenizer has no chat template or its rendering is not append-only."""
    plain = f"\n```output\n{content}\n```\n"
    if tokenizer is None or not getattr(tokenizer, "chat_template", None) or not tokenizer.eos_token:
        return plain
    render = tokenizer.apply_chat_template
    user = [{"role": "user", "content": "Q"}]
    head = render(user, tokenize=False, add_generation_prompt=True)
    turns = user + [{"role": "assistant", "content": "A"}, {"role": "user", "content": content}]
    full = render(turns, tokenize=False, add_generation_prompt=True)
    turn_end = head + "A" + tokenizer.eos_token
    return full[len(turn_end) :] if full.startswith(turn_end) else plain


@dataclass
class PythonToolEpisode:
    """One trajectory's task: the prompt, the sandboxed tool, and the grader of the final answer."""

    problem: MathProblem
    prompt: str
    tokenizer: Any
    timeout_s: float
    memory_mb: int
    max_output_chars: int
    grading_timeout_s: float
    #: The sandbox isolation every tool call of this episode runs under ("namespaces" or "rlimits").
    isolation: str = "namespaces"

    def tool_reply(self, turn_text: str) -> str | None:
        code = last_python_block(turn_text)
        if code is None:
            return None
        try:
            result = run_python(
                code, timeout_s=self.timeout_s, memory_mb=self.memory_mb, isolation=self.isolation
            )
            output = result.output
            if result.timed_out:
                output += f"\n(timed out after {self.timeout_s:g} s)"
            elif result.output_truncated:
                output += "\n(output truncated)"
        except (
            Exception
        ) as e:  # the sandbox itself failed: this turn gets the error text, the rollout goes on
            output = f"(tool error: {type(e).__name__}: {e})"
        if len(output) > self.max_output_chars:
            output = output[: self.max_output_chars] + "\n(output truncated)"
        return tool_message_text(self.tokenizer, output.rstrip("\n"))

    def finish(self, model_text: str) -> tuple[float, bool, dict[str, Any]]:
        grade = shared_grader(self.grading_timeout_s).grade(
            model_text, self.problem.answers, think_in_prompt=False
        )
        info = {"grade_reason": grade.reason, "tool_isolation": self.isolation}
        return (1.0 if grade.correct else 0.0), grade.correct, info


class PythonToolEnv(MathEnv):
    """:class:`MathEnv`'s problems, prompts and grading, solved with a sandboxed Python tool over several turns.

    Config (besides every :class:`MathEnv` option; the default ``prompt_template`` explains the tool):
        tool_timeout_s: wall-clock limit of one tool call. tool_memory_mb: its address-space limit.
        max_tool_output_chars: the tool output shown to the model is cut here.
        tool_isolation: the sandbox isolation, "auto" (default: "namespaces" where this process may create them,
            else the weaker "rlimits", with a warning logged once), "namespaces" (refuse to build the env where
            they are not available: a RuntimeError that says why) or "rlimits". The isolation in use is
            ``env.tool_isolation`` and every trajectory's ``info["tool_isolation"]``.
        model_max_positions, max_new_tokens: :class:`MathEnv`'s context check, named here so that the EnvRunner
            fills them in (it hands them to envs whose signature names them).
        apply_chat_template: as for :class:`MathEnv`; the tool's messages follow it (plain ```output blocks
            when prompts are plain text).

    ``tool_episode(query_id, user_content=None)`` hands out one trajectory's task for the tool-use loop; the
    single-step ``reset``/``step`` of :class:`MathEnv` still work (one answer, no tool).
    """

    def __init__(
        self,
        *,
        prompt_template: str = DEFAULT_TOOL_PROMPT,
        tool_timeout_s: float = 5.0,
        tool_memory_mb: int = 512,
        max_tool_output_chars: int = 2000,
        tool_isolation: str = "auto",
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
        **math_config: Any,
    ) -> None:
        # before the data is loaded: a bad limit is a config error, found without reading a file
        _check_tool_limits(tool_timeout_s, tool_memory_mb, max_tool_output_chars)
        super().__init__(
            prompt_template=prompt_template,
            model_max_positions=model_max_positions,
            max_new_tokens=max_new_tokens,
            **math_config,
        )
        self.tool_timeout_s, self.tool_memory_mb = float(tool_timeout_s), int(tool_memory_mb)
        self.max_tool_output_chars = int(max_tool_output_chars)
        self.tool_isolation = _isolation_for_tools(tool_isolation)

    def tool_episode(self, query_id: str, user_content: str | None = None) -> PythonToolEpisode:
        """A fresh trajectory task for `query_id` (`user_content`: a reflection prompt's user turn instead)."""
        problem = self.problem(query_id)
        prompt = self.render_prompt(self.user_text(problem) if user_content is None else user_content)
        return PythonToolEpisode(
            problem,
            prompt,
            self.tokenizer
            if self.use_chat_template
            else None,  # None: tool output as a plain ```output block
            self.tool_timeout_s,
            self.tool_memory_mb,
            self.max_tool_output_chars,
            self.grading_timeout_s,
            self.tool_isolation,
        )


def _check_tool_limits(timeout_s: Any, memory_mb: Any, max_output_chars: Any) -> None:
    """A ValueError naming the first tool setting outside its range. The ranges are the sandbox's own
    (:func:`~r3_rllib.tools.sandbox.run_python` checks them on every call): a value it refuses would otherwise be
    accepted here and turn every tool call of the run into a "(tool error: ...)" message to the model."""
    top_s, top_mb = SANDBOX_MAX["timeout_s"], SANDBOX_MAX["memory_mb"]
    if not (_is_number(timeout_s) and math.isfinite(timeout_s) and 0 < timeout_s <= top_s):
        raise ValueError(
            f"tool_timeout_s must be a finite number > 0 and <= {top_s} (seconds), got {timeout_s!r}"
        )
    if not (_is_whole(memory_mb) and MIN_MEMORY_MB <= memory_mb <= top_mb):
        raise ValueError(
            f"tool_memory_mb must be a whole number >= {MIN_MEMORY_MB} and <= {top_mb} (MiB), got {memory_mb!r}"
        )
    if not (_is_whole(max_output_chars) and max_output_chars >= 1):
        raise ValueError(f"max_tool_output_chars must be a whole number >= 1, got {max_output_chars!r}")


def _is_number(value: Any) -> bool:
    """A real number and not a bool (True would pass as 1 second or 1 MiB)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_whole(value: Any) -> bool:
    """An int, or a float with no fraction (a run file may write ``512.0``); not a bool, NaN or inf."""
    return _is_number(value) and math.isfinite(value) and float(value).is_integer()


def _rlimits_reach() -> str:
    """Whom tool code runs as under "rlimits", and what it can reach (tools/sandbox.py, tools/landlock.py)."""
    user, everything = "this user", "what this user can reach"
    if os.geteuid() == 0:
        # As root (a container's default user, without CAP_SYS_ADMIN) the code runs as a sandbox user id of its own
        # where that user can start the interpreter, else as root.
        why_root = sandbox_user_unavailable_reason(sys.executable)
        user, everything = (
            ("a sandbox user id of its own (no groups)", "what any user can reach")
            if why_root is None
            else (f"root (not a sandbox user id: {why_root})", "every file and process of this machine")
        )
    abi = landlock_abi()
    if abi < 1:
        return f"{user}: it can read, write and signal {everything}, and the network (the kernel has no Landlock)"
    tcp = "no TCP connection" if abi >= 4 else "the network open"
    signals = "no signal to a process outside the sandbox" if abi >= 6 else f"signals to {everything}"
    return (
        f"{user}, confined by Landlock (ABI {abi}): it reads only the system and Python directories and writes only "
        f"its scratch folder and /dev/shm, with {tcp} and {signals}"
    )


def _isolation_for_tools(requested: str) -> str:
    """The isolation tool calls run under; 'auto' falling back to 'rlimits' is logged (once per process), since
    that fallback leaves more of the host to the model's code: how much, the warning says."""
    global _warned_fallback
    if requested not in ("auto", "namespaces", "rlimits"):
        raise ValueError(f"tool_isolation must be 'auto', 'namespaces' or 'rlimits', got {requested!r}")
    mode = resolve_isolation(requested)  # type: ignore[arg-type]
    if requested == "auto" and mode == "rlimits" and not _warned_fallback:
        _warned_fallback = True
        logger.warning(
            "python_tool: sandbox namespaces are not available here (%s); tool code runs under the weaker 'rlimits' "
            "isolation, as %s. Set tool_isolation: namespaces to refuse this.",
            namespaces_unavailable_reason() or "they need Linux and root",
            _rlimits_reach(),
        )
    return mode
