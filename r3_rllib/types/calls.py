"""What the rollout gateway records of one model call, token for token (stdlib + numpy only).

An agent program talks to the policy through an OpenAI-compatible endpoint (:mod:`r3_rllib.gateway`); every call
it makes is kept as a :class:`CallRecord` of its session: the prompt as the engine saw it (token ids), the tokens
the engine sampled with their log-probs, entropies and policy versions, and why it stopped. Trajectories are
assembled from these records alone (:mod:`r3_rllib.rollout.trajectories`), never from re-tokenized text, so the
tokens the learner trains on are the tokens the engine sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)


@dataclass
class CallRecord:
    """One completion of one call (a call with ``n`` > 1 gives ``n`` records, ``choice`` 0 .. n-1).

    ``prompt_ids`` are the tokens the engine was given (chat template applied for ``endpoint == "chat"``),
    ``completion_ids`` the tokens it sampled (the stop token included when it stopped on one), ``logprobs`` /
    ``entropies`` their behaviour log-probs and sampling entropies (as :class:`~r3_rllib.engines.base.Completion`
    defines them) and ``token_versions`` the policy version that sampled each token. ``messages`` is the chat
    request's message list (None for ``/v1/completions``), kept for logs and reflection prompts only.
    """

    session_id: str
    index: int  # the call's order within its session (0, 1, ...)
    endpoint: Literal["chat", "completions"]
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    entropies: np.ndarray
    token_versions: np.ndarray
    finish_reason: Literal["stop", "length"]
    text: str = ""
    choice: int = 0
    temperature: float = 1.0
    messages: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prompt_ids = np.asarray(self.prompt_ids, dtype=_INT32).reshape(-1)
        self.completion_ids = np.asarray(self.completion_ids, dtype=_INT32).reshape(-1)
        self.logprobs = np.asarray(self.logprobs, dtype=_FLOAT32).reshape(-1)
        self.entropies = np.asarray(self.entropies, dtype=_FLOAT32).reshape(-1)
        self.token_versions = np.asarray(self.token_versions, dtype=_INT32).reshape(-1)
        n = len(self.completion_ids)
        for name in ("logprobs", "entropies", "token_versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"call {self.session_id}/{self.index}: {name} has {len(getattr(self, name))} entries for "
                    f"{n} completion tokens (one per token)"
                )

    @property
    def policy_version(self) -> int:
        """The oldest policy version among the sampled tokens (0 for an empty completion)."""
        return int(self.token_versions.min()) if len(self.token_versions) else 0
