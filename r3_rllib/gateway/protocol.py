"""The OpenAI wire format of the gateway: request parameters read into engine sampling parameters, errors, and
response bodies.

Parameters are read strictly: each one the engine honours is validated and mapped onto
:class:`~r3_rllib.engines.base.SamplingParams`; a parameter that would change sampling in a way the engine cannot
(penalties, ``logit_bias``, structured output, forced tool choice, multi-token stop strings, top log-probs) is a
400 error naming it, and so is a parameter the gateway does not know; only parameters that change nothing sampled
(``user``, ``metadata``, ``stream_options``, ...) are accepted and ignored (``chat_template_kwargs`` goes to the
template). Token ids come back as vLLM's OpenAI server returns them with ``return_token_ids``, whether asked or
not: ``prompt_token_ids`` on the response, ``token_ids`` on each choice (completions: ``prompt_token_ids`` on each
choice too). Log-probs are the sampled tokens' only (``logprobs: true`` for chat, ``logprobs: 0`` for completions,
``logprobs: 1`` for generate, which counts the sampled token in); asking for top alternatives is refused: the
engines do not keep them. vLLM's ``/inference/v1/generate`` answers ``{"request_id", "choices": [{"index",
"token_ids", "logprobs": {"content": [{"token": "token_id:<id>", "logprob"}]}, "finish_reason", "text"}],
"prompt_token_ids", "usage"}``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from r3_rllib.engines.base import SamplingParams

Endpoint = Literal["chat", "completions", "generate"]

#: Parameters read by the endpoints themselves (the prompt, the model, the streaming switch); ``generate`` (vLLM's
#: token-in/token-out ``/inference/v1/generate``) reads its sampling parameters from ``body["sampling_params"]``.
_STRUCTURAL = {
    "chat": {"model", "messages", "tools", "tool_choice", "stream"},
    "completions": {"model", "prompt", "stream"},
    "generate": set(),
}
#: The top-level fields of a ``generate`` request.
GENERATE_FIELDS = {
    "model",
    "token_ids",
    "sampling_params",
    "request_id",
    "cache_salt",
    "priority",
    "return_token_ids",
}
#: Parameters that change nothing the engine samples: accepted and ignored.
_HARMLESS = {
    "user",
    "metadata",
    "stream_options",
    "parallel_tool_calls",
    "store",
    "service_tier",
    "return_token_ids",
    "skip_special_tokens",
    "chat_template_kwargs",
    "detokenize",
    "include_stop_str_in_output",
    "spaces_between_special_tokens",
    "routed_experts_prompt_start",
}
_SAMPLING = {
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "stop_token_ids",
    "logprobs",
    "top_logprobs",
}
#: Parameters accepted only at the value that leaves sampling unchanged.
_NEUTRAL = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "best_of": (1,),
    "ignore_eos": (False,),
}
#: The most completions one request may ask for.
MAX_N = 64


class GatewayError(Exception):
    """A request the gateway answers with an OpenAI-style error body and an HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def unsupported(param: str, why: str) -> GatewayError:
    """The 400 error for a parameter (or value) the engine cannot honour."""
    return GatewayError(f"unsupported parameter {param!r}: {why}", param=param, code="unsupported_parameter")


def invalid(param: str, why: str) -> GatewayError:
    """The 400 error for a parameter with an invalid value."""
    return GatewayError(f"invalid value for {param!r}: {why}", param=param, code="invalid_value")


@dataclass(frozen=True)
class SamplingRequest:
    """What a request asks of the engine: its sampling parameters, how many completions, whether to return
    log-probs, and whether to stream."""

    params: SamplingParams
    n: int = 1
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    seed_given: bool = False


def _number(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not isinstance(value, int))
    ):
        raise invalid(name, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def check_parameters(body: dict[str, Any], endpoint: Endpoint) -> None:
    """400 for an unknown parameter or a parameter away from its neutral value (named in the message)."""
    known = _STRUCTURAL[endpoint] | _HARMLESS | _SAMPLING | set(_NEUTRAL) | {"response_format"}
    for name in sorted(set(body) - known):
        raise unsupported(name, "the gateway does not know this parameter")
    for name, neutral in _NEUTRAL.items():
        if body.get(name) is not None and not any(
            body[name] == v and type(body[name]) is type(v) for v in neutral
        ):
            raise unsupported(name, f"only {neutral[0]!r} is supported (the engine samples without it)")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise unsupported("response_format", "structured output is not supported; only {'type': 'text'}")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise unsupported(
            "tool_choice", "only 'auto' and 'none' are supported (the engine cannot force a call)"
        )


def stop_token_ids(stop: Any, tokenizer: Any) -> tuple[int, ...]:
    """The token ids of ``stop`` strings: each must be exactly one token of the vocabulary (the engine stops on
    tokens, not on strings), else a 400 error naming the string."""
    strings = [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise invalid("stop", "expected a string or a list of strings")
    ids = []
    for s in strings:
        tokens = tokenizer.encode(s, add_special_tokens=False) if s else []
        if len(tokens) != 1 or tokenizer.decode(tokens, skip_special_tokens=False) != s:
            raise unsupported("stop", f"stop string {s!r} is not a single token of the vocabulary")
        ids.append(int(tokens[0]))
    return tuple(ids)


def _logprobs(body: dict[str, Any], endpoint: Endpoint) -> bool:
    """Whether the sampled tokens' log-probs are asked for; top log-probs are refused (the engine keeps none)."""
    if endpoint != "chat":
        # vLLM's generate endpoint counts the sampled token in: logprobs=1 asks for it alone.
        most = 1 if endpoint == "generate" else 0
        k = _number(body, "logprobs", int, None)
        if k is not None and k > most:
            raise unsupported(
                "logprobs", f"top log-probs are not recorded; logprobs={most} returns the sampled tokens'"
            )
        return k is not None
    top = _number(body, "top_logprobs", int, 0)
    if top > 0:
        raise unsupported(
            "top_logprobs", "top log-probs are not recorded; only the sampled tokens' are returned"
        )
    value = body.get("logprobs")
    if value is not None and not isinstance(value, bool):
        raise invalid("logprobs", f"expected a boolean, got {value!r}")
    return bool(value)


def sampling_request(
    body: dict[str, Any], endpoint: Endpoint, defaults: SamplingParams, tokenizer: Any
) -> SamplingRequest:
    """The request's sampling parameters, each missing one taken from ``defaults``; 400 errors as the module
    docstring says."""
    check_parameters(body, endpoint)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_new = _number({max_name: max_tokens}, max_name, int, defaults.max_new_tokens)
    if max_new < 1:
        raise invalid(max_name, f"must be >= 1, got {max_new}")
    temperature = _number(body, "temperature", float, defaults.temperature)
    top_p = _number(body, "top_p", float, defaults.top_p)
    top_k = _number(body, "top_k", int, defaults.top_k)
    n = _number(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise invalid("n", f"must be in [1, {MAX_N}], got {n}")
    seed = _number(body, "seed", int, None)
    stops = tuple(defaults.stop_token_ids)
    if body.get("stop") is not None:
        stops += stop_token_ids(body["stop"], tokenizer)
    if body.get("stop_token_ids") is not None:
        ids = body["stop_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise invalid("stop_token_ids", "expected a list of integers")
        stops += tuple(ids)
    try:
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            top_k=0 if top_k == 0 else top_k,
            stop_token_ids=tuple(sorted(set(stops))),
            seed=defaults.seed if seed is None else seed,
        )
    except ValueError as e:
        raise GatewayError(str(e), code="invalid_value") from None
    options = body.get("stream_options") or {}
    return SamplingRequest(
        params=params,
        n=n,
        logprobs=_logprobs(body, endpoint),
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        seed_given=seed is not None,
    )


def clamp_to_context(
    request: SamplingRequest, prompt_len: int, max_context: int | None
) -> tuple[SamplingRequest, bool]:
    """``request`` with ``max_new_tokens`` cut so that prompt + completion fit ``max_context`` (and whether it was
    cut); a prompt that leaves no room for one token is a 400 error with code ``context_length_exceeded``."""
    if max_context is None:
        return request, False
    room = max_context - prompt_len
    if room < 1:
        raise GatewayError(
            f"this model's maximum context length is {max_context} tokens; the prompt has {prompt_len} tokens "
            "and leaves no room for a completion",
            param="messages",
            code="context_length_exceeded",
        )
    if request.params.max_new_tokens <= room:
        return request, False
    params = dataclasses.replace(request.params, max_new_tokens=room)
    return dataclasses.replace(request, params=params), True


# -- responses --------------------------------------------------------------------------------------------------------
def _usage(prompt_len: int, completion_lens: list[int]) -> dict[str, int]:
    total = sum(completion_lens)
    return {"prompt_tokens": prompt_len, "completion_tokens": total, "total_tokens": prompt_len + total}


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's own text (special tokens as written)."""
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def chat_logprobs(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: one entry per sampled token, with no top alternatives."""
    return {
        "content": [
            {"token": s, "logprob": float(lp), "bytes": list(s.encode("utf-8")), "top_logprobs": []}
            for s, lp in zip(tokens, logprobs, strict=True)
        ]
    }


def completion_logprobs(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    """A completion choice's ``logprobs`` in the legacy layout (sampled tokens only)."""
    offsets, at = [], 0
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [float(x) for x in logprobs],
        "top_logprobs": None,
        "text_offset": offsets,
    }


def chat_response(model: str, prompt_ids: list[int], choices: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``chat.completion`` body; each choice carries its ``token_ids`` (vLLM's field) already."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(len(prompt_ids), [len(c["token_ids"]) for c in choices]),
        "prompt_token_ids": list(prompt_ids),
    }


def generate_logprobs(ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """A generate choice's ``logprobs`` as vLLM writes them with tokens as ids: ``"token_id:<id>"`` per token."""
    return {
        "content": [
            {"token": f"token_id:{t}", "logprob": float(lp)} for t, lp in zip(ids, logprobs, strict=True)
        ]
    }


def generate_response(prompt_ids: list[int], choices: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``/inference/v1/generate`` body: ``request_id``, the choices (``token_ids``, ``logprobs``,
    ``finish_reason``), ``prompt_token_ids`` and ``usage``."""
    return {
        "request_id": f"gen-{uuid.uuid4().hex}",
        "choices": choices,
        "prompt_token_ids": list(prompt_ids),
        "usage": _usage(len(prompt_ids), [len(c["token_ids"]) for c in choices]),
    }


def completion_response(model: str, prompt_ids: list[int], choices: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``text_completion`` body; each choice carries ``token_ids`` and ``prompt_token_ids`` (vLLM's fields)."""
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(len(prompt_ids), [len(c["token_ids"]) for c in choices]),
        "prompt_token_ids": list(prompt_ids),
    }


def stream_chunks(response: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The finished response as server-sent chunks: per choice one chunk with its whole message (or text) and
    token ids, then one with its finish reason; then the usage chunk when asked for."""
    chat = response["object"] == "chat.completion"
    base = {"id": response["id"], "created": response["created"], "model": response["model"]}
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for choice in response["choices"]:
        first = {k: v for k, v in choice.items() if k not in ("message", "finish_reason")}
        if chat:
            first["delta"] = choice["message"]
        first["finish_reason"] = None
        chunks.append({**base, "choices": [first], "prompt_token_ids": response["prompt_token_ids"]})
        last = {"index": choice["index"], "finish_reason": choice["finish_reason"]}
        last["delta" if chat else "text"] = {} if chat else ""
        chunks.append({**base, "choices": [last]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks
