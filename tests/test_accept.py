"""d3d.kernels.accept: the torch path against a loop oracle (T = 0), the Triton kernel
(interpreted on CPU) against the torch path, stop handling, and losslessness at T > 0
(chi-square against the target distribution, with deliberately biased rules as negative controls).

Kernel tests force the kernel with D3D_KERNELS=triton; shapes are small because the interpreter
costs about a millisecond per operation per program (about 10 ms per sequence here).
"""

from __future__ import annotations

import math

import pytest
import torch

from d3d.kernels.accept import AcceptResult, accept, accept_torch

V_LARGE = 151936

pytestmark = pytest.mark.usefixtures("kernel_device")  # GPU when present: tests/conftest.py


def _oracle_greedy(draft, logits):
    """Plain loops, T = 0: (accept_len, bonus) per sequence."""
    N, B, _ = logits.shape
    acc, bonus = [], []
    for i in range(N):
        a = 0
        while a < B - 1 and int(draft[i, a]) == int(torch.argmax(logits[i, a].float())):
            a += 1
        acc.append(a)
        bonus.append(int(torch.argmax(logits[i, a].float())))
    return torch.tensor(acc), torch.tensor(bonus)


def _greedy_case(N, B, V, *, dtype=torch.float32, p_keep=0.8, seed=0):
    """Drafts that follow the target argmax for a random number of steps, then diverge."""
    g = torch.Generator(device=torch.get_default_device()).manual_seed(seed)
    logits = (torch.randn(N, B, V, generator=g) * 2).to(dtype)
    draft = logits[:, : B - 1].float().argmax(-1)
    wrong = torch.rand(N, B - 1, generator=g) > p_keep
    draft = torch.where(wrong, torch.randint(0, V, (N, B - 1), generator=g), draft)
    return draft, logits


def _both(monkeypatch, *args, **kw):
    out = []
    for backend in ("torch", "triton"):
        monkeypatch.setenv("D3D_KERNELS", backend)
        out.append(accept(*args, **kw))
    return out


def _assert_same(r0: AcceptResult, r1: AcceptResult):
    for name, a, b in zip(AcceptResult._fields, r0, r1):
        assert torch.equal(a, b), name


def _check_consistent(res: AcceptResult, draft):
    """tokens = d_1..d_a, bonus, -1...; num_tokens = a + 1 without stops."""
    N, B = res.tokens.shape
    for i in range(N):
        a = int(res.accept_len[i])
        assert res.tokens[i, :a].tolist() == draft[i, :a].tolist()
        assert int(res.tokens[i, a]) == int(res.bonus[i])
        assert torch.all(res.tokens[i, a + 1 :] == -1)


# ------------------------------------------------------------------------------------------------
# Greedy (T = 0)
# ------------------------------------------------------------------------------------------------


def test_torch_path_matches_oracle_greedy():
    draft, logits = _greedy_case(64, 6, 50)
    res = accept_torch(draft, logits)
    acc, bonus = _oracle_greedy(draft, logits)
    assert torch.equal(res.accept_len, acc) and torch.equal(res.bonus, bonus)
    assert torch.equal(res.num_tokens, acc + 1) and not res.stop_hit.any()
    _check_consistent(res, draft)


@pytest.mark.parametrize(
    "N,B,V,dtype",
    [(6, 4, 1000, torch.float32), (5, 6, 4099, torch.bfloat16), (4, 3, 333, torch.float16),
     (5, 1, 1000, torch.float32)],
)
def test_kernel_matches_torch_greedy(monkeypatch, N, B, V, dtype):
    draft, logits = _greedy_case(N, B, V, dtype=dtype, seed=V)
    r0, r1 = _both(monkeypatch, draft, logits)
    _assert_same(r0, r1)
    acc, bonus = _oracle_greedy(draft, logits)
    assert torch.equal(r1.accept_len, acc) and torch.equal(r1.bonus, bonus)
    _check_consistent(r1, draft)


def test_kernel_greedy_all_and_none_accepted(monkeypatch):
    B, V = 5, 700
    _, logits = _greedy_case(4, B, V, seed=1)
    target = logits.argmax(-1)
    draft = target[:, : B - 1].clone()
    draft[2:, 0] = (draft[2:, 0] + 1) % V  # sequences 2, 3: the first draft is wrong
    r0, r1 = _both(monkeypatch, draft, logits)
    _assert_same(r0, r1)
    assert r1.accept_len.tolist() == [B - 1, B - 1, 0, 0]
    assert r1.bonus.tolist() == [target[0, B - 1], target[1, B - 1], target[2, 0], target[3, 0]]


def test_kernel_greedy_single_position(monkeypatch):
    """B = 1: no drafts, the bonus is the target's token at the anchor."""
    logits = torch.randn(3, 1, 4099)
    r0, r1 = _both(monkeypatch, torch.zeros(3, 0, dtype=torch.long), logits)
    _assert_same(r0, r1)
    assert r1.accept_len.tolist() == [0, 0, 0]
    assert torch.equal(r1.bonus, logits[:, 0].argmax(-1))
    assert torch.equal(r1.tokens[:, 0], r1.bonus) and r1.num_tokens.tolist() == [1, 1, 1]


def test_kernel_greedy_ties_pick_lowest_index(monkeypatch):
    """A draft equal to the *higher* of two tied maxima is rejected; the bonus is the lower."""
    B, V = 3, 1000
    logits = torch.randn(2, B, V)
    logits[:, 0, [30, 900]] = 50.0
    logits[:, 1, [4, 600]] = 50.0
    logits[:, 2, 8] = 50.0
    draft = torch.tensor([[30, 4], [900, 4]])
    r0, r1 = _both(monkeypatch, draft, logits)
    _assert_same(r0, r1)
    assert r1.accept_len.tolist() == [2, 0]
    assert r1.bonus.tolist() == [8, 30]


def test_kernel_greedy_large_vocab(monkeypatch):
    """V = 151936 (many chunks), with a tie across chunks in one row."""
    draft, logits = _greedy_case(2, 4, V_LARGE, dtype=torch.bfloat16, p_keep=0.7, seed=3)
    logits[1, 0] = -3.0
    logits[1, 0, [130_000, 20_000]] = 5.0
    draft[1, 0] = 20_000
    r0, r1 = _both(monkeypatch, draft, logits)
    _assert_same(r0, r1)
    assert r1.accept_len[1] >= 1
    acc, bonus = _oracle_greedy(draft, logits)
    assert torch.equal(r1.accept_len, acc) and torch.equal(r1.bonus, bonus)


def test_kernel_strided_logits(monkeypatch):
    """Logits sliced out of a longer target pass (non-contiguous in N and B)."""
    full = torch.randn(3, 9, 512)
    logits = full[:, 2:6]
    draft = logits[:, :3].argmax(-1)
    draft[0, 1] = (draft[0, 1] + 1) % 512
    r0, r1 = _both(monkeypatch, draft, logits)
    _assert_same(r0, r1)
    assert r1.accept_len.tolist() == [1, 3, 3]


def test_draft_probs_ignored_at_zero_temperature(monkeypatch):
    draft, logits = _greedy_case(4, 4, 100)
    q = torch.softmax(torch.randn(4, 3, 100), -1)
    r0, r1 = _both(monkeypatch, draft, logits, draft_probs=q)
    _assert_same(r0, r1)
    _assert_same(r1, accept_torch(draft, logits))


# ------------------------------------------------------------------------------------------------
# Stop tokens
# ------------------------------------------------------------------------------------------------


def test_stop_tokens_end_the_emitted_run(monkeypatch):
    B, V = 5, 64
    logits = torch.randn(4, B, V)
    stop = 63
    logits[:, :, stop] = -100.0  # the target never *picks* the stop token by itself ...
    target = logits.argmax(-1)
    draft = target[:, : B - 1].clone()
    logits[0, 1, stop] = 100.0  # seq 0: the target says stop at row 1, the draft agrees
    draft[0, 1] = stop
    logits[1, 2, stop] = 100.0  # seq 1: the target says stop at row 2, the draft does not: bonus
    draft[1, 3] = (draft[1, 3] + 1) % V
    draft[2, 0] = (draft[2, 0] + 1) % V  # seq 2: rejected at once, no stop
    # seq 3: everything accepted, no stop
    for stop_ids in (torch.tensor([stop, 7000]), [stop]):
        r0, r1 = _both(monkeypatch, draft, logits, stop_ids=stop_ids)
        _assert_same(r0, r1)
        assert r1.accept_len.tolist() == [4, 2, 0, 4]
        assert r1.num_tokens.tolist() == [2, 3, 1, 5]
        assert r1.stop_hit.tolist() == [True, True, False, False]
        assert r1.tokens[0, 1] == stop and r1.bonus[1] == stop


# ------------------------------------------------------------------------------------------------
# Sampling: kernel against the torch path
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_q", [False, True])
def test_kernel_matches_torch_sampled(monkeypatch, with_q):
    """Both paths draw identical noise, so they agree sequence by sequence; ``log``/``exp`` may
    differ by an ulp between libraries and flip a near-tie, hence >= 99% rather than all."""
    N, B, V = 48, 4, 300
    g = torch.Generator(device=torch.get_default_device()).manual_seed(8)
    logits = torch.randn(N, B, V, generator=g) * 4
    q = torch.softmax(logits[:, : B - 1] / 0.9 + 0.5 * torch.randn(N, B - 1, V, generator=g), -1)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(N, B - 1)
    kw = dict(temperature=0.9, seed=4242, draft_probs=q if with_q else None, stop_ids=[3])
    r0, r1 = _both(monkeypatch, draft, logits, **kw)
    same = torch.ones(N, dtype=torch.bool)
    for a, b in zip(r0, r1):
        same &= (a == b).view(N, -1).all(1)
    assert same.float().mean() >= 0.99
    assert torch.bincount(r0.accept_len, minlength=B).min() >= 2  # every accept length occurs
    _check_consistent(r1, draft)
    monkeypatch.setenv("D3D_KERNELS", "triton")
    _assert_same(r1, accept(draft, logits, **kw))  # deterministic for a seed


def test_kernel_sampled_large_vocab(monkeypatch):
    N, B, V = 1, 3, V_LARGE
    logits = torch.randn(N, B, V) * 4
    q = torch.softmax(logits[:, : B - 1] * 0.8, -1)
    draft = q.argmax(-1)
    for dp in (None, q):
        r0, r1 = _both(monkeypatch, draft, logits, temperature=1.0, seed=1, draft_probs=dp)
        _assert_same(r0, r1)


# ------------------------------------------------------------------------------------------------
# Losslessness
# ------------------------------------------------------------------------------------------------

T_LOSSLESS = 0.8
# Target logits per row, the same for every sequence (row j is the target's distribution for the
# token after d_j whatever the prefix; that is all the property needs).
TARGET = torch.tensor([[2.0, 1.2, 0.5, 0.0, -0.5, -1.0],
                       [0.0, 1.5, -1.0, 0.8, 0.3, -0.2],
                       [-0.5, 0.0, 0.5, 1.0, 1.5, 2.0]])
# A drafter distribution far from the target, so that biased rules show.
DRAFTER = torch.tensor([[0.05, 0.05, 0.10, 0.10, 0.20, 0.50],
                        [0.40, 0.05, 0.30, 0.05, 0.10, 0.10]])


def _chi2_critical(df, z=3.719):
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.719 is p = 1e-4."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _emitted_chi2(tokens, accept_len, probs):
    """Chi-square of emitted tokens against the target: for each row k, the sequences that
    reached it (accept_len >= k) emit a token that must be distributed as ``probs[k]``."""
    stat, df = 0.0, 0
    for k in range(probs.shape[0]):
        reached = accept_len >= k
        n = int(reached.sum())
        if n == 0:
            continue
        counts = torch.bincount(tokens[reached, k], minlength=probs.shape[1]).double()
        expected = probs[k].double() * n
        stat += float(((counts - expected) ** 2 / expected).sum())
        df += probs.shape[1] - 1
    return stat, df


def _lossless_case(N, B, with_q, seed, greedy_drafts=False):
    """Drafts sampled from DRAFTER (with q); one-hot drafts sampled from the target at T = 1 (a
    reasonable drafter, so that acceptances are common) or, with ``greedy_drafts``, its argmax
    (one token per row: the biased control then shows with fewer samples)."""
    g = torch.Generator(device=torch.get_default_device()).manual_seed(seed)
    logits = TARGET[:B].expand(N, B, -1).contiguous()
    q = DRAFTER if with_q else torch.softmax(TARGET, -1)
    q = q[: B - 1].expand(N, B - 1, -1).contiguous()
    if greedy_drafts:
        draft = q.argmax(-1)
    else:
        draft = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=g).view(N, B - 1)
    return draft, logits, (q if with_q else None)


def _biased(draft, logits, q, seed):
    """Deliberately wrong rules, vectorised. One-hot drafts: accept d with probability p(d) but
    resample the bonus from all of p (d included). With q: accept with min(1, p/q) but sample the
    bonus from p instead of the residual. Returns (tokens [N, B], accept_len [N])."""
    g = torch.Generator(device=torch.get_default_device()).manual_seed(seed)
    N, B, V = logits.shape
    p = torch.softmax(logits / T_LOSSLESS, -1)
    p_d = p[:, : B - 1].gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    ratio = p_d if q is None else (p_d / q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)).clamp(max=1)
    acc = (torch.rand(N, B - 1, generator=g) < ratio).long().cumprod(1).sum(1)
    bonus = torch.multinomial(p.gather(1, acc.view(N, 1, 1).expand(N, 1, V)).squeeze(1), 1,
                              generator=g).squeeze(1)
    tokens = torch.cat([draft, draft.new_full((N, 1), -1)], 1)
    tokens[torch.arange(N), acc] = bonus
    return tokens, acc


@pytest.mark.parametrize("with_q", [False, True])
def test_torch_path_is_lossless(with_q):
    """20k sequences, B = 3: every emitted token is distributed as the target's p at T.
    The biased rule on the same drafts must fail the same threshold."""
    N, B = 20_000, 3
    draft, logits, q = _lossless_case(N, B, with_q, seed=10)
    probs = torch.softmax(TARGET[:B] / T_LOSSLESS, -1)
    res = accept_torch(draft, logits, temperature=T_LOSSLESS, seed=123, draft_probs=q)
    stat, df = _emitted_chi2(res.tokens, res.accept_len, probs)
    assert stat < _chi2_critical(df), (stat, df)
    assert torch.bincount(res.accept_len).min() > 1000  # every outcome is well represented
    bad_stat, bad_df = _emitted_chi2(*_biased(draft, logits, q, seed=11), probs)
    assert bad_stat > _chi2_critical(bad_df), (bad_stat, bad_df)


@pytest.mark.parametrize("with_q", [False, True])
def test_kernel_is_lossless(monkeypatch, with_q):
    """The kernel under the interpreter runs ~10 ms per sequence, so this uses N = 1000 and B = 2
    (the 20k-sample test runs on the torch path, which the kernel matches sequence by sequence).
    The biased rule on the same 1000 drafts must still fail the threshold."""
    N, B = 1000, 2
    draft, logits, q = _lossless_case(N, B, with_q, seed=20, greedy_drafts=not with_q)
    probs = torch.softmax(TARGET[:B] / T_LOSSLESS, -1)
    monkeypatch.setenv("D3D_KERNELS", "triton")
    res = accept(draft, logits, temperature=T_LOSSLESS, seed=321, draft_probs=q)
    stat, df = _emitted_chi2(res.tokens, res.accept_len, probs)
    assert stat < _chi2_critical(df), (stat, df)
    bad_stat, bad_df = _emitted_chi2(*_biased(draft, logits, q, seed=21), probs)
    assert bad_stat > _chi2_critical(bad_df), (bad_stat, bad_df)


# ------------------------------------------------------------------------------------------------
# Argument checks
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,name",
    [
        (dict(logits=torch.zeros(2, 4)), "logits"),
        (dict(logits=torch.zeros(2, 4, 10, dtype=torch.int64)), "logits"),
        (dict(draft=torch.zeros(2, 4, dtype=torch.long)), "draft"),
        (dict(draft=torch.zeros(2, 3, dtype=torch.int32)), "draft"),
        (dict(draft_probs=torch.zeros(2, 3, 9)), "draft_probs"),
        (dict(draft_probs=torch.zeros(2, 3, 10, dtype=torch.long)), "draft_probs"),
        (dict(stop_ids=torch.zeros(2, 2, dtype=torch.long)), "stop_ids"),
        (dict(temperature=float("nan")), "temperature"),
    ],
)
def test_bad_arguments_name_the_argument(change, name):
    args = dict(draft=torch.zeros(2, 3, dtype=torch.long), logits=torch.zeros(2, 4, 10))
    args.update(change)
    draft, logits = args.pop("draft"), args.pop("logits")
    with pytest.raises(ValueError, match=name):
        accept(draft, logits, **args)
