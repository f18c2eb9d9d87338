"""The rollout gateway: an OpenAI-compatible, token-faithful HTTP endpoint in front of a generation engine.

An agent program (the OpenAI SDK, a verifiers env, any harness) calls ``/v1/chat/completions`` or
``/v1/completions`` at a session's base URL; the gateway renders chat prompts with the tokenizer's chat template,
batches the calls of all sessions into the engine from one thread, and records every call of a session as
:class:`~r3_rllib.types.calls.CallRecord`\\ s, token for token, so trajectories are assembled without re-tokenizing.

Modules: :mod:`~r3_rllib.gateway.server` (the :class:`Gateway` and its HTTP routes), :mod:`~r3_rllib.gateway.service`
(one request, end to end), :mod:`~r3_rllib.gateway.protocol` (parameters, errors, response bodies),
:mod:`~r3_rllib.gateway.chat` (chat template, tool calls), :mod:`~r3_rllib.gateway.sessions` (records and prompt
continuation), :mod:`~r3_rllib.gateway.batcher` (the engine thread, batching and seeds).
"""

from __future__ import annotations

from r3_rllib.gateway.protocol import GatewayError
from r3_rllib.gateway.server import Gateway

__all__ = ["Gateway", "GatewayError"]
