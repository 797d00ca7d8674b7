"""core.target's dtype choice: `auto` picks bfloat16 only where the hardware multiplies it natively."""

import pytest
import torch

import core.target as target_mod
from core.target import cpu_has_fast_bf16, fast_dtype, resolve_dtype

AVX2_ONLY = "flags\t\t: fpu vme sse sse2 avx avx2 fma\n"
AMX = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_cpu_flags_decide_fast_bf16():
    assert not cpu_has_fast_bf16(AVX2_ONLY)
    assert cpu_has_fast_bf16(AMX)
    assert cpu_has_fast_bf16("flags : avx512f avx512_bf16\n")
    assert not cpu_has_fast_bf16("flags : avx512f avx512bw\n")  # AVX-512 without its bf16 extension


def test_auto_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(target_mod, "cpu_has_fast_bf16", lambda cpuinfo=None: False)
    assert fast_dtype(torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto") == torch.float32
    monkeypatch.setattr(target_mod, "cpu_has_fast_bf16", lambda cpuinfo=None: True)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    # explicit choices are never overridden
    assert resolve_dtype("bfloat16") == torch.bfloat16 and resolve_dtype("float32") == torch.float32


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="choose one of auto, bfloat16, float32"):
        resolve_dtype("int4")
