"""`EngineOptions`: what builds a runner's generation engine, as one typed, versioned object (not a dict)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from r3_rllib.engines.registry import ENGINE_KINDS, EngineCapabilities, engine_capabilities

__all__ = ["ENGINE_KINDS", "ENGINE_OPTIONS_FORMAT", "EngineOptions", "engine_kwargs_error"]

#: Format of :class:`EngineOptions`; a reader refuses another one.
ENGINE_OPTIONS_FORMAT = 1

#: What the runner sets itself (engine options of their own): ``engine_kwargs`` may not carry them.
RESERVED_ENGINE_KWARGS = frozenset({"dtype", "rollout_head", "head_seed", "budget", "lora_rank"})

#: The options of the built-in HF engine's constructor that ``engine_kwargs`` may set (the runner passes the policy
#: folder, tokenizer and dtype itself). Written out so validating a config imports no transformers;
#: tests/unit/engines/test_engine_registry.py checks it against ``HFEngine.__init__``.
HF_ENGINE_OPTIONS = ("device", "eos_token_ids", "kv_cache", "max_batch_size")


def engine_kwargs_error(kind: str, kwargs: Mapping[str, Any]) -> str | None:
    """What is wrong with ``engine_kwargs`` for the engine ``kind`` (None: nothing found), checked where the config
    is validated rather than when every runner builds its engine: a name the runner sets itself, and for the
    built-in HF engine a name its constructor does not take (a typo, or a vLLM option with ``engine='hf'``). vLLM's
    options are vLLM's own, many and version-dependent: vLLM names an unknown one when the engine starts."""
    reserved = sorted(RESERVED_ENGINE_KWARGS & set(kwargs))
    if reserved:
        return f"engine_kwargs may not set {reserved}: they are engine options of their own (dtype: the dtype setting)"
    unknown = sorted(set(kwargs) - set(HF_ENGINE_OPTIONS)) if kind == "hf" else []
    if unknown:
        return f"engine_kwargs {unknown} are not options of the 'hf' engine, which takes {list(HF_ENGINE_OPTIONS)}"
    return None


@dataclass(frozen=True)
class EngineOptions:
    """The engine a runner builds: backend, policy (a folder, hub name or named model: each runner resolves it on its
    own node), dtype, R^2PO's rollout head, LoRA (``lora_rank`` > 0: the runners receive adapters, see
    :meth:`~r3_rllib.engines.base.GenerationEngine.update_adapter`), and the backend's own keyword arguments
    (``engine_kwargs``: vLLM's ``gpu_memory_utilization``, ``tensor_parallel_size``, ``lora_mode``, ... or the HF
    engine's ``max_batch_size``, ``kv_cache``), kept as a read-only mapping because they are the backend's, not
    ours."""

    kind: str
    model_path: str | None
    dtype: str = "auto"  # resolved on the runner's node ('auto': bf16 on GPUs that support it, else fp32)
    rollout_head: bool = False
    head_seed: int = 0
    backend_kwargs: Mapping[str, Any] = field(default_factory=dict)
    format: int = ENGINE_OPTIONS_FORMAT
    lora_rank: int = 0

    def __post_init__(self) -> None:
        if self.format != ENGINE_OPTIONS_FORMAT:
            raise ValueError(
                f"EngineOptions format {self.format!r} is not {ENGINE_OPTIONS_FORMAT}, the one read here"
            )
        engine_capabilities(self.kind)  # ValueError naming the registered engines when unknown
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0, got {self.lora_rank}")
        reserved = RESERVED_ENGINE_KWARGS & set(self.backend_kwargs)
        if reserved:
            raise ValueError(
                f"engine_kwargs may not set {sorted(reserved)}: they are engine options of their own"
            )
        object.__setattr__(self, "backend_kwargs", MappingProxyType(dict(self.backend_kwargs)))

    @property
    def capabilities(self) -> EngineCapabilities:
        """What the engine of ``kind`` can do (imports no engine)."""
        return engine_capabilities(self.kind)

    def __reduce__(self):
        # MappingProxyType does not pickle; rebuild from a plain dict (options cross to runner processes).
        fields = (self.kind, self.model_path, self.dtype, self.rollout_head, self.head_seed)
        return (EngineOptions, (*fields, dict(self.backend_kwargs), self.format, self.lora_rank))
