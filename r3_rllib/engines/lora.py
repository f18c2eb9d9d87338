"""LoRA adapters on the engine side: the adapter's tensors as peft names them, merged into base weights or written
out as a peft adapter folder for vLLM's LoRA requests.

An adapter arrives as ``(name, tensor)`` pairs named as ``peft.get_peft_model_state_dict`` returns them, e.g.
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (``A``: ``[rank, in]``) and ``...lora_B.weight``
(``B``: ``[out, rank]``). The adapted layer computes ``x W^T + scale * (x A^T) B^T`` with ``scale = alpha / rank``,
which is the plain layer with weight ``W + scale * B @ A``. Nothing here needs peft.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

#: peft's prefix of a wrapped causal LM's parameter names.
PEFT_PREFIX = "base_model.model."
_LORA_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")

#: ``max_lora_rank`` values vLLM accepts (vllm.config.lora.MaxLoRARanks, vLLM 0.32).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_scale(rank: int, alpha: float) -> float:
    """The factor of ``B @ A``: ``alpha / rank``; ``ValueError`` for a rank below 1."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    return float(alpha) / rank


def adapter_pairs(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module path as in the base model's state dict: (A, B)}`` from peft-named adapter tensors.

    ``ValueError`` for a tensor that is not a plain LoRA ``A`` or ``B`` (embedding adapters, DoRA magnitudes, saved
    modules: the engines do not apply them) and for a module missing one of its halves."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        match = _LORA_NAME.match(name)
        if match is None:
            raise ValueError(f"adapter tensor {name!r} is not a LoRA A or B weight; only those are applied")
        module = match["module"].removeprefix(PEFT_PREFIX)
        halves.setdefault(module, {})[match["half"]] = tensor
    missing = sorted(m for m, h in halves.items() if len(h) != 2)
    if missing:
        raise ValueError(f"adapter modules without both lora_A and lora_B: {missing}")
    return {module: (h["A"], h["B"]) for module, h in halves.items()}


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``base + scale * b @ a`` computed in float32 (a bf16 sum of a small update would round it away), returned
    in ``base``'s dtype; ``ValueError`` when the shapes do not fit."""
    if a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(base.shape):
        raise ValueError(
            f"LoRA shapes A {tuple(a.shape)}, B {tuple(b.shape)} do not fit a weight of shape {tuple(base.shape)}"
        )
    delta = b.detach().to(device=base.device, dtype=torch.float32) @ a.detach().to(base.device, torch.float32)
    return (base.float() + scale * delta).to(base.dtype)


def merged_state(
    base: Mapping[str, torch.Tensor], pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scale: float
) -> dict[str, torch.Tensor]:
    """Every tensor of ``base`` (state-dict names), with ``W + scale * B @ A`` for the ``{module}.weight`` entries
    the adapter covers and the base value for the rest (a module the previous adapter covered and this one does
    not goes back to its base). ``KeyError`` for an adapted module ``base`` does not hold."""
    absent = sorted(f"{m}.weight" for m in pairs if f"{m}.weight" not in base)
    if absent:
        raise KeyError(f"no base weight kept for the adapted modules {absent}")
    out = dict(base)
    for module, (a, b) in pairs.items():
        out[f"{module}.weight"] = merged_weight(base[f"{module}.weight"], a, b, scale)
    return out


def vllm_max_lora_rank(rank: int) -> int | None:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``; None above vLLM's largest (512)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def write_peft_adapter(
    folder: str | Path,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    rank: int,
    alpha: float,
    target_modules: Sequence[str],
    base_model: str = "",
) -> Path:
    """Write the adapter as a peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, names
    as peft saves them), the layout vLLM's ``LoRARequest`` loads. Returns the folder."""
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    # safetensors wants contiguous tensors that own their memory (object-store views are read-only).
    tensors = {name: t.detach().to("cpu").clone().contiguous() for name, t in named_tensors}
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(rank),
        "lora_alpha": float(alpha),
        "lora_dropout": 0.0,
        "target_modules": sorted(target_modules),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "fan_in_fan_out": False,
    }
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return path
