"""d3d.kernels.denoise: the counter-based RNG, the torch path against a loop oracle, the Triton
kernel (interpreted on CPU) against the torch path, and the sampling distribution at T > 0.

Kernel tests force the kernel with D3D_KERNELS=triton; shapes are small because the interpreter
costs about a millisecond per operation per program.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from d3d.kernels import denoise as dn
from d3d.kernels import interpreting
from d3d.kernels.denoise import denoise_step, denoise_step_torch

V_LARGE = 151936  # the Qwen vocabulary

pytestmark = pytest.mark.usefixtures("kernel_device")  # GPU when present: tests/conftest.py


def _run(backend, monkeypatch, logits, tokens, masked, **kw):
    """One step on copies of tokens/masked; returns (tokens, masked, confidence, committed)."""
    monkeypatch.setenv("D3D_KERNELS", backend)
    t, m = tokens.clone(), masked.clone()
    conf = torch.full(t.shape, -7.0)
    committed = denoise_step(logits, t, m, confidence=conf, **kw)
    return t, m, conf, committed


def _random_case(N, B, V, *, dtype=torch.float32, p_masked=0.7, seed=0):
    g = torch.Generator(device=torch.get_default_device()).manual_seed(seed)
    logits = (torch.randn(N, B, V, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, V, (N, B), generator=g)
    masked = torch.rand(N, B, generator=g) < p_masked
    return logits, tokens, masked


def _oracle(logits, tokens, masked, rule, threshold=0.9, k=1):
    """Plain loops, T = 0: per block, argmax and softmax confidence per masked position, then
    the commit set by sorting (confidence descending, position ascending)."""
    N, B, V = logits.shape
    tokens, masked = tokens.clone(), masked.clone()
    committed = torch.zeros(N, B, dtype=torch.bool)
    for i in range(N):
        cand = {}
        for b in range(B):
            if masked[i, b]:
                row = logits[i, b].float()
                tok = int(torch.argmax(row))
                cand[b] = (tok, float(torch.softmax(row, 0)[tok]))
        order = sorted(cand, key=lambda b: (-cand[b][1], b))
        if rule == "all":
            chosen = set(cand)
        elif rule == "topk":
            chosen = set(order[:k])
        else:
            chosen = {b for b in cand if cand[b][1] >= dn.f32(threshold)} | set(order[:1])
        for b in chosen:
            tokens[i, b] = cand[b][0]
            masked[i, b] = False
            committed[i, b] = True
    return tokens, masked, committed


# ------------------------------------------------------------------------------------------------
# RNG
# ------------------------------------------------------------------------------------------------


def test_fmix32_torch_matches_python_integers():
    edge = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x9E3779B9, 12345678]
    rand = torch.randint(0, 2**32, (2000,), dtype=torch.int64).tolist()
    values = edge + rand
    as_i32 = torch.tensor([dn._as_i32(v) for v in values], dtype=torch.int32)
    got = (dn._fmix32_torch(as_i32).to(torch.int64) & 0xFFFFFFFF).tolist()
    assert got == [dn.fmix32(v) for v in values]


def test_row_keys_torch_matches_specification():
    key = dn.stream_key(1234, dn.STREAM_DENOISE)
    n = torch.arange(5).view(5, 1)
    pos = torch.arange(7).view(1, 7)
    got = dn.row_keys_torch(key, n, pos).to(torch.int64) & 0xFFFFFFFF
    want = [[dn.fmix32(dn.fmix32(key + i) + j) for j in range(7)] for i in range(5)]
    assert got.tolist() == want


@triton.jit
def _rng_probe_kernel(out_bits, out_g, key, V, BLOCK: tl.constexpr):
    n = tl.program_id(0)
    row = dn.row_key_tl(key, n, 3)
    offs = tl.arange(0, BLOCK)
    tl.store(out_bits + n, row.to(tl.int64))
    tl.store(out_g + n * V + offs, dn.gumbel_tl(row, offs), mask=offs < V)


def test_rng_kernel_matches_torch():
    """Same row keys bit for bit; same Gumbel noise to float rounding of ``log``."""
    if not (torch.cuda.is_available() or interpreting()):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    N, V = 4, 1000
    key = dn.stream_key(99, dn.STREAM_ACCEPT_SAMPLE)
    bits = torch.empty(N, dtype=torch.int64)
    g = torch.empty(N, V)
    _rng_probe_kernel[(N,)](bits, g, key, V, BLOCK=1024)
    rows = dn.row_keys_torch(key, torch.arange(N), torch.tensor(3))
    assert bits.tolist() == (rows.to(torch.int64) & 0xFFFFFFFF).tolist()
    torch.testing.assert_close(g, dn.gumbel_torch(rows, V), rtol=1e-6, atol=1e-6)


def test_gumbel_noise_has_gumbel_moments_and_tail():
    g = dn.gumbel_torch(dn.row_keys_torch(7, torch.arange(4), torch.tensor(0)), 250_000).flatten()
    assert abs(g.mean().item() - 0.5772157) < 0.01  # Euler-Mascheroni
    assert abs(g.var().item() - math.pi**2 / 6) < 0.02
    # Upper tail P(G > t) = 1 - exp(-exp(-t)): the series branch must not truncate it.
    for t in (5.0, 8.0):
        want = 1 - math.exp(-math.exp(-t))
        got = (g > t).float().mean().item()
        assert abs(got - want) < 5 * math.sqrt(want / g.numel()) + 1e-6


def test_gumbel_argmax_pruning_is_exact():
    """Drawing noise only near the row maximum gives exactly the dense Gumbel-max."""
    g = torch.Generator(device=torch.get_default_device()).manual_seed(1)
    V = 5000
    z = torch.randn(6, V, generator=g) * 2
    z[:, 100:300] += 30.0  # peaked rows: only ~200 candidates each
    z[5] = 0.0  # a flat row (dense branch of a single row is not taken: the batch decides)
    rows = dn.row_keys_torch(3, torch.arange(6), torch.tensor(0))
    dense = dn.gumbel_torch(rows, V).add_(z).argmax(-1)
    assert torch.equal(dn.gumbel_argmax_torch(z, rows), dense)
    assert torch.equal(dn.gumbel_argmax_torch(z[:5], rows[:5]), dense[:5])


# ------------------------------------------------------------------------------------------------
# Torch path semantics
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["threshold", "topk", "all"])
def test_torch_path_matches_oracle(rule):
    logits, tokens, masked = _random_case(16, 8, 300)
    want = _oracle(logits, tokens, masked, rule, threshold=0.3, k=3)
    t, m = tokens.clone(), masked.clone()
    committed = denoise_step_torch(logits, t, m, rule=rule, threshold=0.3, k=3)
    assert torch.equal(t, want[0]) and torch.equal(m, want[1]) and torch.equal(committed, want[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rule", ["threshold", "topk", "all"])
def test_kernel_matches_oracle(monkeypatch, rule, dtype):
    """The Triton kernel against the loop oracle directly (not only against the torch path), odd shapes."""
    logits, tokens, masked = _random_case(5, 7, 333, dtype=dtype, seed=11)
    want = _oracle(logits, tokens, masked, rule, threshold=0.3, k=3)
    t, m, _, committed = _run("triton", monkeypatch, logits, tokens, masked, rule=rule, threshold=0.3, k=3)
    assert torch.equal(t, want[0]) and torch.equal(m, want[1]) and torch.equal(committed, want[2])


def test_rules_commit_counts_and_leave_unmasked_alone():
    logits, tokens, masked = _random_case(32, 8, 50)
    masked[0] = False  # a block with nothing masked: a no-op
    masked[1] = True
    for rule, kw in [("threshold", dict(threshold=0.999)), ("topk", dict(k=3)), ("all", {})]:
        t, m = tokens.clone(), masked.clone()
        conf = torch.full((32, 8), -7.0)
        committed = denoise_step_torch(logits, t, m, rule=rule, confidence=conf, **kw)
        n_masked = masked.sum(1)
        if rule == "threshold":  # at least one per block with masked positions
            assert torch.all(committed.sum(1) >= (n_masked > 0).long())
        elif rule == "topk":
            assert torch.equal(committed.sum(1), n_masked.clamp(max=3))
        else:
            assert torch.equal(committed, masked)
        assert not committed[~masked].any()
        assert torch.equal(t[~committed], tokens[~committed])
        assert torch.equal(m, masked & ~committed)
        assert torch.all(conf[~masked] == -7.0) and torch.all((conf[masked] > 0) & (conf[masked] <= 1))


def test_torch_path_is_deterministic_per_seed():
    logits, tokens, masked = _random_case(8, 8, 500)
    outs = []
    for seed in (5, 5, 6):
        t, m = tokens.clone(), masked.clone()
        denoise_step_torch(logits, t, m, temperature=1.0, seed=seed, rule="all")
        outs.append(t)
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def _chi2_critical(df, z=3.719):
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.719 is p = 1e-4."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_sampling_follows_softmax_at_temperature():
    """20k blocks of one position, rule "all": the picked token ~ softmax(logits / T).
    The negative control (the same samples against softmax(logits), T = 1) must fail."""
    N, V, T = 20_000, 6, 0.7
    row = torch.tensor([1.5, 1.0, 0.2, 0.0, -0.5, -2.0])
    logits = row.expand(N, 1, V).contiguous()
    tokens = torch.zeros(N, 1, dtype=torch.long)
    denoise_step_torch(logits, tokens, torch.ones(N, 1, dtype=torch.bool), temperature=T,
                       seed=2024, rule="all")
    counts = torch.bincount(tokens.flatten(), minlength=V).double()
    limit = _chi2_critical(V - 1)
    assert _chi2(counts, torch.softmax(row.double() / T, 0)) < limit
    assert _chi2(counts, torch.softmax(row.double(), 0)) > limit


# ------------------------------------------------------------------------------------------------
# Kernel against the torch path
# ------------------------------------------------------------------------------------------------


def _compare(monkeypatch, logits, tokens, masked, **kw):
    ref = _run("torch", monkeypatch, logits, tokens, masked, **kw)
    ker = _run("triton", monkeypatch, logits, tokens, masked, **kw)
    return ref, ker


@pytest.mark.parametrize("rule", ["threshold", "topk", "all"])
@pytest.mark.parametrize("N,B,V", [(4, 4, 1000), (3, 5, 4099), (5, 1, 999)])
def test_kernel_matches_torch_greedy(monkeypatch, rule, N, B, V):
    logits, tokens, masked = _random_case(N, B, V, seed=N * V)
    (t0, m0, c0, k0), (t1, m1, c1, k1) = _compare(monkeypatch, logits, tokens, masked, rule=rule,
                                                  threshold=0.4, k=2)
    assert torch.equal(t0, t1) and torch.equal(m0, m1) and torch.equal(k0, k1)
    torch.testing.assert_close(c0, c1, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_torch_low_precision(monkeypatch, dtype):
    logits, tokens, masked = _random_case(3, 4, 777, dtype=dtype)
    (t0, m0, c0, k0), (t1, m1, c1, k1) = _compare(monkeypatch, logits, tokens, masked, rule="topk",
                                                  k=2)
    assert torch.equal(t0, t1) and torch.equal(m0, m1) and torch.equal(k0, k1)
    torch.testing.assert_close(c0, c1, rtol=1e-5, atol=1e-7)


def test_kernel_matches_torch_large_vocab(monkeypatch):
    """V = 151936 spans many vocabulary chunks; ties straddle chunk boundaries."""
    logits, tokens, masked = _random_case(1, 16, V_LARGE, dtype=torch.bfloat16, p_masked=0.6)
    masked[0, 0] = True
    logits[0, 0, 150_000] = 30.0  # tied maxima in different chunks: the lowest index wins
    logits[0, 0, 40_000] = 30.0
    logits[0, 0, 40_001] = 30.0
    (t0, m0, c0, k0), (t1, m1, c1, k1) = _compare(monkeypatch, logits, tokens, masked,
                                                  threshold=0.5)
    assert t0[0, 0] == 40_000 and k0[0, 0]
    assert torch.equal(t0, t1) and torch.equal(m0, m1) and torch.equal(k0, k1)
    torch.testing.assert_close(c0, c1, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("rule", ["threshold", "topk"])
def test_kernel_ties_go_to_lowest_index_and_position(monkeypatch, rule):
    """Argmax ties inside a row, and equal confidences across positions (identical rows)."""
    V = 1000
    logits, tokens, masked = _random_case(2, 6, V, seed=3)
    masked[:] = True
    logits[:, :, [5, 17, 700]] = 30.0  # three-way argmax tie: token 5, confidence ~1/3
    logits[0, 1, 17] = logits[0, 1, 700] = 40.0  # two-way tie: token 17, confidence ~1/2 ...
    logits[0, 4] = logits[0, 1]  # ... at positions 1 and 4 alike: position 1 wins
    (t0, m0, c0, k0), (t1, m1, c1, k1) = _compare(monkeypatch, logits, tokens, masked, rule=rule,
                                                  threshold=0.99, k=1)
    assert k0.tolist() == [[False, True, False, False, False, False],
                           [True, False, False, False, False, False]]
    assert t0[0, 1] == 17 and t0[1, 0] == 5
    assert torch.equal(t0, t1) and torch.equal(m0, m1) and torch.equal(k0, k1)
    assert torch.equal(c0, c1) or torch.allclose(c0, c1, rtol=1e-6)


@pytest.mark.parametrize("T,peaked", [(0.7, False), (1.5, False), (1.0, True)])
def test_kernel_matches_torch_sampled(monkeypatch, T, peaked):
    """Both paths draw the same Gumbel noise, so they sample the same tokens; ``log`` may differ
    by an ulp between libraries, which can flip a near-tie, hence >= 99% rather than all.
    ``peaked`` logits make the torch path draw noise only near each row's maximum."""
    logits, tokens, masked = _random_case(8, 8, 3000, seed=11, p_masked=1.0)
    if peaked:
        logits[..., 1000:1100] += 25.0
    (t0, m0, c0, k0), (t1, m1, c1, k1) = _compare(monkeypatch, logits, tokens, masked,
                                                  temperature=T, seed=77, rule="all")
    assert (t0 == t1).float().mean() >= 0.99
    assert torch.equal(k0, k1)
    same = t0 == t1
    torch.testing.assert_close(c0[same], c1[same], rtol=1e-5, atol=1e-7)
    t2, *_ = _run("triton", monkeypatch, logits, tokens, masked, temperature=T, seed=77, rule="all")
    assert torch.equal(t1, t2)  # deterministic for a seed


def test_kernel_writes_in_place_through_strided_views(monkeypatch):
    """tokens/masked as column slices of larger buffers; logits a slice of a longer sequence."""
    N, B, V = 3, 4, 500
    logits_full, _, _ = _random_case(N, 10, V, seed=5)
    logits = logits_full[:, 3 : 3 + B]
    for backend in ("torch", "triton"):
        monkeypatch.setenv("D3D_KERNELS", backend)
        buf = torch.full((N, 12), -5, dtype=torch.long)
        mbuf = torch.zeros(N, 12, dtype=torch.bool)
        mbuf[:, 4 : 4 + B] = True
        conf_buf = torch.zeros(N, 12)
        committed = denoise_step(logits, buf[:, 4 : 4 + B], mbuf[:, 4 : 4 + B], rule="all",
                                 confidence=conf_buf[:, 4 : 4 + B])
        assert committed.all()
        assert torch.equal(buf[:, 4 : 4 + B], logits.argmax(-1))
        assert not mbuf.any()
        assert torch.all(buf[:, :4] == -5) and torch.all(buf[:, 4 + B :] == -5)
        assert torch.all(conf_buf[:, :4] == 0) and torch.all(conf_buf[:, 4 : 4 + B] > 0)


def test_kernel_noop_and_empty(monkeypatch):
    logits, tokens, masked = _random_case(2, 3, 100)
    masked[:] = False
    (t0, m0, _, k0), (t1, m1, _, k1) = _compare(monkeypatch, logits, tokens, masked)
    assert torch.equal(t1, tokens) and not k1.any() and torch.equal(k0, k1)
    monkeypatch.setenv("D3D_KERNELS", "triton")
    empty = denoise_step(torch.zeros(0, 3, 10), torch.zeros(0, 3, dtype=torch.long),
                         torch.zeros(0, 3, dtype=torch.bool))
    assert empty.shape == (0, 3)


# ------------------------------------------------------------------------------------------------
# Argument checks
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,name",
    [
        (dict(logits=torch.zeros(2, 3)), "logits"),
        (dict(logits=torch.zeros(2, 3, 5, dtype=torch.long)), "logits"),
        (dict(tokens=torch.zeros(2, 4, dtype=torch.long)), "tokens"),
        (dict(tokens=torch.zeros(2, 3, dtype=torch.int32)), "tokens"),
        (dict(masked=torch.zeros(2, 3, dtype=torch.uint8)), "masked"),
        (dict(confidence=torch.zeros(2, 3, dtype=torch.float16)), "confidence"),
        (dict(rule="greedy"), "rule"),
        (dict(temperature=-1.0), "temperature"),
        (dict(rule="topk", k=0), "k"),
        (dict(threshold=1.5), "threshold"),
    ],
)
def test_bad_arguments_name_the_argument(change, name):
    args = dict(logits=torch.zeros(2, 3, 5), tokens=torch.zeros(2, 3, dtype=torch.long),
                masked=torch.ones(2, 3, dtype=torch.bool))
    args.update(change)
    pos = [args.pop(k) for k in ("logits", "tokens", "masked")]
    with pytest.raises(ValueError, match=name):
        denoise_step(*pos, **args)
