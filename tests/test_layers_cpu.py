"""d3d.kernels.layers_cpu: a CPU decoding pass's layers in one C++ call give the Python layers' bits.

Its reference is ``DecoderLayer.forward`` (``Transformer.cpu_layers = False``): logits and the K/V it writes
must be equal bit for bit, over the block formats of the real models' GGUFs (q/k/v of two formats
stacked, biases, two-level K-quant scales, int6) and dense matrices (fp32 panels, oneDNN's fp32 and bf16
blocks, Qwen3's QK norms), one row and many, several sequences, drafter blocks (group ids and reach), and
where it does not apply the Python layers run.
"""

import numpy as np
import pytest
import torch

import d3d
from d3d.cpu.quant import QuantWeight, Stacked, join
from d3d.kernels import layers_cpu
from d3d.kernels import quant as kernel
from d3d.model.config import preset
from d3d.model.gguf import block_parts
from d3d.model.transformer import Transformer, bind_cpu_layers
from test_quant import random_blocks

needs_layers = pytest.mark.skipif(not layers_cpu.available(), reason=f"unavailable: {layers_cpu.why_unavailable()}")

# per layer: the GGUF kinds of q, k, v, o, gate, up, down (the real 0.5B's mix first)
KINDS = [("Q5_0", "Q5_0", "Q8_0", "Q5_0", "Q4_K", "Q4_K", "Q6_K"),
         ("Q8_0", "Q8_0", "Q8_0", "Q4_0", "Q4_1", "Q4_1", "Q4_K")]


def test_builds_where_the_kernels_it_calls_build():
    """Not a silent skip: wherever glue_cpu and attend_cpu build, so does this."""
    from d3d.kernels import attention_cpu, glue_cpu

    if glue_cpu.available() and attention_cpu.available():
        assert layers_cpu.available(), layers_cpu.why_unavailable()


def qwen2_model(qk_norm: bool = False, seed: int = 0) -> Transformer:
    """A two-layer Qwen2 (biases, no QK norm) whose projections hold random GGUF blocks of ``KINDS``."""
    cfg = preset("qwen3-tiny", hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, attention_bias=True, qk_norm=qk_norm, vocab_size=512)
    torch.manual_seed(seed)
    model = Transformer(cfg).float().eval().requires_grad_(False)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for layer in model.layers:  # norms other than ones, so that a norm's weight left out shows
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)

    def blocks(kind, n, k):
        return block_parts(random_blocks(kind, n, k, rng), kind, (n, k))

    for i, (kq, kk, kv, ko, kg, ku, kd) in enumerate(KINDS):
        p = f"layers.{i}."
        model.set_weight(p + "self_attn.qkv_proj.weight", join([blocks(kq, 256, 256), blocks(kk, 128, 256),
                                                                 blocks(kv, 128, 256)]))
        model.set_weight(p + "self_attn.o_proj.weight", join([blocks(ko, 256, 256)]))
        model.set_weight(p + "mlp.gate_up_proj.weight", join([blocks(kg, 512, 256), blocks(ku, 512, 256)]))
        model.set_weight(p + "mlp.down_proj.weight", join([blocks(kd, 256, 512)]))
    return model


def snapshot(cache):
    """A function that puts ``cache`` back as it is now."""
    k, v, lengths = [t.clone() for t in cache.k], [t.clone() for t in cache.v], list(cache.lengths)

    def restore():
        for t, s in zip(cache.k + cache.v, k + v):
            t.copy_(s)
        cache.lengths = list(lengths)

    return restore


def both_ways(model, cache, ids, layout_args, logits_index=None):
    """Logits and the caches after one pass, the Python layers' and the one call's (from the same cache state,
    which the cache is left in)."""
    restore, out = snapshot(cache), []
    for fused in (False, True):
        model.cpu_layers = fused
        restore()
        with torch.inference_mode():
            logits = model(ids, cache.layout(*layout_args), cache, logits_index=logits_index)
        out.append((logits, [k.clone() for k in cache.k], [v.clone() for v in cache.v]))
    model.cpu_layers = True
    restore()
    return out


def check_passes(model, vocab: int) -> None:
    """Passes of one row and many, several sequences, drafter blocks (group ids, reach): the one call gives the
    Python layers' logits and K/V, bit for bit; and it ran."""
    cache = model.new_cache(3, 128)
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():  # some context in rows 0 and 2
        model(torch.randint(0, vocab, (40,), generator=g), cache.layout([17, 23], rows=[0, 2]), cache)
    passes = [([1], [0]), ([5], [2]), ([16], [0]), ([3, 1, 2], [0, 1, 2]),  # rows of one and of many
              ([4, 4], [2, 0], [[0, 1, 1, 1], [0, 0, 1, 2]]),  # drafter blocks: group ids
              ([6], [1], [[0, 0, 1, 1, 2, 2]], False, [[0, 0, 1, 1, 1, 1]]),  # ... and reach
              ([70], [1])]  # a prefill's rows (SDPA, the Python layers both ways)
    for args in passes:
        ids = torch.randint(0, vocab, (sum(args[0]),), generator=g)
        (a, ka, va), (b, kb, vb) = both_ways(model, cache, ids, args)
        assert torch.isfinite(a).all()
        assert torch.equal(a, b), args
        assert all(torch.equal(x, y) for x, y in zip(ka + va, kb + vb)), args
        # only some rows' logits (out of order, one twice): the last layer carries those alone past attention,
        # both ways, with the bits of every row carried through (asking for the last layer's output does that)
        want = torch.tensor([len(ids) - 1, 0, len(ids) - 1][: len(ids) + 1])
        restore = snapshot(cache)
        with torch.inference_mode():
            full = model(ids, cache.layout(*args), cache, logits_index=want, hidden_layers=(len(model.layers),))[0]
        restore()
        for logits, k, v in both_ways(model, cache, ids, args, want):
            assert torch.equal(logits, full), args
            assert all(torch.equal(x, y) for x, y in zip(k + v, ka + va)), args
        with torch.inference_mode():  # keep going from there: later passes see more context
            model(ids, cache.layout(*args), cache)
    assert model._cpu_layers  # the one call ran (it was not silently left out)


@needs_layers
def test_one_call_gives_the_python_layers_bits():
    model = qwen2_model()
    ws = [layer.self_attn.qkv_proj.weight for layer in model.layers]
    assert isinstance(ws[0], Stacked) and isinstance(ws[1], QuantWeight)  # both forms of a projection
    if not all(p.int8_activations for w in ws for p in (w.parts if isinstance(w, Stacked) else [w])):
        pytest.skip("D3D_QUANT_ACTIVATIONS=fp32: the one call multiplies int8 activations only")
    assert bind_cpu_layers(model) is not None
    check_passes(model, 512)


def dense_model(arch: str, dtype: torch.dtype) -> Transformer:
    """A two-layer Qwen3 (QK norms) or Qwen2 (biases) with dense matrices in ``dtype``, packed for the CPU."""
    cfg = preset("qwen3-tiny", hidden_size=128, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, vocab_size=512, qk_norm=arch == "qwen3", attention_bias=arch == "qwen2")
    model = Transformer(cfg).to(dtype).eval().requires_grad_(False)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if "norm" in name:
                t.uniform_(0.5, 1.5)
            elif "bias" in name:
                t.normal_(0, 0.5)
    return model.pack_for_cpu()


@needs_layers
@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
@pytest.mark.parametrize("matmul", ["onednn", "panels", "onednn-bf16"])
def test_dense_matrices_take_the_one_call_too(arch, matmul, monkeypatch):
    """fp32 panels (AVX2 CPUs), oneDNN's fp32 and bf16 blocks, Qwen3's QK norms: the Python layers' bits; a
    weight trained in place since is copied again."""
    from d3d.cpu import linear as cpu_linear
    from d3d.kernels import skinny

    dtype = torch.bfloat16 if matmul == "onednn-bf16" else torch.float32
    if matmul == "panels" and not skinny.available():
        pytest.skip(f"fp32 panels unavailable: {skinny.why_unavailable()}")
    if matmul != "panels" and not cpu_linear.packs(dtype):
        pytest.skip(f"oneDNN does not pack {dtype} on this CPU")
    monkeypatch.setenv("D3D_CPU_MATMUL", "panels" if matmul == "panels" else "onednn")
    model = dense_model(arch, dtype)
    packed = getattr(model.layers[0].mlp.down_proj.weight, cpu_linear.ATTR)
    assert isinstance(packed, cpu_linear.PanelWeight if matmul == "panels" else cpu_linear.PackedWeight)
    check_passes(model, 512)
    trained = [model.layers[1].mlp.down_proj.weight]
    if arch == "qwen3":
        trained.append(model.layers[0].self_attn.k_norm.weight)
    for t in trained:  # an optimizer's step, in place: each copied tensor on its own
        with torch.no_grad():
            t.mul_(-2)
        check_passes(model, 512)


@needs_layers
def test_speculative_equals_ar_through_the_one_call():
    from test_quant import check_speculative_equals_ar

    model = qwen2_model(seed=3)
    if bind_cpu_layers(model) is None:
        pytest.skip("D3D_QUANT_ACTIVATIONS=fp32: the one call multiplies int8 activations only")
    check_speculative_equals_ar(model)
    assert model._cpu_layers


@needs_layers
def test_where_it_does_not_apply_the_python_layers_run(monkeypatch):
    unpacked = Transformer(preset("qwen3-tiny", qk_norm=False, attention_bias=True)).float().eval()
    assert bind_cpu_layers(unpacked) is None  # dense matrices without their packed copies
    assert bind_cpu_layers(dense_model("qwen3", torch.float32).to(torch.float16)) is None  # fp16
    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "fp32")
    assert bind_cpu_layers(qwen2_model()) is None  # fp32 activations (the exact kernel)


@needs_layers
def test_bound_again_when_the_weights_change():
    """The bound layers hold the model's tensors: a matrix swapped in, or new norms loaded, is bound again."""
    model, other = qwen2_model(seed=0), qwen2_model(seed=1)
    if bind_cpu_layers(model) is None:
        pytest.skip("D3D_QUANT_ACTIVATIONS=fp32: the one call multiplies int8 activations only")
    ids = torch.arange(7)

    def logits(m):
        cache = m.new_cache(1, 16)
        with torch.inference_mode():
            return m(ids, cache.layout([7]), cache)

    logits(model)
    first = model._cpu_layers
    model.set_weight("layers.1.mlp.down_proj.weight", other.layers[1].mlp.down_proj.weight)
    model.load_state_dict({k: v for k, v in other.state_dict().items() if "norm" in k}, strict=False)
    fused = logits(model)
    assert model._cpu_layers is not first
    model.cpu_layers = False
    assert torch.equal(fused, logits(model))
