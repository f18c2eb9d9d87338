"""How long a sequence an engine must serve, and vLLM's ``max_model_len`` derived from it.

vLLM sizes its KV cache for ``max_model_len`` and, when that is not given, takes the model's own limit
(``max_position_embeddings``: 8,192 for SmolLM2, 131,072 for DeepSeek-R1-Distill-Qwen). It refuses to start when
one sequence of that length does not fit the KV cache budget (on CPU, 256 MiB by default here), although a run only
ever serves prompts of its env plus ``max_new_tokens``. verl sets ``max_model_len`` to prompt + response length for
this reason; so do we, when the user did not set it (``engine_kwargs: {max_model_len: ...}`` always wins).

A run's budget is :func:`run_serving_budget`; the rule (:func:`derive_max_model_len`)::

    max_model_len = min(model positions, prompt budget + extra prompt tokens + max_new_tokens)

- prompt budget: the env's own limit on rendered prompt tokens when it has one (``env_config.max_prompt_tokens`` of
  MathEnv), else :data:`DEFAULT_PROMPT_TOKENS`;
- extra prompt tokens: what reflection adds to a query's prompt when reflection is on: the template and guidance
  (counted with the policy's tokenizer) plus the wrong answer, at most ``max_new_tokens`` tokens (it was a response)
  and at most ``reflection_max_answer_chars`` + 3 (the ``...`` of a cut answer), counting a character as at most one
  token (true of the character tokenizer and, for ordinary text, of BPE vocabularies; text of multi-byte characters
  can need more: set ``max_model_len`` then);
- model positions: ``max_position_embeddings`` (or ``n_positions`` / ``max_sequence_length``) of the model's config
  when it has one: a longer ``max_model_len`` would be refused by vLLM anyway.

A prompt longer than its budget is then refused by vLLM with its own message naming the lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Prompt tokens assumed when the env states no limit of its own (arithmetic-style envs have prompts of a few tokens;
#: chat-templated math problems rarely pass 1k).
DEFAULT_PROMPT_TOKENS = 2048

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class ServingBudget:
    """The longest sequence a run asks its engine for, in tokens: prompt, what reflection adds to it, response."""

    max_new_tokens: int
    max_prompt_tokens: int | None = None
    extra_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"ServingBudget.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(
                f"ServingBudget.max_prompt_tokens must be >= 1 or None, got {self.max_prompt_tokens}"
            )
        if self.extra_prompt_tokens < 0:
            raise ValueError(
                f"ServingBudget.extra_prompt_tokens must be >= 0, got {self.extra_prompt_tokens}"
            )

    @property
    def max_sequence_tokens(self) -> int:
        """Prompt budget (the env's, else DEFAULT_PROMPT_TOKENS) + reflection's extra + max_new_tokens."""
        prompt = self.max_prompt_tokens if self.max_prompt_tokens is not None else DEFAULT_PROMPT_TOKENS
        return prompt + self.extra_prompt_tokens + self.max_new_tokens


def run_serving_budget(
    max_new_tokens: int,
    *,
    max_prompt_tokens: int | None = None,
    reflection_scaffold: str | None = None,
    reflection_max_answer_chars: int | None = None,
    tokenizer: Any = None,
) -> ServingBudget:
    """The budget of a run (module docstring): its env's prompt limit (None: the env states none), and, when
    reflection is on (``reflection_scaffold``: its template rendered with an empty query and answer, guidance
    included), the scaffold's tokens counted with ``tokenizer`` (without one, a character per token) plus the
    wrong answer, at most ``max_new_tokens`` and at most ``reflection_max_answer_chars`` + 3 (the "..." of a cut
    answer)."""
    extra = 0
    if reflection_scaffold is not None:
        scaffold_tokens = (
            len(tokenizer(reflection_scaffold, add_special_tokens=False)["input_ids"])
            if tokenizer
            else len(reflection_scaffold)
        )
        answer = max_new_tokens
        if reflection_max_answer_chars is not None:
            answer = min(answer, reflection_max_answer_chars + 3)
        extra = scaffold_tokens + answer
    return ServingBudget(
        max_new_tokens=int(max_new_tokens),
        max_prompt_tokens=int(max_prompt_tokens) if max_prompt_tokens is not None else None,
        extra_prompt_tokens=extra,
    )


def model_max_positions(hf_config: Any) -> int | None:
    """The longest sequence the model's config allows, or None when it states none."""
    for key in _POSITION_KEYS:
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def derive_max_model_len(budget: ServingBudget, max_positions: int | None) -> int:
    """``min(max_positions, budget.max_sequence_tokens)`` (see the module docstring); ``max_positions`` None: no
    cap."""
    need = budget.max_sequence_tokens
    if max_positions is None:
        return need
    if max_positions < 1:
        raise ValueError(f"max_positions must be >= 1 or None, got {max_positions}")
    return min(need, max_positions)
