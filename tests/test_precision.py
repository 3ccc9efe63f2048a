"""The dtype policy (d3d.cpu.precision) with mocked CPU capabilities, and the bf16 path it picks."""

import pytest
import torch

import d3d
from d3d.cpu import precision
from d3d.cpu.precision import DtypeChoice, auto_dtype, decide_cpu, resolve_dtype

from helpers import make_hf_model, save_hf


def _probe(fp32_ms, bf16_ms, calls=None):
    def probe():
        if calls is not None:
            calls.append(1)
        return {"float32": fp32_ms, "bfloat16": bf16_ms}
    return probe


def test_avx2_only_cpu_falls_back_to_fp32_without_probing():
    calls = []
    choice = decide_cpu({"avx2", "fma", "avx512f"}, _probe(1.0, 0.1, calls))
    assert choice.dtype == "float32" and "no bf16" in choice.reason
    assert calls == []  # the flags alone decide: no probe on a CPU without bf16 instructions


@pytest.mark.parametrize("flag", ["amx_bf16", "avx512_bf16"])
def test_bf16_cpu_with_fast_probe_picks_bf16(flag):
    choice = decide_cpu({"avx2", flag}, _probe(3.9, 0.74))
    assert choice.dtype == "bfloat16"
    assert choice.cpu_flags == (flag,) and choice.probe_ms == {"float32": 3.9, "bfloat16": 0.74}


def test_bf16_flag_but_slow_probe_keeps_fp32():
    # a hypervisor can advertise avx512_bf16 that the library build then emulates
    choice = decide_cpu({"avx512_bf16"}, _probe(1.0, 7.5))
    assert choice.dtype == "float32" and "0.13x" in choice.reason


def test_env_override_and_its_errors(monkeypatch):
    monkeypatch.setenv("D3D_DTYPE", "bf16")
    assert auto_dtype("cpu") == DtypeChoice("bfloat16", "forced by D3D_DTYPE")
    monkeypatch.setenv("D3D_DTYPE", "float64")
    with pytest.raises(ValueError, match="D3D_DTYPE='float64'"):
        auto_dtype("cpu")


def test_gpu_uses_the_checkpoint_dtype(monkeypatch):
    monkeypatch.delenv("D3D_DTYPE", raising=False)
    assert auto_dtype("cuda", "float16").dtype == "float16"
    assert auto_dtype("cuda", None).dtype == "bfloat16"


def test_resolve_dtype(monkeypatch):
    monkeypatch.delenv("D3D_DTYPE", raising=False)
    monkeypatch.setattr(precision, "_cpu_choice", lambda: DtypeChoice("bfloat16", "mocked"))
    assert resolve_dtype("auto") == torch.bfloat16 and resolve_dtype(None) == torch.bfloat16
    assert resolve_dtype("fp32") == torch.float32 and resolve_dtype(torch.float16) == torch.float16
    with pytest.raises(ValueError, match="dtype='int8'"):
        resolve_dtype("int8")


@pytest.mark.parametrize("cpu", ["bfloat16", "float32"])
def test_load_model_follows_the_policy(tmp_path, monkeypatch, cpu):
    save_hf(make_hf_model("qwen3"), tmp_path)
    monkeypatch.delenv("D3D_DTYPE", raising=False)
    monkeypatch.setattr(precision, "_cpu_choice", lambda: DtypeChoice(cpu, "mocked"))
    model = d3d.load_model(tmp_path)  # default dtype="auto"
    assert model.dtype == getattr(torch, cpu)
    assert d3d.load_model(tmp_path, dtype="float32").dtype == torch.float32  # explicit wins


def test_bf16_pass_keeps_attention_in_fp32_and_stays_close(tmp_path):
    """bf16 weights/activations, fp32 KV cache on CPU (fp32 attention), logits near the fp32 ones."""
    save_hf(make_hf_model("qwen3", layers=3), tmp_path)
    m32, m16 = d3d.load_model(tmp_path, dtype="float32"), d3d.load_model(tmp_path, dtype="bfloat16")
    ids = torch.randint(0, 257, (1, 12))
    with torch.inference_mode():
        c32, c16 = m32.new_cache(1, 32), m16.new_cache(1, 32)
        assert c16.k[0].dtype == torch.float32
        l32 = m32(ids, cache=c32)
        l16 = m16(ids, cache=c16)
        assert l16.dtype == torch.bfloat16
        torch.testing.assert_close(l16.float(), l32, atol=0.08, rtol=0.05)
        # the decode step after it reads the bf16 model's fp32 cache
        step = m16(torch.tensor([[5]]), cache=c16)
        ref = m32(torch.tensor([[5]]), cache=c32)
    torch.testing.assert_close(step.float(), ref, atol=0.08, rtol=0.05)
