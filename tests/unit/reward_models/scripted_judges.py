"""A generation engine whose replies a test scripts (a function of the decoded prompt), registered as an engine
plugin so the judges build it exactly as they build the HF or vLLM engine."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from r3_rllib.engines import registry
from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams

ENGINE = "scripted_judge"


class ScriptedEngine(GenerationEngine):
    """Replies ``reply(prompt text)``; records every call's prompts and sampling settings."""

    reply: Callable[[str], str] = staticmethod(lambda prompt: "")
    calls: list[tuple[list[str], SamplingParams]] = []
    built_with: dict[str, Any] = {}

    def __init__(self, model_path: Any, tokenizer: Any = None, **kwargs: Any) -> None:
        self.tokenizer = tokenizer
        type(self).built_with = {"model_path": model_path, **kwargs}

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        prompts = [self.tokenizer.decode(list(p)) for p in prompt_ids]
        type(self).calls.append((prompts, params))
        return [
            [Completion(list(p), [0], np.zeros(1), np.zeros(1), "stop", text=type(self).reply(text))]
            for p, text in zip(prompt_ids, prompts, strict=True)
        ]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        raise NotImplementedError


def use_scripted_engine(monkeypatch: pytest.MonkeyPatch, reply: Callable[[str], str]) -> type[ScriptedEngine]:
    """Register the scripted engine (for this test only) replying ``reply``; returns its class."""
    spec = registry.EngineSpec(
        name=ENGINE,
        engine_class="scripted_judges:ScriptedEngine",
        capabilities=registry.EngineCapabilities(
            exact_entropies=False, partial_rollouts=False, rollout_head=False
        ),
    )
    monkeypatch.setitem(registry._REGISTERED, ENGINE, spec)
    monkeypatch.setattr(ScriptedEngine, "reply", staticmethod(reply))
    monkeypatch.setattr(ScriptedEngine, "calls", [])
    monkeypatch.setattr(ScriptedEngine, "built_with", {})
    return ScriptedEngine
