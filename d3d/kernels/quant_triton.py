"""Weight-only int8/int5/int4 matmul for GPUs in Triton, its launcher and its torch reference.

    y [M, N] = x [M, K] @ W^T,  W dequantized tile by tile in registers from row-major blocks:
    int8 w = q * s;  int5 w = (q - 16) * s;  int4 w = q * s - m   (one s, m per group of G along k)

The formats are those of ``d3d.cpu.quant`` (the CPU kernel's, row-major instead of in panels: q int8
[N, K] or uint8 [N, K/2] with k even in the low nibble, int5's high bits [N, K/8], s/m [N, K/G]).
Each program computes a BLOCK_M x BLOCK_N tile of y, walking k in blocks of BLOCK_K: it loads the
bytes, unpacks them, scales them in fp32 and multiplies with ``tl.dot`` (fp32 accumulation). A GPU
streams each weight byte once per pass, so decoding reads 2-4x fewer bytes than in bf16.

Torch reference: ``quant_linear_torch`` (``kernels.quant.dequantize`` + matmul); the launcher
checks shapes by name. Measured on a GPU by ``python -m bench gpu`` (stage "quant").
"""

from __future__ import annotations

import torch

from . import tl, triton
from .quant import dequantize


@triton.jit
def _quant_mm_kernel(x_ptr, q_ptr, h_ptr, s_ptr, m_ptr, y_ptr, M, N, K, G,
                     BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    groups = K // G
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        x = x.to(tl.float32)
        wmask = (rn[:, None] < N) & kmask[None, :]
        if BITS == 8:
            q = tl.load(q_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0).to(tl.float32)
        else:
            byte = tl.load(q_ptr + rn[:, None] * (K // 2) + rk[None, :] // 2, mask=wmask, other=0).to(tl.int32)
            q = (byte >> ((rk[None, :] % 2) * 4)) & 15
            if BITS == 5:
                hb = tl.load(h_ptr + rn[:, None] * (K // 8) + rk[None, :] // 8, mask=wmask, other=0).to(tl.int32)
                q = q + ((hb >> (rk[None, :] % 8)) & 1) * 16 - 16
            q = q.to(tl.float32)
        sidx = rn[:, None] * groups + rk[None, :] // G
        w = q * tl.load(s_ptr + sidx, mask=wmask, other=0.0).to(tl.float32)
        if BITS == 4:
            w = w - tl.load(m_ptr + sidx, mask=wmask, other=0.0).to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")  # fp32 products, not TF32
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def quant_linear_triton(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, bits: int,
                        h: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (fp32/fp16/bf16) @ W^T -> fp32 [M, N], W row-major as in ``d3d.cpu.quant`` (see the module)."""
    if bits not in (4, 5, 8):
        raise ValueError(f"quant_linear_triton: bits must be 8, 5 or 4, got {bits}")
    if x.dim() != 2:
        raise ValueError(f"quant_linear_triton: x must be 2-D [M, K], got {tuple(x.shape)}")
    M, K = x.shape
    N = q.shape[0]
    kq = K if bits == 8 else K // 2
    if q.shape != (N, kq) or q.dtype != (torch.int8 if bits == 8 else torch.uint8):
        raise ValueError(f"quant_linear_triton: q must be {'int8' if bits == 8 else 'uint8'} [N, {kq}] for x "
                         f"{tuple(x.shape)}, got {q.dtype} {tuple(q.shape)}")
    if s.dim() != 2 or s.shape[0] != N or s.shape[1] == 0 or K % s.shape[1]:
        raise ValueError(f"quant_linear_triton: scales {tuple(s.shape)} must be [{N}, K/G] with G dividing K={K}")
    if (m is None) != (bits != 4) or (m is not None and m.shape != s.shape):
        raise ValueError("quant_linear_triton: int4 needs mins shaped like the scales, int8/int5 none")
    if (h is None) != (bits != 5) or (h is not None and h.shape != (N, K // 8)):
        raise ValueError(f"quant_linear_triton: int5 needs high bits [{N}, {K // 8}], the others none")
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    if M == 0 or N == 0:
        return y
    BLOCK_M = 16 if M <= 16 else 64
    BLOCK_N, BLOCK_K = 64, 32
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    x, q, s = x.contiguous(), q.contiguous(), s.contiguous()
    _quant_mm_kernel[grid](x, q, q if h is None else h.contiguous(), s, s if m is None else m.contiguous(), y, M, N, K,
                           K // s.shape[1], BITS=bits, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y


def quant_linear_torch(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None, bits: int,
                       h: torch.Tensor | None = None) -> torch.Tensor:
    """The torch reference: dequantize to fp32, then one matmul."""
    return x.float() @ dequantize(q, s, m, bits, h).to(x.device).T


__all__ = ["quant_linear_triton", "quant_linear_torch"]
