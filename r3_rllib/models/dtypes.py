"""One place that turns the config's dtype names into torch dtypes (learner, reference model, HF engine, vLLM)."""

from __future__ import annotations

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, device_type: str | None = None) -> torch.dtype:
    """A torch dtype from a name (``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``) or ``auto``:
    bfloat16 on a GPU that supports it, float32 elsewhere (bf16 is slower than fp32 on most CPUs).
    ``device_type`` (``cpu``/``cuda``) decides ``auto``; None: a GPU when one is visible."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        on_gpu = torch.cuda.is_available() if device_type is None else device_type == "cuda"
        return torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def dtype_name(dtype: str | torch.dtype, device_type: str | None = None) -> str:
    """:func:`resolve_dtype` as the name engines take (``"bfloat16"``, ``"float32"``, ``"float16"``)."""
    return str(resolve_dtype(dtype, device_type)).removeprefix("torch.")
