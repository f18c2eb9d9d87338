"""LoRA adapters on a transformers causal LM through peft: building one, its tensors for the runners, the base with
the adapter switched off (the KL reference), and the exported pair of folders.

The learner wraps its policy with :func:`add_lora`. peft injects the adapter layers into the model in place (each
target ``nn.Linear`` becomes a layer holding ``base_layer`` and ``lora_A``/``lora_B``), so the transformers model
itself stays the policy (its forward, gradient checkpointing, FSDP2 sharding per decoder layer and the log-prob
scoring all work on it unchanged); the returned ``PeftModel`` is kept beside it for peft's own operations (naming,
switching the adapter off, saving, merging).

An export writes two folders (see :func:`save_lora_export`): ``<path>`` itself, the adapter merged into the base
weights (a plain HF folder, loads with ``AutoModelForCausalLM``), and ``<path>/lora_adapter`` (:data:`ADAPTER_DIR`),
the adapter alone (loads with ``PeftModel.from_pretrained(base, <path>/lora_adapter)``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

#: Sub-folder of an exported policy holding the peft adapter (adapter_config.json, adapter_model.safetensors).
ADAPTER_DIR = "lora_adapter"
#: Prefix of peft's names for the wrapped model's parameters (``PeftModel.base_model.model``).
PEFT_PREFIX = "base_model.model."


def lora_config(rank: int, alpha: float, dropout: float, target_modules: str | Sequence[str]):
    """peft's ``LoraConfig`` for a causal LM (no bias terms: the adapter is A and B only)."""
    try:
        from peft import LoraConfig
    except ImportError as e:  # an optional dependency: name the extra that brings it
        raise ImportError("lora_rank > 0 needs peft: pip install 'r3-rllib[lora]'") from e

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    return LoraConfig(
        r=int(rank),
        lora_alpha=float(alpha),
        lora_dropout=float(dropout),
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_lora(
    model: torch.nn.Module,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    target_modules: str | Sequence[str] = "all-linear",
    *,
    seed: int = 0,
):
    """Inject a LoRA adapter into ``model`` (in place; only the adapter stays trainable) and return the
    ``PeftModel`` around it. The adapter's random init (A; B starts at 0) draws from a generator seeded with
    ``seed`` and leaves the global RNG untouched: every learner rank builds the same adapter."""
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, lora_config(rank, alpha, dropout, target_modules))
    return peft_model


def target_module_names(peft_model) -> tuple[str, ...]:
    """The module names peft resolved the targets to (``"all-linear"`` becomes e.g. ``("down_proj", ...)``)."""
    targets = peft_model.peft_config["default"].target_modules
    return (targets,) if isinstance(targets, str) else tuple(sorted(targets))


def adapter_state_dict(peft_model, model_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (``base_model.model.<module>.lora_A.weight``, no adapter
    name), taken from ``model_state``: a state dict of the wrapped transformers model (its own names, e.g. a full
    one gathered from FSDP2 shards), or only its adapter entries."""
    from peft import get_peft_model_state_dict

    prefixed = {PEFT_PREFIX + k: v for k, v in model_state.items() if "lora_" in k}
    return get_peft_model_state_dict(peft_model, state_dict=prefixed)


class AdapterOff:
    """The wrapped transformers model with the adapter switched off while it is called: the pretrained base, in the
    same memory as the policy (the KL reference of a LoRA policy, no second model). Everything but the call is
    the model's own (its config, its output embedding, its forward's signature), so the log-prob scoring treats it
    as the model."""

    def __init__(self, peft_model) -> None:
        self._peft = peft_model
        self._model = peft_model.base_model.model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        with self._peft.disable_adapter():
            return self._model(*args, **kwargs)


def merged_copy(peft_model) -> torch.nn.Module:
    """A plain transformers model with the adapter merged into its weights, ``W + (alpha / rank) * B @ A`` (a copy:
    ``peft_model`` keeps its adapter)."""
    return copy.deepcopy(peft_model).merge_and_unload()


def save_lora_export(
    peft_model, path: str | Path, base_name: str | None = None, *, keep_adapter: bool = True
) -> Path:
    """Write the adapter to ``path/ADAPTER_DIR`` and the merged model to ``path`` (see module docstring).
    ``base_name``: what the adapter's config names as its base (the policy's model path). ``keep_adapter=False``
    merges ``peft_model`` in place (no copy of the model; it is a plain merged model afterwards)."""
    path = Path(path)
    if base_name is not None:
        peft_model.peft_config["default"].base_model_name_or_path = str(base_name)
    peft_model.save_pretrained(str(path / ADAPTER_DIR))
    merged = merged_copy(peft_model) if keep_adapter else peft_model.merge_and_unload()
    merged.save_pretrained(str(path), safe_serialization=True)
    return path
