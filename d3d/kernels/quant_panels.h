// What quant_gemm.cpp (fp32 activations) and quant_vnni.cpp (int8 activations) share: the panel
// layout of a quantized matrix, its argument checks, and moving to a panel. See quant_gemm.cpp for
// the formats (int8 / int5 / int4 with group scales) and the layout.
#pragma once
#include <torch/extension.h>
#include <immintrin.h>

namespace d3d_quant {

constexpr int64_t NR = 16;    // columns per panel
constexpr int64_t GROUP = 4;  // panels a thread takes at a time (the widest tile)

struct Weights {
    const uint8_t* q;   // panel 0 of this tile
    const uint8_t* h;   // int5's high bit or int6's high two bits (else null)
    const void* s;      // scales: fp32, fp16, or (two-level) int8 factors
    const void* m;      // int4's mins (else null), typed like the scales
    int64_t qstride;    // bytes from one panel to the next
    int64_t hstride;
    int64_t sstride;    // scale elements from one panel to the next
    int64_t group;      // G
    bool half;          // fp16 scales and mins
    bool two;           // two-level: s = sd * s8, m = md * m8 (K-quant super-blocks: fp16 d, int8 factor)
    const uint16_t* sd; // two-level: fp16 [P, K / (G * per_d), 16] (else null)
    const uint16_t* md; // two-level int4: the mins' fp16 factors
    int64_t dstride;    // elements of sd from one panel to the next
    int64_t per_d;      // groups per element of sd

    Weights at(int64_t p) const {  // the same matrix from panel p on
        Weights w = *this;
        w.q += p * qstride;
        if (h) w.h += p * hstride;
        const int64_t off = p * sstride * (two ? 1 : half ? 2 : 4);
        w.s = static_cast<const uint8_t*>(s) + off;
        if (m) w.m = static_cast<const uint8_t*>(m) + off;
        if (sd) w.sd += p * dstride;
        if (md) w.md += p * dstride;
        return w;
    }
};

// The panels of x [M, K] @ W^T, checked by name (``who``: the calling function). Two-level scales
// (non-empty ``sd``): s and m int8 factors, sd and md their fp16 factors per ``per_d`` groups.
// int6 (the int8-activation kernels, ``six``): q as int4's nibbles, h its high two bits [P, K/8, 32] (quant_vnni.cpp);
// two-level scales (Q6_K's) or one per group (the greedy head's bounds, d3d.cpu.greedy_head).
inline Weights checked(const char* who, const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h,
                       const torch::Tensor& s, const torch::Tensor& m, int64_t N, int64_t G, int64_t bits,
                       const torch::Tensor& sd = torch::Tensor(), const torch::Tensor& md = torch::Tensor(),
                       bool six = false) {
    TORCH_CHECK(bits == 8 || bits == 5 || bits == 4 || (six && bits == 6), who, ": bits must be 8, ",
                (six ? "6, " : ""), "5 or 4, got ", bits);
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
                who, ": x must be a 2-D fp32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
    const int64_t K = x.size(1), KQ = bits == 8 ? K : K / 2;  // int4, int5, int6: nibbles
    TORCH_CHECK(q.dim() == 3 && q.size(2) == NR && q.is_contiguous() &&
                    q.scalar_type() == (bits == 8 ? torch::kInt8 : torch::kUInt8) && q.size(1) == KQ,
                who, ": q must be contiguous panels [P, ", KQ, ", 16] of ", (bits == 8 ? "int8" : "uint8"), ", got ",
                q.sizes(), " ", q.scalar_type());
    const int64_t P = q.size(0);
    TORCH_CHECK(G > 0 && K % G == 0 && (bits == 8 || G % 2 == 0),
                who, ": group ", G, " must divide K=", K, (bits != 8 ? " and be even" : ""));
    const bool half = s.scalar_type() == torch::kHalf, two = sd.defined() && sd.numel() > 0;
    TORCH_CHECK(s.dim() == 3 && s.is_contiguous() &&
                    (two ? s.scalar_type() == torch::kInt8 : half || s.scalar_type() == torch::kFloat32) &&
                    s.size(0) == P && s.size(1) == K / G && s.size(2) == NR,
                who, ": scales must be contiguous ", (two ? "int8 (two-level)" : "fp32 or fp16"), " [", P, ", ", K / G,
                ", 16], got ", s.sizes(), " ", s.scalar_type());
    if (two) {
        TORCH_CHECK(sd.dim() == 3 && sd.is_contiguous() && sd.scalar_type() == torch::kHalf && sd.size(0) == P &&
                        sd.size(2) == NR && sd.size(1) > 0 && (K / G) % sd.size(1) == 0,
                    who, ": two-level scale factors must be contiguous fp16 [", P, ", D, 16] with D dividing ", K / G,
                    ", got ", sd.sizes(), " ", sd.scalar_type());
        if (bits == 4)
            TORCH_CHECK(md.sizes() == sd.sizes() && md.is_contiguous() && md.scalar_type() == torch::kHalf,
                        who, ": two-level int4 needs min factors shaped like the scale factors, got ", md.sizes());
    }
    if (bits == 4)
        TORCH_CHECK(m.sizes() == s.sizes() && m.is_contiguous() && m.scalar_type() == s.scalar_type(),
                    who, ": mins must be contiguous and shaped and typed like the scales, got ", m.sizes());
    if (bits == 6)
        TORCH_CHECK(h.dim() == 3 && h.is_contiguous() && h.scalar_type() == torch::kUInt8 && h.size(0) == P &&
                        h.size(1) == K / 8 && h.size(2) == 32 && K % 8 == 0,
                    who, ": int6's high bits must be contiguous uint8 [", P, ", ", K / 8, ", 32], got ", h.sizes());
    if (bits == 5)
        TORCH_CHECK(h.dim() == 3 && h.is_contiguous() && h.scalar_type() == torch::kUInt8 && h.size(0) == P &&
                        h.size(1) == K / 2 && h.size(2) == 4,
                    who, ": high bits must be contiguous uint8 [", P, ", ", K / 2, ", 4], got ", h.sizes());
    TORCH_CHECK(N > (P - 1) * NR && N <= P * NR, who, ": N=", N, " does not fit ", P, " panels");
    return Weights{reinterpret_cast<const uint8_t*>(q.data_ptr()),
                   bits == 5 || bits == 6 ? h.data_ptr<uint8_t>() : nullptr, s.data_ptr(),
                   bits == 4 ? m.data_ptr() : nullptr, KQ * NR, bits == 5 ? (K / 2) * 4 : bits == 6 ? (K / 8) * 32 : 0,
                   s.size(1) * NR, G, half, two,
                   two ? reinterpret_cast<const uint16_t*>(sd.data_ptr()) : nullptr,
                   two && bits == 4 ? reinterpret_cast<const uint16_t*>(md.data_ptr()) : nullptr,
                   two ? sd.size(1) * NR : 0, two ? (K / G) / sd.size(1) : 1};
}

#pragma GCC push_options
#pragma GCC target("avx2,f16c")
// 8 scales (or mins) of a panel from element i on, as fp32.
template <bool HALF>
inline __m256 load8(const void* p, int64_t i) {
    if constexpr (HALF)
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    else
        return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
// 16 scales (or mins) of a panel from element i on, as fp32.
template <bool HALF>
inline __m512 load16(const void* p, int64_t i) {
    if constexpr (HALF)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
    else
        return _mm512_loadu_ps(static_cast<const float*>(p) + i);
}

#pragma GCC pop_options

}  // namespace d3d_quant
