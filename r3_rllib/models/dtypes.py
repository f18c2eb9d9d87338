"""One place that turns the config's dtype names into torch dtypes (learner, reference model, HF engine, vLLM)."""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

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
    bfloat16 on a GPU that supports it, float32 elsewhere (on a CPU, fp32 gives the same numbers everywhere).
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


#: oneDNN's ISA names (``ONEDNN_MAX_CPU_ISA``) below bf16 in hardware: such a cap makes oneDNN emulate bf16 even on a
#: CPU that has avx512_bf16 (BENCHMARKS.md section 39 measured it so). ``ALL``, ``DEFAULT``, ``AVX512_CORE_BF16`` and
#: the newer names (AMX, AVX10) leave bf16 in hardware; a name not listed is taken as no cap (better no warning than a
#: false one).
_ONEDNN_SUB_BF16_ISAS = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


def onednn_isa_cap() -> str | None:
    """The cap ``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``) puts below bf16 in hardware, upper
    case; None when unset or not below it."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return cap if cap in _ONEDNN_SUB_BF16_ISAS else None


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (avx512_bf16 or AMX) and oneDNN may use it (no
    ``ONEDNN_MAX_CPU_ISA`` cap below it); True where torch cannot tell."""
    if onednn_isa_cap() is not None:
        return False
    probes = [
        getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if not all(callable(probe) for probe in probes):
        return True
    return any(probe() for probe in probes)


def warn_if_emulated_bf16(dtype: str | torch.dtype, device_type: str, who: str) -> bool:
    """Log a warning when `who` (the learner, an engine) is set to compute in bf16 on a CPU that emulates it: there
    an update ran 26x slower than in fp32 (BENCHMARKS.md section 39, oneDNN held to AVX2). Returns whether it
    warned."""
    named = (
        isinstance(dtype, torch.dtype) or dtype == "auto" or dtype in _DTYPES
    )  # vLLM takes other names too
    if device_type != "cpu" or not named or resolve_dtype(dtype, device_type) != torch.bfloat16:
        return False
    if cpu_has_native_bf16():
        return False
    cap = onednn_isa_cap()
    where = (
        f"with oneDNN held to {cap} (ONEDNN_MAX_CPU_ISA)"
        if cap is not None
        else "on a CPU without avx512_bf16 or AMX"
    )
    logger.warning(
        "%s computes in bfloat16 %s: bf16 matrix products are emulated there, many times slower than float32 "
        "(BENCHMARKS.md section 39). Set dtype='float32' (or 'auto')%s.",
        who,
        where,
        " or lift the cap" if cap is not None else " for this CPU",
    )
    return True
