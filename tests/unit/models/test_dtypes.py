"""The config's dtype names, and the warning for bf16 on a CPU that emulates it (BENCHMARKS.md section 39: an
update ran 26x slower in bf16 than in fp32 with oneDNN held to AVX2)."""

from __future__ import annotations

import logging

import pytest
import torch

from r3_rllib.models import dtypes


def test_names_and_auto():
    assert dtypes.resolve_dtype("bf16") is torch.bfloat16 and dtypes.resolve_dtype("fp32") is torch.float32
    assert (
        dtypes.resolve_dtype("auto", "cpu") is torch.float32
    )  # fp32 on every CPU: the same numbers everywhere
    assert dtypes.dtype_name("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype 'half'"):
        dtypes.resolve_dtype("half")


@pytest.fixture(autouse=True)
def no_onednn_cap(monkeypatch):
    """Each test sets the cap it is about (the suite may run under one)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


@pytest.fixture
def emulating_cpu(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)


def test_bf16_on_a_cpu_without_avx512_bf16_or_amx_warns_naming_the_cause_and_the_fix(emulating_cpu, caplog):
    assert not dtypes.cpu_has_native_bf16()
    with caplog.at_level(logging.WARNING, logger=dtypes.__name__):
        assert dtypes.warn_if_emulated_bf16("bfloat16", "cpu", "the learner")
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "the learner computes in bfloat16 on a CPU without avx512_bf16 or AMX"
    )
    assert "Set dtype='float32'" in record.getMessage()


@pytest.mark.parametrize(
    ("dtype", "device"),
    [("float32", "cpu"), ("auto", "cpu"), (torch.float32, "cpu"), ("bfloat16", "cuda"), ("half", "cpu")],
)
def test_no_warning_for_fp32_a_gpu_or_a_name_only_vllm_knows(emulating_cpu, caplog, dtype, device):
    with caplog.at_level(logging.WARNING, logger=dtypes.__name__):
        assert not dtypes.warn_if_emulated_bf16(dtype, device, "the vLLM engine")
    assert caplog.records == []


def test_no_warning_where_the_cpu_has_avx512_bf16_or_amx(monkeypatch, caplog):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    with caplog.at_level(logging.WARNING, logger=dtypes.__name__):
        assert not dtypes.warn_if_emulated_bf16(torch.bfloat16, "cpu", "the HF engine")
    assert caplog.records == []


@pytest.fixture
def bf16_cpu(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)


@pytest.mark.parametrize(
    ("variable", "cap"), [("ONEDNN_MAX_CPU_ISA", "AVX2"), ("DNNL_MAX_CPU_ISA", "avx512_core")]
)
def test_a_onednn_cap_below_bf16_warns_on_a_cpu_that_has_it(bf16_cpu, monkeypatch, caplog, variable, cap):
    """oneDNN held below AVX512_CORE_BF16 emulates bf16 on a CPU with avx512_bf16 (BENCHMARKS.md section 39's
    26x): the warning names the cap, not the CPU."""
    monkeypatch.setenv(variable, cap)
    assert dtypes.onednn_isa_cap() == cap.upper() and not dtypes.cpu_has_native_bf16()
    with caplog.at_level(logging.WARNING, logger=dtypes.__name__):
        assert dtypes.warn_if_emulated_bf16("bf16", "cpu", "the learner")
    (record,) = caplog.records
    assert f"with oneDNN held to {cap.upper()} (ONEDNN_MAX_CPU_ISA)" in record.getMessage()
    assert "lift the cap" in record.getMessage()


@pytest.mark.parametrize("cap", ["AVX512_CORE_BF16", "avx512_core_amx", "ALL", "DEFAULT", "NOT_AN_ISA", ""])
def test_a_cap_at_or_above_bf16_or_unknown_does_not_warn(bf16_cpu, monkeypatch, caplog, cap):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert dtypes.onednn_isa_cap() is None and dtypes.cpu_has_native_bf16()
    with caplog.at_level(logging.WARNING, logger=dtypes.__name__):
        assert not dtypes.warn_if_emulated_bf16("bfloat16", "cpu", "the HF engine")
    assert caplog.records == []
