"""Plain loop-based oracles for the kernels, used only by tests and benches.

They favour the obvious over the fast: Python loops over sequences, masks built entry by entry,
float64 arithmetic, GQA by repeating kv heads. Nothing here is called on a hot path.
"""

from __future__ import annotations

import math

import torch

__all__ = ["packed_attention_reference", "bd3_training_mask_reference", "skinny_matmul_reference",
           "quant_matmul_reference", "quant_vnni_reference",
           "quant_vnni_two_level_reference", "rms_norm_reference", "rope_write_reference"]


def packed_attention_reference(
    q, k, v, k_cache, v_cache, cu_seqlens, cache_lens, group_ids, cache_rows=None, scale=None, reach=None
) -> torch.Tensor:
    """Packed block-causal attention (docs/design.md §4), per sequence with an explicit mask, in float64.

    Same arguments as ``d3d.kernels.attention.packed_attention``; returns float64 [T, H, D].
    For query i of sequence n the visible keys are every cached key of its cache row and the
    new keys j of the same sequence with ``group_ids[j] <= group_ids[i]``; with ``reach``, those with
    ``group_ids[j] == group_ids[i]`` or ``group_ids[j] < reach[i]``.
    """
    T, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    cu = [int(x) for x in cu_seqlens]
    N = len(cu) - 1
    rows = list(range(N)) if cache_rows is None else [int(x) for x in cache_rows]
    groups = [int(x) for x in group_ids]
    reaches = groups if reach is None else [int(x) for x in reach]
    out = torch.zeros(T, H, D, dtype=torch.float64, device="cpu")  # the oracle runs on the CPU

    for n in range(N):
        start, end, c = cu[n], cu[n + 1], int(cache_lens[n])
        L = end - start
        if L == 0:
            continue
        # all keys of sequence n, [Hkv, c + L, D]
        if k is None:
            keys = k_cache[rows[n], :, : c + L]
            values = v_cache[rows[n], :, : c + L]
        else:
            new_k, new_v = k[start:end].transpose(0, 1), v[start:end].transpose(0, 1)
            if c > 0:
                keys = torch.cat([k_cache[rows[n], :, :c], new_k], dim=1)
                values = torch.cat([v_cache[rows[n], :, :c], new_v], dim=1)
            else:
                keys, values = new_k, new_v
        repeat = H // keys.shape[0]
        keys = keys.double().cpu().repeat_interleave(repeat, dim=0)  # [H, c+L, D]
        values = values.double().cpu().repeat_interleave(repeat, dim=0)

        # the visibility mask, entry by entry: [L, c + L]
        def sees(i, j):  # query i, new key j (indices into the packed tokens)
            return groups[j] == groups[i] or groups[j] < reaches[i]

        visible = [[True] * c + [sees(start + i, start + j) for j in range(L)] for i in range(L)]
        visible = torch.tensor(visible, device="cpu")
        query = q[start:end].double().cpu().transpose(0, 1)  # [H, L, D]
        scores = torch.einsum("hld,hsd->hls", query, keys) * scale
        weights = torch.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
        out[start:end] = torch.einsum("hls,hsd->lhd", weights, values)
    return out.to(q.device)


def bd3_training_mask_reference(L: int, block_size: int) -> torch.Tensor:
    """The BD3 training mask over ``x_t ⊕ x_0`` built entry by entry (bool [2L, 2L])."""
    mask = torch.zeros(2 * L, 2 * L, dtype=torch.bool, device="cpu")
    for i in range(2 * L):
        for j in range(2 * L):
            q_clean, k_clean = i >= L, j >= L
            q_blk, k_blk = (i % L) // block_size, (j % L) // block_size
            if q_clean == k_clean and q_blk == k_blk:
                mask[i, j] = True
            elif not q_clean and k_clean and k_blk < q_blk:
                mask[i, j] = True
            elif q_clean and k_clean and k_blk <= q_blk:
                mask[i, j] = True
    return mask


def skinny_matmul_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The fma chain of ``d3d.kernels.skinny``, emulated: for each (m, n), acc = fp32(acc + x[m, k] w[n, k])
    for k = 0 .. K-1 from acc = 0 (the product of two fp32 is exact in float64; the sum is rounded to
    float64 and then to fp32, which can differ from one fma's single rounding only when the float64
    sum falls exactly halfway between two fp32 numbers, about 2^-29 of the time). x [M, K], w [N, K]
    fp32; returns fp32 [M, N]."""
    x64, w64 = x.double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float64)
    for k in range(x.shape[1]):
        acc = (acc + x64[:, k, None] * w64[None, :, k]).float().double()
    return acc.float()


def quant_matmul_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None,
                           bits: int, h: torch.Tensor | None = None) -> torch.Tensor:
    """The int8/int5/int4 kernel of ``d3d.kernels.quant``, by loops: each weight dequantized element by
    element (int8: w = fl(q s); int5: fl((q - 16) s); int4: fl(fl(q s) - m)), then the fp32 fma chain
    of ``skinny_matmul_reference``. q row-major [N, K] int8 or [N, K/2] uint8 (k even in the low
    nibble), int5's high bits h [N, K/8] (bit i of byte b: k = 8 b + i), s/m [N, K/G]."""
    N, K = q.shape[0], x.shape[1]
    group = K // s.shape[1]
    w = torch.empty(N, K, dtype=torch.float32)
    for n in range(N):
        for k in range(K):
            if bits == 8:
                qv = int(q[n, k])
            else:
                byte = int(q[n, k // 2])
                qv = byte & 15 if k % 2 == 0 else byte >> 4
            if bits == 5:
                qv = qv + 16 * ((int(h[n, k // 8]) >> (k % 8)) & 1) - 16
            v = torch.tensor(qv, dtype=torch.float32) * s[n, k // group].float()
            if m is not None:
                v = v - m[n, k // group].float()
            w[n, k] = v
    return skinny_matmul_reference(x, w)


def quant_vnni_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, bits: int,
                         h: torch.Tensor | None = None, sd: torch.Tensor | None = None,
                         md: torch.Tensor | None = None) -> torch.Tensor:
    """The int8-activation kernel of ``d3d.kernels.quant.matmul_vnni``, by loops over groups: per row
    and group a of A inputs (32; 16 where the weights' group is 16) qx = round(x / sx), sx = max|x| / 127
    (fp32), I = sum (q - offset) qx exactly, acc = fp32(acc + I fl(s sx)) (one rounding, as an fma),
    int4 then acc = fp32(acc - m X) with X the fp32 sum of x over the group in k order. Two-level
    scales (``s``, ``m`` int8 factors per group, ``sd``, ``md`` per super-block of 256):
    ``quant_vnni_two_level_reference``."""
    if sd is not None:
        return quant_vnni_two_level_reference(x, q, s, m, sd, md, bits)
    from .quant import dequantize

    N, K = q.shape[0], x.shape[1]
    G = K // s.shape[1]
    A = 16 if G == 16 else 32
    # the integer weights: dequantize with unit scales (int4: q; int5: q - 16; int8: q)
    qi = dequantize(q, torch.ones_like(s, dtype=torch.float32), None, bits, h).double()
    out = torch.empty(x.shape[0], N, dtype=torch.float32)
    for r in range(x.shape[0]):
        acc = torch.zeros(N, dtype=torch.float32)
        for a in range(K // A):
            xa = x[r, a * A:(a + 1) * A]
            sx = (xa.abs().max() / 127).float()
            qx = torch.round(xa / sx) if sx > 0 else torch.zeros_like(xa)
            i = (qi[:, a * A:(a + 1) * A] * qx.double()).sum(1)  # exact: integers
            g = a * A // G
            scale = (s[:, g].float() * sx).float()
            acc = (acc.double() + i * scale.double()).float()
            if m is not None:
                total = torch.zeros((), dtype=torch.float32)
                for v in xa:
                    total = (total + v).float()
                acc = (acc.double() - m[:, g].float().double() * total.double()).float()
        out[r] = acc
    return out


def quant_vnni_two_level_reference(x: torch.Tensor, q: torch.Tensor, f: torch.Tensor, mf: torch.Tensor | None,
                                   d: torch.Tensor, dm: torch.Tensor | None, bits: int) -> torch.Tensor:
    """``matmul_vnni`` on K-quant scales (int6 held as int8 values ``q``, or int4), by loops: per row and
    super-block b of 256 inputs sx = max|x| / 127; per group g, the largest e <= 3 with max_g |x| 2^e <=
    max|x|, qx = round(x / (sx / 2^e)), I_g = sum q qx and B_g = sum qx (integers); T = sum_g (f[n, g] I_g)
    << (3 - e), M = sum_g mf[n, g] (B_g << (3 - e)) exactly; acc = fp32(acc + fp32(T) fl(d[n, b] sx / 8)),
    int4 then acc = fp32(acc - fp32(M) fl(dm[n, b] sx / 8))."""
    from .quant import dequantize

    N, K = q.shape[0], x.shape[1]
    G, S = K // f.shape[1], 256
    qi = dequantize(q, torch.ones(f.shape, dtype=torch.float32), None, bits).long()  # int4: q; int8: q
    out = torch.empty(x.shape[0], N, dtype=torch.float32)
    for r in range(x.shape[0]):
        acc = torch.zeros(N, dtype=torch.float32)
        for b in range(K // S):
            xb = x[r, b * S:(b + 1) * S]
            top = xb.abs().max()
            sx = (top / 127).float()
            T, M = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long)
            for i in range(S // G):
                g, xg = b * S // G + i, xb[i * G:(i + 1) * G]
                e = 0
                while e < 3 and xg.abs().max() * float(2 << e) <= top:
                    e += 1
                qx = (torch.round(xg / (sx / float(1 << e))) if sx > 0 else torch.zeros_like(xg)).long()
                T += (f[:, g].long() * (qi[:, b * S + i * G:b * S + (i + 1) * G] * qx).sum(1)) << (3 - e)
                if mf is not None:
                    M += mf[:, g].long() * (qx.sum() << (3 - e))
            s8 = sx * 0.125
            acc = (acc.double() + T.float().double() * (d[:, b].float() * s8).float().double()).float()
            if mf is not None:
                acc = (acc.double() - M.float().double() * (dm[:, b].float() * s8).float().double()).float()
        out[r] = acc
    return out


def argmax_reference(x: torch.Tensor) -> torch.Tensor:
    """``glue_cpu.argmax``, element by element: each row's first maximum, a NaN counting as the maximum."""
    rows = x.reshape(-1, x.shape[-1])
    out = []
    for r in range(rows.shape[0]):
        best, at = None, 0
        for i, v in enumerate(rows[r].tolist()):
            if math.isnan(v):
                at = i
                break
            if best is None or v > best:
                best, at = v, i
        out.append(at)
    return torch.tensor(out, dtype=torch.int64).view(x.shape[:-1])


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``glue_cpu.rms_norm`` in float64, row by row and element by element: x / sqrt(mean(x^2) + eps) * w."""
    rows = x.double().reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    for r in range(rows.shape[0]):
        ss = 0.0
        for v in rows[r].tolist():
            ss += v * v
        inv = 1.0 / math.sqrt(ss / rows.shape[1] + eps)
        for i, v in enumerate(rows[r].tolist()):
            out[r, i] = v * inv * (1.0 if weight is None else float(weight[i]))
    return out.view(x.shape)


def rope_write_reference(qkv, cos, sin, k_cache, v_cache, rows, slots, heads: int, kv_heads: int) -> torch.Tensor:
    """``glue_cpu.rope_write`` token by token and head by head, rounded to fp32 where the kernel rounds:
    q rotated; k rotated and v written into the caches at (rows[t], slots[t])."""
    T, D = cos.shape
    q = torch.empty(T, heads, D)
    x = qkv.float().view(T, heads + 2 * kv_heads, D)
    for t in range(T):
        for h in range(heads + kv_heads):
            rolled = torch.cat([x[t, h, D // 2:], x[t, h, :D // 2]])
            # fl(x cos) rounded, then its sum with rolled * sin rounded once (an fma; exact in float64 first)
            rotated = ((x[t, h] * cos[t]).double() + rolled.double() * sin[t].double()).float()
            if h < heads:
                q[t, h] = rotated
            else:
                k_cache[rows[t], h - heads, slots[t]] = rotated
        for j in range(kv_heads):
            v_cache[rows[t], j, slots[t]] = x[t, heads + kv_heads + j]
    return q
