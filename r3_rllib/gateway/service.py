"""What the gateway does with one request: parse it, build the prompt's token ids, sample through the batcher,
record the call in its session, and build the OpenAI response body (no HTTP here: :mod:`r3_rllib.gateway.server`
serves it).

**Context.** With ``max_context`` set, a prompt of ``max_context`` tokens or more is refused (400,
``context_length_exceeded``); a prompt that fits but leaves less room than ``max_tokens`` asks for is served with
``max_tokens`` clamped to the room left (the completion then ends with ``finish_reason`` "length"; the record's
``extra["max_tokens_clamped"]`` says so). ``max_context`` None checks nothing (the engine's own limit applies).

**Text.** A choice's text is its tokens decoded without special tokens, the final stop token left out (OpenAI
leaves the stop sequence out); the record's ``completion_ids`` keep that stop token.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from typing import Any

import numpy as np

from r3_rllib.engines.base import Completion, SamplingParams
from r3_rllib.gateway.batcher import Batcher, BatchResult, Pending
from r3_rllib.gateway.chat import checked_messages, encode, parse_tool_calls
from r3_rllib.gateway.protocol import (
    GENERATE_FIELDS,
    Endpoint,
    GatewayError,
    SamplingRequest,
    chat_logprobs,
    chat_response,
    clamp_to_context,
    completion_logprobs,
    completion_response,
    generate_logprobs,
    generate_response,
    invalid,
    sampling_request,
    token_strings,
    unsupported,
)
from r3_rllib.gateway.sessions import (
    ChatPrompt,
    Reply,
    Session,
    SessionStore,
    Turn,
    chat_prompt,
    token_prompt,
)
from r3_rllib.types.calls import CallRecord

# Calls outside a session sort after every session's calls within a batch.
_NO_SESSION = 1 << 62


class GatewayService:
    """Serves chat and completion requests against one batcher and one session store."""

    def __init__(
        self,
        tokenizer: Any,
        batcher: Batcher,
        sessions: SessionStore,
        *,
        model_name: str,
        defaults: SamplingParams,
        max_context: int | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.sessions = sessions
        self.model_name = model_name
        self.max_context = max_context
        self._defaults = defaults
        self._defaults_lock = threading.Lock()
        self._arrivals = itertools.count()

    @property
    def defaults(self) -> SamplingParams:
        with self._defaults_lock:
            return self._defaults

    @defaults.setter
    def defaults(self, params: SamplingParams) -> None:
        with self._defaults_lock:
            self._defaults = params

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` body: the one model served."""
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "r3-rllib"}
        if self.max_context is not None:
            card["max_model_len"] = self.max_context
        return {"object": "list", "data": [card]}

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model", self.model_name)
        if model != self.model_name:
            raise GatewayError(
                f"the model {model!r} does not exist; this gateway serves {self.model_name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )

    def _begin(
        self, body: dict[str, Any], session_id: str | None, endpoint: Endpoint
    ) -> tuple[Session | None, SamplingRequest]:
        session = self.sessions.get(session_id) if session_id is not None else None
        self._check_model(body)
        return session, sampling_request(body, endpoint, self.defaults, self.tokenizer)

    async def _sample(
        self, prompt_ids: list[int], request: SamplingRequest, session: Session | None, index: int
    ) -> BatchResult:
        order = (session.order, index) if session is not None else (_NO_SESSION, next(self._arrivals))
        pending = Pending(prompt_ids, request.n, request.params, session.id if session else None, order)
        try:
            return await asyncio.wrap_future(self.batcher.submit(pending))
        except GatewayError:
            raise
        except Exception as e:  # the engine's failure: a 500 with its message, the server serves on
            raise GatewayError(
                f"the engine failed: {type(e).__name__}: {e}",
                status=500,
                type="server_error",
                code="engine_error",
            ) from None

    async def chat(self, body: dict[str, Any], session_id: str | None) -> dict[str, Any]:
        """Serve one ``/chat/completions`` request (module docstring); returns the response body."""
        session, request = self._begin(body, session_id, "chat")
        messages = checked_messages(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise invalid("tools", "expected a list of tools")
        template_kwargs = body.get("chat_template_kwargs") or None
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise invalid("chat_template_kwargs", "expected an object")
        prompt = chat_prompt(self.tokenizer, session, messages, tools, template_kwargs)
        request, clamped = clamp_to_context(request, len(prompt.prompt_ids), self.max_context)
        index = session.claim_index() if session is not None else -1
        result = await self._sample(prompt.prompt_ids, request, session, index)
        parse_tools = tools is not None and body.get("tool_choice") != "none"
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        choices, replies = [], []
        for i, c in enumerate(result.completions):
            text = self._text(c)
            content, calls = parse_tool_calls(text, f"{call_id}_{i}") if parse_tools else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choice = {
                "index": i,
                "message": message,
                "finish_reason": "tool_calls" if calls else c.finish_reason,
            }
            choice["logprobs"] = self._logprobs(c, request, chat_logprobs)
            choice["token_ids"] = list(c.token_ids)
            choices.append(choice)
            replies.append(Reply(message, list(c.token_ids), c.finish_reason))
        if self._record(session, index, "chat", prompt, result, request, messages, clamped):
            turn = Turn(
                index, messages, tools, template_kwargs, prompt.prompt_ids, prompt.prompt_text, replies
            )
            session.turns.append(turn)
        return chat_response(self.model_name, prompt.prompt_ids, choices)

    async def completions(self, body: dict[str, Any], session_id: str | None) -> dict[str, Any]:
        """Serve one ``/completions`` request (a text prompt or a token-id list); returns the response body."""
        session, request = self._begin(body, session_id, "completions")
        raw = body.get("prompt")
        prompt_ids = self._prompt_ids(raw)
        source = (
            "text"
            if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], str))
            else "token_ids"
        )
        prompt = token_prompt(session, prompt_ids, source)
        request, clamped = clamp_to_context(request, len(prompt_ids), self.max_context)
        index = session.claim_index() if session is not None else -1
        result = await self._sample(prompt_ids, request, session, index)
        choices = []
        for i, c in enumerate(result.completions):
            choice = {"index": i, "text": self._text(c), "finish_reason": c.finish_reason}
            choice["logprobs"] = self._logprobs(c, request, completion_logprobs)
            choice["token_ids"] = list(c.token_ids)
            choice["prompt_token_ids"] = list(prompt_ids)
            choices.append(choice)
        self._record(session, index, "completions", prompt, result, request, None, clamped)
        return completion_response(self.model_name, prompt_ids, choices)

    async def generate(self, body: dict[str, Any], session_id: str | None) -> dict[str, Any]:
        """Serve one ``/inference/v1/generate`` request (vLLM's token-in/token-out endpoint, which verifiers'
        training client calls): ``token_ids`` in, and per choice the sampled ``token_ids`` with their log-probs
        as ``{"content": [{"token": "token_id:<id>", "logprob": ...}]}``; returns the response body."""
        for name in sorted(set(body) - GENERATE_FIELDS):
            raise unsupported(name, "the gateway does not know this field of a generate request")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise invalid("sampling_params", "expected an object")
        session = self.sessions.get(session_id) if session_id is not None else None
        self._check_model(body)
        request = sampling_request(sampling, "generate", self.defaults, self.tokenizer)
        prompt = token_prompt(session, self._prompt_ids(body.get("token_ids"), "token_ids"), "token_ids")
        request, clamped = clamp_to_context(request, len(prompt.prompt_ids), self.max_context)
        index = session.claim_index() if session is not None else -1
        result = await self._sample(prompt.prompt_ids, request, session, index)
        choices = []
        for i, c in enumerate(result.completions):
            ids = list(c.token_ids)
            choice = {"index": i, "text": self._text(c), "token_ids": ids, "finish_reason": c.finish_reason}
            choice["logprobs"] = generate_logprobs(ids, [float(x) for x in c.logprobs])
            choices.append(choice)
        self._record(session, index, "completions", prompt, result, request, None, clamped, api="generate")
        return generate_response(prompt.prompt_ids, choices)

    def _record(
        self,
        session: Session | None,
        index: int,
        endpoint: Endpoint,
        prompt: ChatPrompt,
        result: BatchResult,
        request: SamplingRequest,
        messages: list[dict[str, Any]] | None,
        clamped: bool,
        api: str | None = None,
    ) -> bool:
        """Keep the call's records and token sequences in ``session``; False when there is none to keep them
        (a sessionless call, or a session closed while the call ran)."""
        if session is None or not self.sessions.is_open(session.id):
            return False
        extra: dict[str, Any] = {
            "extended": prompt.source == "extended",
            "extends_call": prompt.extends_call,
            "prompt_source": prompt.source,
            "reused_tokens": prompt.reused_tokens,
            "max_tokens_clamped": clamped,
            "engine_call": result.engine_call,
            "api": api or endpoint,
        }
        session.records[index] = self._records(
            session, index, endpoint, prompt.prompt_ids, result, request, messages, extra
        )
        session.sequences += [(index, prompt.prompt_ids + list(c.token_ids)) for c in result.completions]
        return True

    def _prompt_ids(self, prompt: Any, param: str = "prompt") -> list[int]:
        """A completions prompt as token ids: a string (encoded, no special token added) or a list of token ids;
        a list holding one of these is that one."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = encode(self.tokenizer, prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in ids):
                raise invalid(param, f"token ids must be in [0, {vocab})")
        elif isinstance(prompt, list):
            raise GatewayError(
                "one prompt per request (a string or a list of token ids)",
                param=param,
                code="unsupported_parameter",
            )
        else:
            raise GatewayError(
                f"{param!r} is required: a string or a list of token ids", param=param, code="missing_prompt"
            )
        if not ids:
            raise invalid(param, "the prompt is empty")
        return ids

    def _text(self, c: Completion) -> str:
        ids = list(c.token_ids)
        if c.finish_reason == "stop" and ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _logprobs(self, c: Completion, request: SamplingRequest, layout: Any) -> dict[str, Any] | None:
        if not request.logprobs:
            return None
        return layout(token_strings(self.tokenizer, list(c.token_ids)), [float(x) for x in c.logprobs])

    @staticmethod
    def _records(
        session: Session,
        index: int,
        endpoint: Endpoint,
        prompt_ids: list[int],
        result: BatchResult,
        request: SamplingRequest,
        messages: list[dict[str, Any]] | None,
        extra: dict[str, Any],
    ) -> list[CallRecord]:
        records = []
        for i, c in enumerate(result.completions):
            versions = c.token_versions
            if versions is None:
                versions = np.full(len(c.token_ids), result.version, dtype=np.int32)
            records.append(
                CallRecord(
                    session_id=session.id,
                    index=index,
                    endpoint=endpoint,
                    prompt_ids=np.asarray(prompt_ids),
                    completion_ids=np.asarray(c.token_ids),
                    logprobs=c.logprobs,
                    entropies=c.entropies,
                    token_versions=versions,
                    finish_reason=c.finish_reason,
                    text=c.text,
                    choice=i,
                    temperature=request.params.temperature,
                    messages=messages,
                    extra=dict(extra),
                )
            )
        return records
