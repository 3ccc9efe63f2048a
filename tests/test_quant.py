"""Quantized weights (d3d.cpu.quant, d3d.kernels.quant): the kernel computes the fp32 panel chain on the
dequantized matrix bit for bit (AVX2 and AVX-512 alike), every row count rounds each row alike, GGUF
blocks are kept without re-quantization error, and speculative decoding on quantized weights is
token-exact against AR on the same weights."""

import shutil
import sys

import numpy as np
import pytest
import torch

import d3d
from d3d import hardware
from d3d.cpu import precision
from d3d.kernels import quant as kernel
from d3d.kernels.naive import quant_matmul_reference, skinny_matmul_reference
from d3d.cpu.quant import QuantWeight, Stacked, join, quantize
from d3d.decode.config import SpecConfig

needs_kernel = pytest.mark.skipif(not kernel.available(), reason=f"quant kernel unavailable: {kernel.why_unavailable()}")
ISAS = ["avx2"] + (["avx512"] if "avx512f" in hardware.cpu_flags() else [])


def test_builds_where_the_cpu_and_a_compiler_allow():
    """Not a silent skip: on an AVX2+FMA CPU with a C++ compiler the kernel must build."""
    if {"avx2", "fma"} <= hardware.cpu_flags() and shutil.which("c++") and shutil.which("ninja"):
        assert kernel.available(), kernel.why_unavailable()
    else:
        assert not kernel.available() and kernel.why_unavailable()


def random_format(bits, n, k, group, g, half=False):
    """Row-major (q, scale, min, high) of a random int8/int5/int4 matrix; ``half``: fp16 scales and mins."""
    s = torch.rand(n, k // group, generator=g)
    s = s.half() if half else s
    if bits == 8:
        return torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g), s, None, None
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    if bits == 5:
        return q, s, None, torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, generator=g)
    m = torch.randn(n, k // group, generator=g)
    return q, s, m.half() if half else m, None


def panels(q, s, m, h):
    """The kernel's arguments after x: q, s, m panels (h by keyword)."""
    return kernel.to_panels(q), kernel.to_panels(s), None if m is None else kernel.to_panels(m)


def run(x, fmt, n, bits, isa="auto"):
    q, s, m, h = fmt
    return kernel.matmul(x, *panels(*fmt), n, bits, isa=isa, h=None if h is None else kernel.bits_to_panels(h, n))


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits,half,M,N,K,group", [
    (bits, half, *shape) for bits in (8, 5, 4) for half in (False, True)
    for shape in [(1, 1, 32, 32), (3, 17, 64, 16), (7, 33, 300, 60), (13, 16, 512, 32), (2, 50, 544, 544),
                  (6, 48, 64, 64), (25, 37, 128, 32), (4, 40, 296, 8)]
    if bits != 5 or shape[2] % 8 == 0])  # int5's high bits come in bytes of 8 k (GGUF's Q5_0: K % 32 == 0)
def test_equals_the_fp32_chain_on_the_dequantized_matrix(isa, bits, half, M, N, K, group):
    """K = 296, 300, 512, 544 cross the 256-wide k blocks; group = K is one scale per row."""
    g = torch.Generator().manual_seed(M * 1000 + N * 10 + K + bits)
    x = torch.randn(M, K, generator=g)
    fmt = random_format(bits, N, K, group, g, half)
    got = run(x, fmt, N, bits, isa)
    w = kernel.dequantize(*fmt[:3], bits, fmt[3])
    assert got.shape == (M, N) and torch.equal(got, skinny_matmul_reference(x, w))
    torch.testing.assert_close(got.double(), x.double() @ w.double().T, atol=1e-3 * K ** 0.5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("bits", [8, 5, 4])
def test_the_loop_oracle(bits):
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(3, 64, generator=g)
    fmt = random_format(bits, 5, 64, 32, g)
    assert torch.equal(run(x, fmt, 5, bits), quant_matmul_reference(x, *fmt[:3], bits, fmt[3]))


@needs_kernel
@pytest.mark.parametrize("bits", [8, 5, 4])
@pytest.mark.parametrize("N,K", [(37, 32), (96, 896), (200, 640)])
def test_every_row_count_rounds_each_row_alike(bits, N, K):
    """Row invariance (what keeps speculative output equal to AR): any row count, tile, order or isa."""
    g = torch.Generator().manual_seed(N + K + bits)
    x = torch.randn(26, K, generator=g)
    fmt = random_format(bits, N, K, 32, g, half=True)
    full = run(x, fmt, N, bits)
    for isa in ISAS:
        for M in range(1, 27):
            assert torch.equal(run(x[:M], fmt, N, bits, isa), full[:M]), (isa, M)
    for i in range(26):
        assert torch.equal(run(x[i:i + 1], fmt, N, bits), full[i:i + 1]), i
    perm = torch.randperm(26, generator=g)
    assert torch.equal(run(x[perm], fmt, N, bits), full[perm])


@needs_kernel
def test_thread_count_does_not_change_a_bit():
    x = torch.randn(9, 128)
    fmt = random_format(4, 300, 128, 32, torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(x, fmt, 300, 4)
        torch.set_num_threads(2)
        two = run(x, fmt, 300, 4)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_kernel
def test_zero_rows_and_non_contiguous_input():
    fmt = random_format(8, 20, 64, 32, torch.Generator().manual_seed(2))
    assert run(torch.randn(0, 64), fmt, 20, 8).shape == (0, 20)
    x = torch.randn(64, 5).T  # non-contiguous
    assert torch.equal(run(x, fmt, 20, 8), run(x.contiguous(), fmt, 20, 8))


@needs_kernel
def test_named_argument_errors():
    q, s, m = panels(*random_format(4, 20, 64, 32, torch.Generator().manual_seed(3)))
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="bits must be 8, 5 or 4"):
        kernel.matmul(x, q, s, m, 20, 6)
    with pytest.raises(ValueError, match="int5 needs high bits"):
        kernel.matmul(x, q, s, None, 20, 5)
    with pytest.raises(ValueError, match="x must be a 2-D fp32"):
        kernel.matmul(x.double(), q, s, m, 20, 4)
    with pytest.raises(ValueError, match="q must be"):
        kernel.matmul(torch.randn(2, 32), q, s, m, 20, 4)
    with pytest.raises(ValueError, match="int4 needs mins"):
        kernel.matmul(x, q, s, None, 20, 4)
    with pytest.raises(ValueError, match="n=40 does not fit 2 panels"):
        kernel.matmul(x, q, s, m, 40, 4)
    with pytest.raises(ValueError, match="isa='sse'"):
        kernel.matmul(x, q, s, m, 20, 4, isa="sse")
    with pytest.raises(ValueError, match="int4/int5 groups must be even"):
        QuantWeight(torch.zeros(2, 3, dtype=torch.uint8), torch.ones(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="scale .* does not fit"):
        QuantWeight(torch.zeros(2, 64, dtype=torch.int8), torch.ones(2, 3))
    with pytest.raises(ValueError, match="groups of 32 do not divide"):
        quantize(torch.randn(4, 48), "int4")


needs_vnni = pytest.mark.skipif(not kernel.vnni_available(),
                                reason=f"VNNI kernel unavailable: {kernel.why_vnni_unavailable()}")


needs_maddubs = pytest.mark.skipif(not kernel.maddubs_available(),
                                   reason=f"AVX2 int8 kernel unavailable: {kernel.why_maddubs_unavailable()}")
# The int8-activation kernels: the same arguments, the same bits
INT8_KERNELS = {"vnni": (kernel.matmul_vnni, needs_vnni), "avx2": (kernel.matmul_maddubs, needs_maddubs)}


def int8_cases(cases):
    """``cases`` x the int8-activation kernels, as pytest params (the kernel first)."""
    return [pytest.param(fn, *case, marks=mark, id=f"{name}-{'-'.join(map(str, case))}")
            for name, (fn, mark) in INT8_KERNELS.items() for case in cases]


def test_vnni_builds_where_the_cpu_and_a_compiler_allow():
    compiler = shutil.which("c++") and shutil.which("ninja")
    if kernel.VNNI_FLAGS <= hardware.cpu_flags() and compiler:
        assert kernel.vnni_available(), kernel.why_vnni_unavailable()
    else:
        assert not kernel.vnni_available()
    if {"avx2", "fma", "f16c"} <= hardware.cpu_flags() and compiler:
        assert kernel.int8_available() and kernel.maddubs_available(), kernel.why_maddubs_unavailable()


@pytest.mark.parametrize("matmul,bits,half,M,N,K,group", int8_cases([
    (bits, half, *shape) for bits in (8, 5, 4) for half in (False, True)
    for shape in [(1, 17, 64, 32), (3, 33, 96, 32), (5, 70, 512, 64), (9, 100, 640, 32), (13, 40, 64, 16),
                  (2, 37, 288, 288)]]))
def test_int8_activations_equal_their_loop_oracle_and_stay_close(matmul, bits, half, M, N, K, group):
    """The int8-activation kernels (VNNI, AVX2): bit for bit their oracle (activations quantized per row and
    group, exact integer sums); every row as alone; within ~1% of the fp32-activation product (random inputs)."""
    from d3d.kernels.naive import quant_vnni_reference

    g = torch.Generator().manual_seed(M * 100 + N + K + bits)
    x = torch.randn(M, K, generator=g)
    q, s, m, h = random_format(bits, N, K, group, g, half)
    args = (kernel.to_panels(q), kernel.to_panels(s), None if m is None else kernel.to_panels(m), N, bits,
            None if h is None else kernel.bits_to_panels(h, N))
    got = matmul(x, *args)
    assert torch.equal(got, quant_vnni_reference(x, q, s, m, bits, h))
    for i in range(M):
        assert torch.equal(matmul(x[i:i + 1], *args), got[i:i + 1]), i
    exact = x @ kernel.dequantize(q, s, m, bits, h).T
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()


def vnni_format(fmt, n, k, g):
    """A random matrix of one format the VNNI kernel takes: matmul_vnni's arguments after x, and the loop
    oracle's (naive.quant_vnni_reference) after x. ``fmt``: int8/int5/int4 with fp16 or fp32 group scales
    (``int5-32``, ...), or two-level as Q4_K (``q4k``) and Q6_K (``q6k``)."""
    P = kernel.to_panels
    if fmt in ("q4k", "q6k"):
        bits, group = (4, 32) if fmt == "q4k" else (6, 16)
        q = random_format(4, n, k, group, g)[0] if bits == 4 else torch.randint(-32, 32, (n, k), dtype=torch.int8,
                                                                                  generator=g)
        weights = (P(q), None) if bits == 4 else kernel.int6_to_panels(q)
        s = random_factored(n, k, group, g, signed=bits == 6)
        m = random_factored(n, k, group, g, signed=False) if bits == 4 else None
        args = (weights[0], P(s.f), None if m is None else P(m.f), n, bits, weights[1], P(s.d.half()),
                None if m is None else P(m.d.half()))
        return args, (q, s.f, None if m is None else m.f, 4 if bits == 4 else 8, None, s.d, None if m is None else m.d)
    bits, width = int(fmt[3]), int(fmt.split("-")[1])
    q, s, m, h = random_format(bits, n, k, 32, g, half=width == 16)
    args = (P(q), P(s), None if m is None else P(m), n, bits, None if h is None else kernel.bits_to_panels(h, n))
    return args, (q, s.float(), None if m is None else m.float(), bits, h)


@pytest.mark.parametrize("matmul,fmt", int8_cases([(f,) for f in ["int8-16", "int8-32", "int5-16", "int4-16",
                                                                   "int4-32", "q4k", "q6k"]]))
def test_int8_activations_row_invariance_over_every_row_count(matmul, fmt):
    """Any row count (tiles of 1-16 rows, in halves or chunks; more rows in several tiles) gives each row the
    bits it gets alone, and the loop oracle's; N = 40 ends in a part panel, K = 512 is two super-blocks."""
    from d3d.kernels.naive import quant_vnni_reference

    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 512, generator=g)
    x[3, :100] *= 30  # loud and quiet groups in one row
    args, oracle = vnni_format(fmt, 40, 512, g)
    full = matmul(x, *args)
    assert torch.equal(full, quant_vnni_reference(x, *oracle))
    for M in range(1, 40):
        assert torch.equal(matmul(x[:M], *args), full[:M]), M
    perm = torch.randperm(40, generator=g)
    assert torch.equal(matmul(x[perm], *args), full[perm])
    many = torch.cat([x] * 4)  # 160 rows: 10 tiles, quantized on every thread
    assert torch.equal(matmul(many, *args), torch.cat([full] * 4))


@needs_vnni
def test_dot_probe_runs_every_chain_and_its_rate_is_a_rate():
    module, _ = kernel._load_vnni()
    n, threads = 5, torch.get_num_threads()
    # each of 12 chains of 16 lanes starts at its index and adds (4, 3, 2, 1) . (t + 1, 0, 0, 0) = 4 (t + 1) a step
    assert module.dot_probe(12 * n) == sum(16 * (66 + 48 * n * (t + 1)) for t in range(threads))
    with pytest.raises(RuntimeError, match="per_thread"):
        module.dot_probe(-1)
    rate = kernel.int8_macs_per_second(seconds=0.002)
    assert 1e9 < rate < 1e15


@pytest.mark.parametrize("name", ["vnni", "avx2"])
@pytest.mark.parametrize("M, N, K", [(1, 48, 64), (3, 33, 96), (8, 16, 256), (17, 70, 128)])
def test_int6_with_a_scale_per_group_equals_int8_of_its_values_times_four(name, M, N, K):
    """int6 values h in [-32, 31] with one fp16 scale 4 s per group of 32 (the greedy head's bounds,
    ``d3d.cpu.greedy_head``) give the bits of int8 values 4 h with scale s: the integer sums are a quarter, the
    scale four times, and both products are exact before the same fp32 accumulation."""
    module = (kernel._load_vnni() if name == "vnni" else kernel._load_maddubs())[0]
    if module is None:
        pytest.skip(f"{name} kernel unavailable")
    g = torch.Generator().manual_seed(M * N + K)
    h = torch.randint(-32, 32, (N, K), generator=g, dtype=torch.int8)
    s = (torch.rand(N, K // 32, generator=g) / 50).half().float()
    x = torch.randn(M, K, generator=g)
    nib, crumbs = kernel.int6_to_panels(h)
    e = kernel._EMPTY
    six = module.matmul(x, nib, crumbs, kernel.to_panels((4 * s).half()), e, N, 32, 6, e, e)
    eight = module.matmul(x, kernel.to_panels(4 * h), e, kernel.to_panels(s.half()), e, N, 32, 8, e, e)
    assert torch.equal(six, eight)


def test_activation_choice(monkeypatch):
    from d3d.cpu.quant import int8_activations

    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "fp32")
    assert not int8_activations(896, 32)
    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "auto")
    assert int8_activations(896, 32) == kernel.int8_available()
    assert not int8_activations(896, 8)  # groups the integer path does not take: fp32 activations
    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "int4")
    with pytest.raises(ValueError, match="D3D_QUANT_ACTIVATIONS='int4'"):
        int8_activations(896, 32)


def test_panels_round_trip_and_row_lookup():
    t = torch.arange(37 * 5, dtype=torch.float32).view(37, 5)
    p = kernel.to_panels(t)
    assert p.shape == (3, 5, 16) and torch.equal(kernel.from_panels(p, 37), t)
    assert p[2, :, 5:].abs().sum() == 0  # zero past N
    rows = torch.tensor([36, 0, 17, 17])
    assert torch.equal(kernel.from_panels(p, 37, rows), t[rows])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantize_error_bounds_select_and_embedding_rows(fmt):
    w = torch.randn(40, 96)
    qw = quantize(w, fmt)
    deq = qw.dequantize()
    if fmt == "int8":  # symmetric per row: within half a step of max|w| / 127
        bound = w.abs().amax(dim=1, keepdim=True) / 127 / 2
    else:  # groups of 32: within half a step of (max - min) / 15 (+ fp16's rounding of scale and min)
        g = w.view(40, 3, 32)
        bound = ((g.amax(-1) - g.amin(-1)) / 15 / 2).repeat_interleave(32, dim=1) * 1.01 + 2e-3
    assert ((deq - w).abs() <= bound * (1 + 1e-5) + 1e-7).all()
    rows = torch.tensor([39, 3, 3])
    assert torch.equal(qw.dequantize(rows), deq[rows])
    sub = qw.select(rows)
    assert sub.shape == (3, 96) and torch.equal(sub.dequantize(), deq[rows])
    assert qw.nbytes < w.numel() * w.element_size() / (3 if fmt == "int8" else 4)


@needs_kernel
def test_join_refines_groups_exactly_and_stacks_mixed_formats():
    g = torch.Generator().manual_seed(4)
    pa, pb, pc = random_format(8, 16, 64, 32, g), random_format(8, 8, 64, 16, g), random_format(4, 8, 64, 32, g)
    pd = random_format(8, 8, 64, 32, g)  # pa's format and group
    a, b, c, d = QuantWeight(*pa), QuantWeight(*pb), QuantWeight(*pc), QuantWeight(*pd)
    ab = join([pa, pb])
    assert isinstance(ab, QuantWeight) and ab.group == 16
    assert torch.equal(ab.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    x = torch.randn(3, 64)
    each = {id(pa): a, id(pb): b, id(pc): c, id(pd): d}
    # neighbouring blocks of one format and group join (a Stacked of the runs); other groups stay apart, so
    # that every block computes what it computes alone (int8 activations are quantized per group)
    for blocks, rows in (([pa, pd, pc], [24, 8]), ([pc, pa, pd], [8, 24]), ([pa, pc, pd], [16, 8, 8]),
                         ([pa, pb, pc], [16, 8, 8])):
        abc = join(blocks)
        assert isinstance(abc, Stacked) and abc.shape == (sum(rows), 64) and abc.format == "int4+int8"
        assert [p.out_features for p in abc.parts] == rows
        assert torch.equal(abc.linear(x), torch.cat([each[id(p)].linear(x) for p in blocks], dim=-1))
        for i in range(3):
            assert torch.equal(abc.linear(x[i:i + 1]), abc.linear(x)[i:i + 1])


# ---------------------------------------------------------------- GGUF blocks

def need_gguf():
    return pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install -e '.[gguf]')")


def random_blocks(kind, n, k, rng):
    """Random raw blocks of ``kind`` with finite fp16 scale fields (random bytes elsewhere)."""
    from d3d.model.gguf import BLOCKS

    nbytes, per, _ = BLOCKS[kind]
    blocks = rng.integers(0, 256, size=(n * k // per, nbytes), dtype=np.uint8)
    f16 = {"Q6_K": [208], "Q4_K": [0, 2], "Q4_1": [0, 2]}.get(kind, [0])
    for off in f16:
        vals = rng.uniform(-1, 1, blocks.shape[0]).astype(np.float16)
        blocks[:, off:off + 2] = np.frombuffer(vals.tobytes(), np.uint8).reshape(-1, 2)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_gguf_blocks_are_kept_without_requantization_error(kind):
    """Every weight of the kept blocks has the fp32 value gguf.dequantize gives, bit for bit."""
    from d3d.model.gguf import quant_weight

    gguf = need_gguf()
    raw = random_blocks(kind, 5, 512, np.random.default_rng(len(kind)))
    ref = gguf.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(5, 512)
    w = quant_weight(raw, kind, (5, 512))
    six = "int6" if w.int8_activations else "int8"  # Q6_K's values are held in 6 bits where VNNI multiplies
    assert w.format == {"Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4", "Q5_0": "int5", "Q6_K": six}.get(kind, "int8")
    assert torch.equal(w.dequantize(), torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32)))
    with pytest.raises(ValueError, match="do not make a 5 x 544 matrix"):
        quant_weight(raw, kind, (5, 544))


@needs_kernel
@pytest.mark.parametrize("kinds", [("Q8_0", "Q5_0"), ("Q4_0", "Q4_1")])
def test_quantized_gguf_converts_loads_without_gguf_and_decodes_losslessly(tmp_path, monkeypatch, kinds):
    """convert-gguf keeps Q8_0/Q5_0 (int8) and Q4_0/Q4_1 (int4) blocks; the checkpoint is 3-6x
    smaller, loads without the gguf package, gives the logits of the dequantized conversion, and
    sync/async greedy output equals AR on the same quantized weights."""
    gguf = need_gguf()
    from test_gguf import to_gguf_name

    from d3d.model.gguf import convert_gguf
    from helpers import make_hf_model

    hf = make_hf_model("qwen3", heads=4, kv_heads=2, head_dim=16, hidden=64, inter=96, vocab=256, max_pos=128)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "qwen3")
    cfg = hf.config
    for add, v in [(w.add_block_count, cfg.num_hidden_layers), (w.add_context_length, cfg.max_position_embeddings),
                   (w.add_embedding_length, cfg.hidden_size), (w.add_feed_forward_length, cfg.intermediate_size),
                   (w.add_head_count, cfg.num_attention_heads), (w.add_head_count_kv, cfg.num_key_value_heads),
                   (w.add_layer_norm_rms_eps, cfg.rms_norm_eps), (w.add_key_length, cfg.head_dim)]:
        add(v)
    w.add_rope_freq_base(10000.0)
    for i, (name, t) in enumerate(hf.state_dict().items()):
        a = t.float().numpy().astype(np.float32)
        if a.ndim == 2:
            qtype = getattr(gguf.GGMLQuantizationType, kinds[i % 2])
            w.add_tensor(to_gguf_name(name), gguf.quantize(a, qtype), raw_shape=gguf.quant_shape_to_byte_shape(
                a.shape, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(to_gguf_name(name), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    convert_gguf(tmp_path / "m.gguf", tmp_path / "q", log=lambda *a: None)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "f", log=lambda *a: None, dequantize=True)
    assert (tmp_path / "q" / "model.safetensors").stat().st_size * 3 < (tmp_path / "f" / "model.safetensors").stat().st_size
    monkeypatch.setitem(sys.modules, "gguf", None)  # loading needs no gguf package
    monkeypatch.delenv("D3D_WEIGHTS")  # conftest pins fp32; here "auto" keeps the checkpoint's blocks
    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "fp32")  # the exact kernel: the dequantized model's logits
    quant = d3d.load_model(tmp_path / "q")
    dense = d3d.load_model(tmp_path / "f", weights="fp32")
    assert quant.weights_choice.weights == "checkpoint" and quant.weights in ("int8", "int8+int5", "int4")
    assert dense.weights == "float32" and quant.dtype == torch.float32
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(quant(ids), dense(ids), atol=1e-4, rtol=1e-4)
    assert d3d.load_model(tmp_path / "q", weights="fp32").weights == "float32"  # dequantized on request
    check_speculative_equals_ar(quant)
    if kernel.int8_available():  # int8 activations: close to the dense model, and as lossless
        monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "int8")
        fast = d3d.load_model(tmp_path / "q")
        with torch.no_grad():
            torch.testing.assert_close(fast(ids), dense(ids), atol=0.05, rtol=0.05)
        check_speculative_equals_ar(fast)


def check_speculative_equals_ar(target):
    from test_engines import random_drafter

    prompts = [[3, 7, 1], [5], [2, 9, 11, 4, 8, 1, 1, 6]]
    ref = d3d.generate(target, prompts, max_new_tokens=24, stop_ids=[]).tokens
    for mode in ("sync", "async"):
        drafter = random_drafter(target, 4)
        out = d3d.generate(target, prompts, max_new_tokens=24, stop_ids=[], drafter=drafter,
                           spec=SpecConfig(mode=mode, block_size=4, lookup=0))
        assert out.tokens == ref, mode


# ---------------------------------------------------------------- models and the policy

@needs_kernel
@pytest.mark.parametrize("activations", ["fp32", "auto"])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_bundled_pair_quantized_is_lossless(fmt, activations, monkeypatch):
    """The bundled target and drafter quantized at load: every mode's greedy output equals AR on the
    same weights; the drafter shares the target's embedding and holds its layers in int4 (``as_int4``)."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "models"
    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", activations)
    target = d3d.load_model(models / "target-16m", weights=fmt)
    drafter = d3d.load_drafter(models / "d3d-drafter-16m", target=target)
    assert target.weights == fmt and target.dtype == torch.float32
    assert drafter.model.weights == ("int4" if fmt == "int4" else f"{fmt}+int4")
    tok = d3d.load_tokenizer(models / "target-16m")
    prompts = [tok.encode("import os\n\n\ndef read_lines(path):\n    "), tok.encode("class Config:\n")]
    ref = d3d.generate(target, prompts, max_new_tokens=40, stop_ids=[]).tokens
    for mode in ("sync", "async"):
        assert d3d.generate(target, prompts, max_new_tokens=40, stop_ids=[], drafter=drafter, spec=mode).tokens == ref


@needs_kernel
def test_embedding_lookup_keeps_rows_and_gives_the_dequantized_ones():
    """QuantEmbedding keeps the rows it dequantized: every lookup equals dequantizing its ids, through repeats,
    a full store starting over, a lookup of more distinct ids than it keeps, a new matrix swapped in, and a
    lookup outside inference_mode after rows were kept in it."""
    from d3d.cpu.quant import quantize
    from d3d.model.transformer import QuantEmbedding

    g = torch.Generator().manual_seed(0)
    first, second = (quantize(torch.randn(50, 64, generator=g), fmt) for fmt in ("int4", "int8"))
    emb = QuantEmbedding(first)
    emb.KEPT = 6
    lookups = [[1, 2, 3], [3, 3, 4], [5, 6, 7, 8], [[5, 6], [9, 5]], [5, 10, 11], list(range(10)), [2], [49, 0, 49]]
    for ids in lookups:
        ids = torch.tensor(ids)
        assert torch.equal(emb(ids), first.dequantize(ids.reshape(-1)).view(*ids.shape, 64)), ids
        assert len(emb._slot) <= 6
    emb.weight = second
    ids = torch.tensor([1, 2, 3])
    assert torch.equal(emb(ids), second.dequantize(ids))
    emb = QuantEmbedding(second)
    with torch.inference_mode():  # rows kept under inference_mode (generate), then a new row outside it
        emb(torch.tensor([4]))
    with torch.no_grad():
        ids = torch.tensor([4, 12])
        assert torch.equal(emb(ids), second.dequantize(ids))


@needs_kernel
def test_quantized_matrices_are_modules_swapped_in(tmp_path, monkeypatch):
    """Each quantized matrix is a ``QuantLinear`` put where its ``Linear`` was (the bias kept, no weight
    Parameter left): ``state_dict`` holds the rest as before, and the logits are the dense model's on the
    dequantized matrices (fp32 activations: the exact kernel)."""
    from d3d.model.config import preset
    from d3d.model.transformer import QuantEmbedding, QuantLinear, Transformer

    torch.manual_seed(0)
    model = Transformer(preset("qwen3-tiny", attention_bias=True, tie_word_embeddings=False))
    for layer in model.layers:
        torch.nn.init.normal_(layer.self_attn.qkv_proj.bias)
    d3d.save_model(model, tmp_path, dtype="float32")
    monkeypatch.setenv("D3D_QUANT_ACTIVATIONS", "fp32")
    q = d3d.load_model(tmp_path, weights="int8")
    dense = d3d.load_model(tmp_path, weights="fp32")
    swapped = {n for n, m in q.named_modules() if isinstance(m, QuantLinear)}
    matrices = {n.removesuffix(".weight") for n, p in dense.named_parameters() if p.dim() == 2}
    assert swapped == matrices - {"embed_tokens"}
    assert isinstance(q.embed_tokens, QuantEmbedding) and all(p.dim() == 1 for p in q.parameters())
    assert len(q.quantized_matrices()) == len(swapped) + 1 and q.weights == "int8"
    assert set(q.state_dict()) == {n for n, p in dense.state_dict().items() if p.dim() == 1}
    assert torch.equal(q.layers[1].self_attn.qkv_proj.bias, dense.layers[1].self_attn.qkv_proj.bias)
    q.load_state_dict(q.state_dict())  # strict: what it holds round-trips
    with torch.no_grad():
        for name in swapped:
            dense.get_submodule(name).weight.copy_(q.get_submodule(name).weight.dequantize())
        dense.embed_tokens.weight.copy_(q.embed_tokens.weight.dequantize())
    ids = torch.randint(0, q.cfg.vocab_size, (2, 9))
    torch.testing.assert_close(q(ids), dense(ids), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="cannot replace"):
        q.set_weight("norm.weight", quantize(torch.randn(64, 64), "int8"))


def test_decide_weights_with_mocked_machines():
    big, llc = 2 << 30, 32 << 20
    probe = lambda: {"dense": 10.0, "int8": 4.0}  # noqa: E731
    assert precision.decide_weights(big, llc, None, probe).weights == "int8"
    assert precision.decide_weights(big, llc, None, lambda: {"dense": 3.0, "int8": 4.0}).weights == "dense"  # AMX-like
    assert precision.decide_weights(16 << 20, llc, None, probe).weights == "dense"  # fits the cache
    assert precision.decide_weights(big, llc, "no compiler", probe).weights == "dense"


def test_auto_weights_rules_and_errors(monkeypatch):
    from d3d.model.config import ModelConfig

    cfg = ModelConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    monkeypatch.delenv("D3D_WEIGHTS", raising=False)
    with pytest.raises(ValueError, match="weights='int3'"):
        precision.auto_weights("int3", "auto", "cpu", cfg, False)
    with pytest.raises(ValueError, match="disagree"):
        precision.auto_weights("bf16", "float32", "cpu", cfg, False)
    assert precision.auto_weights("fp32", "auto", "cpu", cfg, True).weights == "float32"
    assert precision.auto_weights("auto", "float32", "cpu", cfg, False).weights == "dense"  # a dtype was given
    assert precision.auto_weights("auto", "auto", "cpu", cfg, False).weights == "dense"  # tiny: fits the cache
    monkeypatch.setenv("D3D_WEIGHTS", "int4")
    choice = precision.auto_weights("auto", "auto", "cpu", cfg, False)
    assert choice.weights == ("int4" if kernel.available() else "dense") and "D3D_WEIGHTS" in choice.reason
    assert precision.auto_weights("fp32", "auto", "cpu", cfg, False).weights == "float32"  # the argument wins
    monkeypatch.setenv("D3D_WEIGHTS", "int2")
    with pytest.raises(ValueError, match="D3D_WEIGHTS='int2'"):
        precision.auto_weights("auto", "auto", "cpu", cfg, False)
    monkeypatch.delenv("D3D_WEIGHTS")
    if kernel.available():
        assert precision.auto_weights("auto", "auto", "cpu", cfg, True).weights == "checkpoint"
    with pytest.warns(UserWarning, match="run on a CPU only"):
        assert precision.auto_weights("int8", "auto", "meta", cfg, False).weights == "dense"


def test_int5_widens_to_the_same_int8_weights():
    from d3d.cpu.quant import widen

    fmt = random_format(5, 20, 64, 32, torch.Generator().manual_seed(5))
    assert torch.equal(QuantWeight(*widen(fmt)).dequantize(), QuantWeight(*fmt).dequantize())


@needs_kernel
def test_legacy_int8_drafter_keeps_its_own_scales(tmp_path):
    """A drafter saved as int8 (per-row scales) loads as int8 (asked for) beside a quantized target with exactly
    the values its dense load dequantizes to: no second quantization; by default (``as_int4``) as int4 quantized
    from those values."""
    from d3d.cpu.quant import quantize

    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "models"
    target = d3d.load_model(models / "target-16m", weights="int8")
    dense_target = d3d.load_model(models / "target-16m", weights="fp32")
    src = d3d.load_drafter(models / "d3d-drafter-16m", target=dense_target)
    d3d.save_drafter(src, tmp_path / "d", int8=True)
    q = d3d.load_drafter(tmp_path / "d", target=target, weights="int8")
    dq = d3d.load_drafter(tmp_path / "d", target=dense_target)
    w = q.model.layers[0].mlp.down_proj.weight
    assert isinstance(w, QuantWeight) and w.group == w.in_features
    assert torch.equal(w.dequantize(), dq.model.layers[0].mlp.down_proj.weight)
    w4 = d3d.load_drafter(tmp_path / "d", target=target).model.layers[0].mlp.down_proj.weight
    assert w4.format == "int4" and torch.equal(w4.dequantize(), quantize(w.dequantize(), "int4").dequantize())


# ---------------------------------------------------------------- the Triton kernel (GPUs)

@pytest.mark.usefixtures("kernel_device")
@pytest.mark.parametrize("bits", [8, 5, 4])
@pytest.mark.parametrize("M,N,K,group", [(1, 17, 64, 32), (3, 70, 96, 32), (20, 33, 128, 16), (5, 40, 64, 64)])
def test_triton_weight_only_matmul_matches_its_torch_reference(bits, M, N, K, group, kernel_device):
    """Odd N (a partial tile), M over one BLOCK_M, groups of 16-64; the interpreter on a CPU."""
    from d3d.kernels.quant_triton import quant_linear_torch, quant_linear_triton

    g = torch.Generator().manual_seed(M + N + K + bits)
    q, s, m, h = (None if t is None else t.to(kernel_device) for t in random_format(bits, N, K, group, g))
    x = torch.randn(M, K, generator=g).to(kernel_device)
    got = quant_linear_triton(x, q, s, m, bits, h)
    torch.testing.assert_close(got, quant_linear_torch(x, q, s, m, bits, h), atol=1e-4 * K ** 0.5, rtol=1e-4)
    with pytest.raises(ValueError, match="q must be"):
        quant_linear_triton(x[:, :32], q, s, m, bits, h)


# ---------------------------------------------------------------- K-quant scales held as two factors

def random_factored(n, k, group, g, signed):
    """Factored scales: int8 factors per group (Q6_K's signed, Q4_K's 0..63), fp16 factors per 256."""
    from d3d.cpu.quant import Factored

    lo, hi = (-128, 128) if signed else (0, 64)
    f = torch.randint(lo, hi, (n, k // group), dtype=torch.int8, generator=g)
    return Factored(f, (torch.randn(n, k // 256, generator=g) / 64).half().float())


@pytest.mark.parametrize("matmul,bits,group,M,N,K", int8_cases([
    (4, 32, 1, 17, 256), (4, 32, 5, 40, 512), (4, 32, 9, 33, 768), (6, 16, 1, 17, 256), (6, 16, 3, 70, 512),
    (6, 16, 13, 16, 1536), (4, 32, 18, 70, 512), (6, 16, 20, 33, 768)]))
def test_factored_scales_equal_their_loop_oracle_and_stay_close(matmul, bits, group, M, N, K):
    """Two-level scales (fp16 super-block factor x int8 group factor; int4 as Q4_K, int6 as Q6_K):
    activations quantized per super-block with up to 3 more bits for quiet groups, group factors applied
    in integers; bit for bit the loop oracle, every row as alone, within ~1% of the fp32-activation
    product and of the per-group path on the same scales as fp32 values."""
    from d3d.kernels.naive import quant_vnni_reference

    g = torch.Generator().manual_seed(M * 1000 + N + K + bits)
    x = torch.randn(M, K, generator=g)
    x[0, :K // 2] *= 40  # large activations beside small ones: quiet groups take finer scales
    if M > 1:
        x[-1, 5] = 30.0  # an outlier: the rest of its super-block quantized with finer group scales
    if bits == 4:
        q = random_format(4, N, K, group, g)[0]
        weights = (kernel.to_panels(q), None)
    else:
        q = torch.randint(-32, 32, (N, K), dtype=torch.int8, generator=g)
        weights = kernel.int6_to_panels(q)
    s = random_factored(N, K, group, g, signed=bits == 6)
    m = random_factored(N, K, group, g, signed=False) if bits == 4 else None
    P = kernel.to_panels
    two_args = (weights[0], P(s.f), None if m is None else P(m.f), N, bits, weights[1], P(s.d.half()),
                None if m is None else P(m.d.half()))
    two = matmul(x, *two_args)
    b8 = 4 if bits == 4 else 8  # the oracle reads int6 as the int8 values it holds
    assert torch.equal(two, quant_vnni_reference(x, q, s.f, None if m is None else m.f, b8, None, s.d,
                                                 None if m is None else m.d))
    for i in range(M):
        assert torch.equal(matmul(x[i:i + 1], *two_args), two[i:i + 1]), i
    sv, mv = s.expand(), None if m is None else m.expand()
    exact = x @ kernel.dequantize(q, sv, mv, b8).T
    assert (two - exact).abs().max() <= 0.02 * exact.abs().max()
    per_group = matmul(x, P(q), P(sv), None if mv is None else P(mv), N, b8)
    assert (two - per_group).abs().max() <= 0.02 * exact.abs().max()
    with pytest.raises(ValueError, match="int8 exactly when they are two-level"):
        matmul(x, P(q), P(sv), None if mv is None else P(mv), N, b8, None, P(s.d.half()))


@needs_vnni
def test_factored_scales_outside_super_blocks_of_256_are_refused():
    g = torch.Generator().manual_seed(3)
    q = random_format(8, 16, 512, 16, g)[0]
    s = random_factored(16, 512, 16, g, signed=True)
    d = torch.cat([s.d, s.d], dim=1)  # super-blocks of 128 inputs
    P = kernel.to_panels
    with pytest.raises(RuntimeError, match="super-blocks of 256"):
        kernel.matmul_vnni(torch.randn(2, 512, generator=g), P(q), P(s.f), None, 16, 8, None, P(d.half()))


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_scales_stay_factored_through_join_files_and_rows(kind):
    """A K-quant matrix keeps its two-factor scales (fewer bytes) where the VNNI kernel multiplies, and
    gives what its loop oracle gives on them (near what its fp32 scales give); joined with a like matrix
    it stays factored, with an unlike one (Q4_K beside Q6_K) each block keeps its own; the checkpoint
    tensors round-trip them."""
    from d3d.cpu.quant import Factored, QuantWeight, Stacked, join
    from d3d.model.checkpoint import _quant_parts, quant_tensors
    from d3d.model.gguf import block_parts

    rng = np.random.default_rng(3)
    parts = block_parts(random_blocks(kind, 48, 512, rng), kind, (48, 512))
    assert isinstance(parts[1], Factored) and parts[1].f.dtype == torch.int8
    w = QuantWeight(*parts)
    plain = QuantWeight(*w.rowmajor())  # the same values as fp32 scales
    assert torch.equal(w.dequantize(), plain.dequantize())
    x = torch.randn(3, 512)
    if w.int8_activations:
        from d3d.kernels.naive import quant_vnni_reference

        assert w.scale_d is not None and w.nbytes < plain.nbytes
        q, s, m, _ = parts
        assert torch.equal(w.linear(x), quant_vnni_reference(x, q, s.f, None if m is None else m.f, w.bits, None,
                                                             s.d, None if m is None else m.d))
        assert (w.linear(x) - plain.linear(x)).abs().max() <= 0.02 * plain.linear(x).abs().max()
    files = quant_tensors("m.weight", parts)
    assert files["m.weight.qscale"].dtype == torch.int8 and files["m.weight.qscale_d"].dtype == torch.float16
    back = _quant_parts(dict(files), "m.weight", (48, 512), "here")
    assert torch.equal(back[1].f, parts[1].f) and torch.equal(back[1].d, parts[1].d)
    other = block_parts(random_blocks(kind, 16, 512, rng), kind, (16, 512))
    joined = join([parts, other])
    assert isinstance(joined, QuantWeight) and torch.equal(
        joined.dequantize(), torch.cat([w.dequantize(), QuantWeight(*other).dequantize()]))
    if w.scale_d is not None:
        assert joined.scale_d is not None
    unlike = block_parts(random_blocks("Q6_K" if kind == "Q4_K" else "Q4_K", 16, 512, rng),
                         "Q6_K" if kind == "Q4_K" else "Q4_K", (16, 512))
    stacked = join([parts, unlike])
    assert isinstance(stacked, Stacked) and all((p.scale_d is not None) == (w.scale_d is not None)
                                                for p in stacked.parts)


# ---------------------------------------------------------------- Q6_K held in 6 bits

@pytest.mark.parametrize("n,k", [(1, 8), (17, 64), (40, 256), (33, 520)])
def test_int6_panels_round_trip(n, k):
    g = torch.Generator().manual_seed(n + k)
    q = torch.randint(-32, 32, (n, k), dtype=torch.int8, generator=g)
    nib, crumbs = kernel.int6_to_panels(q, chunk=16)
    assert nib.shape == (-(-n // 16), k // 2, 16) and crumbs.shape == (-(-n // 16), k // 8, 32)
    assert torch.equal(kernel.int6_from_panels(nib, crumbs, n), q)
    rows = torch.tensor([n - 1, 0, n // 2])
    assert torch.equal(kernel.int6_from_panels(nib, crumbs, n, rows), q[rows])


@needs_vnni
def test_two_level_scales_take_int6_or_int4_only():
    """The kernel's integer sums of two-level scales are bounded for 6-bit weights (and 4-bit): int8
    with two-level scales is refused (``QuantWeight`` keeps such int8 with fp32 scales)."""
    g = torch.Generator().manual_seed(11)
    q = torch.randint(-128, 128, (16, 256), dtype=torch.int8, generator=g)
    s = random_factored(16, 256, 16, g, signed=True)
    P = kernel.to_panels
    with pytest.raises(RuntimeError, match="two-level scales need int6 or int4"):
        kernel.matmul_vnni(torch.randn(2, 256, generator=g), P(q), P(s.f), None, 16, 8, None, P(s.d.half()))
    from d3d.cpu.quant import QuantWeight
    wide = QuantWeight(q, s)
    assert wide.format == "int8" and wide.scale_d is None


def test_q6_k_is_held_in_six_bits_where_the_vnni_kernel_multiplies():
    from d3d.cpu.quant import QuantWeight
    from d3d.model.gguf import block_parts

    rng = np.random.default_rng(5)
    parts = block_parts(random_blocks("Q6_K", 40, 512, rng), "Q6_K", (40, 512))
    w = QuantWeight(*parts)
    assert torch.equal(w.parts()[0], parts[0])
    assert torch.equal(w.dequantize(), QuantWeight(*w.rowmajor()).dequantize())
    rows = torch.tensor([39, 3])
    assert torch.equal(w.select(rows).dequantize(), w.dequantize()[rows])
    if w.int8_activations:
        assert w.format == "int6" and w.nbytes < QuantWeight(*w.rowmajor()).nbytes
        x = torch.randn(3, 512)
        q, s, _, _ = parts
        from d3d.kernels.naive import quant_vnni_reference
        assert torch.equal(w.linear(x), quant_vnni_reference(x, q, s.f, None, 8, None, s.d))
    else:
        assert w.format == "int8"
