"""Prompts that fit the model's context: prompt tokens + ``max_new_tokens`` <= the model's
``max_position_embeddings``.

A longer sequence runs past the positions the model was trained on (vLLM refuses it with a message naming no query;
an HF engine generates and trains on it silently). So every text env takes two options, filled in by the EnvRunner
from the model's config and ``R3Config.max_new_tokens`` (``runner_setup.model_context_config``), and checks its
prompts once, when it is built, with :func:`check_prompts_fit`: the first prompt too long raises a ``DataError``
naming its query, its length and the limit. MathEnv (and PythonToolEnv) can skip such rows instead
(``on_bad_row='skip'``). Multi-step envs check the first prompt of each query (later prompts add a bounded memory
window). Reflection prompts are generated, not user input: :func:`drop_long_prompts` drops the ones too long with
a warning, for the runner to count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from r3_rllib.envs.data import DataError

logger = logging.getLogger(__name__)

#: Prompts tokenized per call while checking: a bounded batch for a large pool.
_BATCH = 256


class PromptLimits:
    """The bounds on a prompt's tokens: ``max_prompt_tokens`` (the user's) and the model's context less the
    response budget (a longer sequence would run past the model's position embeddings while it trains)."""

    def __init__(
        self, max_prompt_tokens: int | None, model_max_positions: int | None, max_new_tokens: int
    ) -> None:
        if model_max_positions is not None and model_max_positions <= max_new_tokens:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                f"max_position_embeddings={model_max_positions}"
            )
        self.max_prompt_tokens = max_prompt_tokens
        self.model_max_positions = model_max_positions
        self.max_new_tokens = max_new_tokens

    @property
    def active(self) -> bool:
        return self.max_prompt_tokens is not None or self.model_max_positions is not None

    def violation(self, n: int) -> str | None:
        """What a prompt of ``n`` tokens breaks (the end of the message naming it), or None."""
        if self.max_prompt_tokens is not None and n > self.max_prompt_tokens:
            return f" > max_prompt_tokens={self.max_prompt_tokens}"
        if self.model_max_positions is not None and n + self.max_new_tokens > self.model_max_positions:
            return (
                f" + max_new_tokens={self.max_new_tokens} > the model's max_position_embeddings="
                f"{self.model_max_positions}"
            )
        return None


def prompt_lengths(tokenizer: Any, prompts: Sequence[str]) -> list[int]:
    """Tokens of each rendered prompt, as the runner counts them: special tokens written as text in a rendered
    template count as one token each (``add_special_tokens=False`` keeps a BOS from being added twice)."""
    lengths: list[int] = []
    for start in range(0, len(prompts), _BATCH):
        batch = list(prompts[start : start + _BATCH])
        lengths += [len(ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]]
    return lengths


def check_prompts_fit(
    prompts: Iterable[tuple[str, str]],
    tokenizer: Any,
    model_max_positions: int | None,
    max_new_tokens: int,
    *,
    env_name: str = "env",
) -> None:
    """Raise a ``DataError`` naming the first ``(query_id, prompt)`` whose tokens + ``max_new_tokens`` exceed
    ``model_max_positions``, its length and the limit. No limit or no tokenizer (nothing counts tokens): no check,
    and ``prompts`` is not iterated (a multi-step env's prompts cost a game start each)."""
    if model_max_positions is None or tokenizer is None:
        return
    limits = PromptLimits(None, int(model_max_positions), int(max_new_tokens))
    pairs = list(prompts)
    lengths = prompt_lengths(tokenizer, [text for _, text in pairs])
    for (query_id, _), n in zip(pairs, lengths, strict=True):
        reason = limits.violation(n)
        if reason is not None:
            raise DataError(
                f"{env_name}: query {query_id!r}: prompt has {n} tokens{reason}; lower max_new_tokens or "
                "shorten the env's prompts (fewer few-shot examples, a shorter system prompt or memory window)"
            )


def drop_long_prompts(
    prompts: Sequence[tuple[str, str, str]],
    tokenizer: Any,
    model_max_positions: int | None = None,
    max_new_tokens: int = 0,
) -> tuple[list[tuple[str, str, str]], int]:
    """The ``(query_id, user_content, prompt)`` reflection prompts that fit the model's context, and how many were
    dropped (a warning names the first ones). A reflection prompt adds a past answer and guidance to a query's
    prompt: generated text, so one too long costs that prompt, not the run (the answer is already cut at
    ``reflection_max_answer_chars``). The rollout calls this where it builds them
    (``RolloutContext.reflection_prompts``), with ``**runner_setup.model_context(config)``, and counts the dropped
    ones (``reflection_dropped_too_long``)."""
    if model_max_positions is None or tokenizer is None or not prompts:
        return list(prompts), 0
    limits = PromptLimits(None, int(model_max_positions), int(max_new_tokens))
    lengths = prompt_lengths(tokenizer, [text for _, _, text in prompts])
    kept, dropped = [], []
    for prompt, n in zip(prompts, lengths, strict=True):
        reason = limits.violation(n)
        if reason is None:
            kept.append(prompt)
        else:
            dropped.append(f"query {prompt[0]!r}: reflection prompt has {n} tokens{reason}")
    if dropped:
        logger.warning(
            "dropped %d reflection prompt(s) too long for the model's context; first: %s",
            len(dropped),
            "; ".join(dropped[:3]),
        )
    return kept, len(dropped)
