"""Sessions: one agent run's calls, recorded, and the token-faithful prompt of each chat call.

**Continuation.** A chat call *extends* an earlier call of its session (the latest one that fits) when its
messages start with that call's messages (null fields and tool-call ids aside) followed by an assistant message
equal to a reply the gateway returned for it (same content, empty and null alike, and the same tool calls by name
and arguments), and its ``tools`` and template options are the same. Its prompt is then

    earlier prompt_ids + that reply's completion_ids + encode(suffix)

where the completion ids are the sampled tokens exactly (the stop token included when generation stopped on
one), and ``suffix`` is the text the template renders after the end of the assistant turn, tokenized alone:

1. ``through`` = the template over the messages up to and including that assistant message (no generation
   prompt); ``full`` = the template over all the request's messages (generation prompt on); ``turn_end`` = what the
   template writes after an assistant message's content (found by rendering a placeholder content).
2. The template must be append-only over this step: ``through`` starts with the earlier call's prompt text,
   ``full`` starts with ``through``, and ``through`` ends with ``turn_end``; otherwise the prompt is rendered fresh.
3. The end of turn: when the reply stopped on a token whose text begins ``turn_end`` (e.g. ``<|im_end|>`` of
   ``<|im_end|>\\n``), that token is already among the completion ids, and only the rest of ``turn_end`` (the
   ``\\n``) belongs to the suffix; when it stopped at the length limit or on another token, the whole ``turn_end``
   does (the template closes the turn the model left open).
4. ``suffix`` = that rest of ``turn_end`` + ``full[len(through):]`` (the new messages and the generation prompt).

No earlier turn is re-tokenized: the model sees exactly the tokens it saw and sampled before. A call that extends
none (the first call, a rewritten history, a template that is not append-only, a changed tool list) is rendered
fresh from its messages. ``CallRecord.extra`` says which: ``extended`` (bool), ``extends_call`` (the index of the
call extended, or None), ``prompt_source`` (``"extended"``, ``"first_call"``, ``"history_rewritten"``,
``"template_not_append_only"``). A prompt given as token ids (``/completions``, ``/inference/v1/generate``) is
used as given; it extends the latest earlier call whose prompt + completion ids it starts with (``prompt_source``
``"extended"``, else ``"token_ids"``, or ``"text"`` for a text prompt, which is encoded whole).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from r3_rllib.gateway.chat import encode, render_chat, same_messages, same_reply
from r3_rllib.gateway.protocol import GatewayError
from r3_rllib.types.calls import CallRecord

# A placeholder assistant content: what the template writes after it is the template's end of an assistant turn.
_SESSION_ID = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_PLACEHOLDER = "\x00r3-gateway-turn-end\x00"


@dataclass
class Reply:
    """One choice of a finished chat call: the assistant message returned and the tokens sampled."""

    message: dict[str, Any]
    completion_ids: list[int]
    finish_reason: str


@dataclass
class Turn:
    """A finished chat call, kept so that later calls can extend it."""

    index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] | None
    prompt_ids: list[int]
    prompt_text: str
    replies: list[Reply]


@dataclass
class ChatPrompt:
    """A chat call's prompt: its token ids, its rendered text (the template's view of it) and where it came from."""

    prompt_ids: list[int]
    prompt_text: str
    source: str
    extends_call: int | None = None
    reused_tokens: int = 0


@dataclass
class Session:
    """One agent run: its calls' records and finished chat turns, in call order."""

    id: str
    order: int
    next_index: int = 0
    turns: list[Turn] = field(default_factory=list)
    records: dict[int, list[CallRecord]] = field(default_factory=dict)
    #: Each finished call's (index, prompt + completion ids) per choice: what a token-id prompt may extend.
    sequences: list[tuple[int, list[int]]] = field(default_factory=list)

    def claim_index(self) -> int:
        """The next call's index within the session."""
        index, self.next_index = self.next_index, self.next_index + 1
        return index


def _suffix(
    tokenizer: Any, turn: Turn, reply: Reply, messages: list[dict[str, Any]], full: str
) -> str | None:
    """The text after the extended reply's last sampled token (module docstring, steps 1-4); None when the
    template is not append-only over this step."""
    k = len(turn.messages)
    through = render_chat(
        tokenizer,
        messages[: k + 1],
        turn.tools,
        add_generation_prompt=False,
        template_kwargs=turn.template_kwargs,
    )
    probe = render_chat(
        tokenizer,
        [*turn.messages, {"role": "assistant", "content": _PLACEHOLDER}],
        turn.tools,
        add_generation_prompt=False,
        template_kwargs=turn.template_kwargs,
    )
    if _PLACEHOLDER not in probe:
        return None
    turn_end = probe[probe.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :]
    if not (through.startswith(turn.prompt_text) and full.startswith(through) and through.endswith(turn_end)):
        return None
    rest = turn_end
    if reply.finish_reason == "stop" and reply.completion_ids:
        stop_text = tokenizer.decode(reply.completion_ids[-1:], skip_special_tokens=False)
        if stop_text and turn_end.startswith(stop_text):
            rest = turn_end[len(stop_text) :]
    return rest + full[len(through) :]


def _extended_reply(
    turn: Turn, messages: list[dict[str, Any]], tools: Any, template_kwargs: Any
) -> Reply | None:
    """The reply of ``turn`` that ``messages`` continue (its messages, then that reply), or None."""
    k = len(turn.messages)
    if len(messages) <= k or turn.tools != tools or turn.template_kwargs != template_kwargs:
        return None
    if not same_messages(messages[:k], turn.messages):
        return None
    return next((r for r in turn.replies if same_reply(messages[k], r.message)), None)


def chat_prompt(
    tokenizer: Any,
    session: Session | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
) -> ChatPrompt:
    """The prompt of a chat call: extending the latest earlier call of ``session`` that it continues, else
    rendered fresh (module docstring)."""
    full = render_chat(
        tokenizer, messages, tools, add_generation_prompt=True, template_kwargs=template_kwargs
    )
    turns = session.turns if session is not None else []
    source = "first_call" if not turns else "history_rewritten"
    for turn in reversed(turns):
        reply = _extended_reply(turn, messages, tools, template_kwargs)
        if reply is None:
            continue
        suffix = _suffix(tokenizer, turn, reply, messages, full)
        if suffix is None:
            source = "template_not_append_only"
            break
        head = turn.prompt_ids + reply.completion_ids
        return ChatPrompt(head + encode(tokenizer, suffix), full, "extended", turn.index, len(head))
    return ChatPrompt(encode(tokenizer, full), full, source)


def token_prompt(session: Session | None, prompt_ids: list[int], source: str) -> ChatPrompt:
    """A prompt given as token ids (or text encoded whole), with the latest earlier call of ``session`` whose
    prompt + completion ids it starts with (the caller kept them exactly): ``source`` "extended" then."""
    for index, sequence in reversed(session.sequences if session is not None else []):
        if len(sequence) <= len(prompt_ids) and prompt_ids[: len(sequence)] == sequence:
            return ChatPrompt(prompt_ids, "", "extended", index, len(sequence))
    return ChatPrompt(prompt_ids, "", source)


class SessionStore:
    """The open sessions, in the order they were opened (thread-safe: the gateway's owner opens and closes them,
    the server's handlers read and record)."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._opened = 0
        self._on_change = on_change

    def open(self, session_id: str) -> str:
        """Open ``session_id``; ValueError when it is open already or is not a URL-safe name."""
        if not _SESSION_ID.fullmatch(session_id):
            raise ValueError(f"session ids are 1-128 characters of [A-Za-z0-9_.-], got {session_id!r}")
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} is open already")
            self._sessions[session_id] = Session(session_id, self._opened)
            self._opened += 1
        return session_id

    def close(self, session_id: str) -> list[CallRecord]:
        """Close ``session_id`` and return its records in call order (choices in order); KeyError when unknown."""
        with self._lock:
            session = self._sessions.pop(session_id)
        if self._on_change is not None:
            self._on_change()
        return [r for index in sorted(session.records) for r in session.records[index]]

    def get(self, session_id: str) -> Session:
        """The open session ``session_id``; a 404 error when there is none."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise GatewayError(
                f"unknown session {session_id!r}", status=404, param="session_id", code="session_not_found"
            )
        return session

    def open_ids(self) -> set[str]:
        """The ids of the open sessions."""
        with self._lock:
            return set(self._sessions)

    def is_open(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions
