"""Generation engines: one interface (:class:`GenerationEngine`) over Hugging Face transformers, vLLM and any
engine registered in :mod:`r3_rllib.engines.registry`.

The registry and the options import neither torch nor an engine (config checks read capabilities in the driver);
:class:`GenerationEngine`, :class:`Completion` and :class:`SamplingParams` are imported on first use.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3_rllib.engines.budget import ServingBudget, derive_max_model_len
from r3_rllib.engines.options import EngineOptions
from r3_rllib.engines.registry import (
    DEFAULT_ENGINE,
    ENGINE_KINDS,
    EngineCapabilities,
    EngineSpec,
    default_engine,
    engine_capabilities,
    engine_class,
    register_engine,
    registered_engines,
)

if TYPE_CHECKING:
    from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams

_LAZY = {name: "r3_rllib.engines.base" for name in ("Completion", "GenerationEngine", "SamplingParams")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'r3_rllib.engines' has no attribute {name!r}")


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
    """Build the engine registered as ``kind`` (``"hf"``: :class:`~r3_rllib.engines.hf_engine.HFEngine`, any
    machine; ``"vllm"``: :class:`~r3_rllib.engines.vllm_engine.VLLMEngine`, needs the ``vllm`` module; or one of
    :func:`~r3_rllib.engines.registry.registered_engines`) through its class's
    :meth:`~r3_rllib.engines.base.GenerationEngine.build`. ``kwargs`` go to the engine.

    ``budget`` (the longest prompt and response the caller will ask for) lets vLLM size its KV cache for what is
    served instead of the model's position limit, unless ``kwargs`` set ``max_model_len`` (see
    :mod:`r3_rllib.engines.budget`). The HF engine sizes its cache per call and ignores it.

    ``rollout_head`` (R^2PO): build the engine's rollout-head variant (e.g.
    :class:`~r3_rllib.engines.rollout_head_sampling.RolloutHeadHFEngine` or
    :class:`~r3_rllib.engines.vllm_rollout_head.RolloutHeadVLLMEngine`); ``head`` (a head or a folder holding one;
    None: the one saved with the model, else a fresh one seeded with ``head_seed``) and ``rollout_logits`` (sample
    with the head on) go to it. Without ``rollout_head`` they must keep their defaults.

    ``lora_rank`` > 0 builds an engine ready for LoRA adapters (:meth:`GenerationEngine.update_adapter`): vLLM
    applies them as its ``lora_mode`` keyword says (see :mod:`r3_rllib.engines.vllm_engine`); the HF engine merges
    adapters into its weights and needs no option.
    """
    head_kwargs: dict[str, Any] = {}
    if rollout_head:
        head_kwargs = {"head": head, "rollout_logits": rollout_logits, "head_seed": head_seed}
    elif head is not None or not rollout_logits:
        raise ValueError("head= and rollout_logits= need rollout_head=True")
    cls = engine_class(kind, rollout_head=rollout_head)
    return cls.build(model_path, tokenizer, budget=budget, lora_rank=lora_rank, **head_kwargs, **kwargs)


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
    "DEFAULT_ENGINE",
    "ENGINE_KINDS",
    "EngineCapabilities",
    "EngineOptions",
    "EngineSpec",
    "build_engine",
    "Completion",
    "GenerationEngine",
    "SamplingParams",
    "ServingBudget",
    "default_engine",
    "derive_max_model_len",
    "engine_capabilities",
    "engine_class",
    "make_engine",
    "register_engine",
    "registered_engines",
]
