// Weight-only quantized matmul for the few-row passes of decoding on AVX2 CPUs: y = x W^T, with
// W stored as int8 (w = q * s) or int4 (w = q * s - m), one scale s (and min m) per group of G
// consecutive k of a row, and x, y in fp32.
//
// Why: on a CPU, decoding streams every weight once per pass, so a pass costs weight bytes over
// memory bandwidth; int8 and int4 blocks read 3.5-6x fewer bytes than fp32.
//
// Layout: the same 16-column panels as skinny_gemm.cpp. int8: Q [P, K, 16] (panel p, step k holds
// q[16p .. 16p+15, k]); int4: Q [P, K/2, 16] bytes, k even in the low nibble and k + 1 in the high
// one; S (and M) [P, K/G, 16] fp32. Columns past N are zero (q = s = m = 0 gives w = 0).
//
// Numerics: each weight is dequantized in registers to exactly the fp32 value w = fl(q * s)
// (int8) or w = fl(fl(q * s) - m) (int4; built with -ffp-contract=off so that no fma merges the
// two), and then y[m, n] is the fma chain acc = fma(x[m, k], w[n, k], acc), k ascending from 0:
// bit for bit what skinny_gemm.cpp computes on the dequantized fp32 matrix. So every row of an
// M-row product equals the 1-row product of that row, for every M, tile and thread (row
// invariance keeps speculative decoding token-exact), and the loop oracle is the fp32 one.
//
// Tiles: one row would leave the fma latency (4 cycles, two 8-wide chains) as the limit, so a
// tile of MR rows covers NP panels: 1 x 4 and 2 x 2 keep 8 independent chains; 3-4 rows take one
// panel. Each chain is still one output's k-ordered sum, so the tile shape changes nothing.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int64_t NR = 16;    // columns per panel
constexpr int64_t KC = 256;   // k per block: a panel slice stays in L1 while every row tile uses it
constexpr int64_t GROUP = 4;  // panels a thread takes at a time (the widest tile)
constexpr int64_t AHEAD = 32;  // k steps prefetched ahead (as skinny_gemm.cpp)

// The dequantized weights of one k step of one panel: w0 = columns 0-7, w1 = 8-15.
inline void dequant8(const int8_t* q, const float* s, __m256& w0, __m256& w1) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_loadu_ps(s));
    w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), _mm256_loadu_ps(s + 8));
}

inline void dequant4(__m128i nibbles, const float* s, const float* m, __m256& w0, __m256& w1) {
    w0 = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles)), _mm256_loadu_ps(s)),
                       _mm256_loadu_ps(m));
    w1 = _mm256_sub_ps(
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nibbles, 8))), _mm256_loadu_ps(s + 8)),
        _mm256_loadu_ps(m + 8));
}

struct Weights {
    const uint8_t* q;  // panel 0 of this tile
    const float* s;
    const float* m;     // int4 only
    int64_t qstride;    // bytes from one panel to the next
    int64_t sstride;    // floats from one panel's scales to the next
    int64_t group;      // G
};

template <int MR, int NP, bool INT4>
void tile(const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy, int64_t k0, int64_t k1,
          const int64_t* cols) {
    __m256 acc[MR][NP][2];
    alignas(32) float buf[NR];
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p) {
            float* yp = y + m * ldy + p * NR;
            if (k0 == 0) {
                acc[m][p][0] = acc[m][p][1] = _mm256_setzero_ps();
            } else if (cols[p] == NR) {
                acc[m][p][0] = _mm256_loadu_ps(yp);
                acc[m][p][1] = _mm256_loadu_ps(yp + 8);
            } else {
                for (int64_t j = 0; j < NR; ++j) buf[j] = j < cols[p] ? yp[j] : 0.f;
                acc[m][p][0] = _mm256_load_ps(buf);
                acc[m][p][1] = _mm256_load_ps(buf + 8);
            }
        }
    int64_t g = k0 / W.group, next = (g + 1) * W.group;  // the group of k, and where the next one starts
    const float* s = W.s + g * NR;
    const float* mn = INT4 ? W.m + g * NR : nullptr;
    const int64_t step = INT4 ? 2 : 1;  // int4: one byte vector holds k and k + 1 (G is even)
    for (int64_t k = k0; k < k1; k += step) {
        if (k == next) {
            next += W.group;
            s += NR;
            if constexpr (INT4) mn += NR;
        }
        const uint8_t* q = W.q + (INT4 ? k / 2 : k) * NR;
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
            _mm_prefetch(reinterpret_cast<const char*>(q + p * W.qstride + AHEAD * NR), _MM_HINT_T0);
            if constexpr (INT4) {
                const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + p * W.qstride));
                const __m128i lo4 = _mm_set1_epi8(0x0F);
                __m256 w[2][2];
                dequant4(_mm_and_si128(v, lo4), s + p * W.sstride, mn + p * W.sstride, w[0][0], w[0][1]);
                dequant4(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), s + p * W.sstride, mn + p * W.sstride, w[1][0],
                         w[1][1]);
#pragma GCC unroll 6
                for (int m = 0; m < MR; ++m) {  // k, then k + 1: the chain stays in k order
                    const __m256 xa = _mm256_broadcast_ss(x + m * ldx + k);
                    const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k + 1);
                    acc[m][p][0] = _mm256_fmadd_ps(xa, w[0][0], acc[m][p][0]);
                    acc[m][p][1] = _mm256_fmadd_ps(xa, w[0][1], acc[m][p][1]);
                    acc[m][p][0] = _mm256_fmadd_ps(xb, w[1][0], acc[m][p][0]);
                    acc[m][p][1] = _mm256_fmadd_ps(xb, w[1][1], acc[m][p][1]);
                }
            } else {
                __m256 w0, w1;
                dequant8(reinterpret_cast<const int8_t*>(q + p * W.qstride), s + p * W.sstride, w0, w1);
#pragma GCC unroll 6
                for (int m = 0; m < MR; ++m) {
                    const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
                    acc[m][p][0] = _mm256_fmadd_ps(xb, w0, acc[m][p][0]);
                    acc[m][p][1] = _mm256_fmadd_ps(xb, w1, acc[m][p][1]);
                }
            }
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p) {
            float* yp = y + m * ldy + p * NR;
            if (cols[p] == NR) {
                _mm256_storeu_ps(yp, acc[m][p][0]);
                _mm256_storeu_ps(yp + 8, acc[m][p][1]);
            } else {
                _mm256_store_ps(buf, acc[m][p][0]);
                _mm256_store_ps(buf + 8, acc[m][p][1]);
                for (int64_t j = 0; j < cols[p]; ++j) yp[j] = buf[j];
            }
        }
}

template <bool INT4>
void tile_of(int64_t mr, int64_t np, const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy,
             int64_t k0, int64_t k1, const int64_t* cols) {
    if (mr == 1 && np == 4) return tile<1, 4, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
    if (mr == 1 && np == 2) return tile<1, 2, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
    if (mr == 2 && np == 2) return tile<2, 2, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
    switch (mr) {  // np == 1
        case 4: return tile<4, 1, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
        case 3: return tile<3, 1, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
        case 2: return tile<2, 1, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
        default: return tile<1, 1, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
    }
}

// One group of up to GROUP panels starting at panel p0, every row, one k block.
template <bool INT4>
void panels(const float* x, int64_t M, int64_t K, const Weights& W0, int64_t p0, int64_t np_group, int64_t N,
            float* y, int64_t k0, int64_t k1) {
    // Row tiles: 1 or 2 rows span several panels; more rows go in tiles of at most 4, as even as possible.
    for (int64_t m = 0; m < M;) {
        const int64_t left = M - m, tiles = (left + 3) / 4, mr = left <= 2 ? left : (left + tiles - 1) / tiles;
        const int64_t np = mr == 1 ? 4 : mr == 2 ? 2 : 1;
        for (int64_t p = 0; p < np_group;) {
            const int64_t n = np <= np_group - p ? np : 1;  // the group's ragged end: one panel at a time
            int64_t cols[GROUP];
            for (int64_t i = 0; i < n; ++i) cols[i] = std::min(NR, N - (p0 + p + i) * NR);
            Weights W = W0;
            W.q += (p0 + p) * W.qstride;
            W.s += (p0 + p) * W.sstride;
            if constexpr (INT4) W.m += (p0 + p) * W.sstride;
            tile_of<INT4>(mr, n, x + m * K, K, W, y + m * N + (p0 + p) * NR, N, k0, k1, cols);
            p += n;
        }
        m += mr;
    }
}


// ---------------------------------------------------------------- AVX-512: one zmm per panel row
// The same numbers as above (each lane does the same mul, sub and fma), with 32 registers: a tile
// holds up to 12 rows, so the dequantization of a panel is shared by more rows of a verification pass.
#pragma GCC push_options
#pragma GCC target("avx512f")

inline __m512 dq8_512(const uint8_t* q, const float* s) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), _mm512_loadu_ps(s));
}

inline __m512 dq4_512(__m128i nibbles, const float* s, const float* m) {
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nibbles)), _mm512_loadu_ps(s)),
                         _mm512_loadu_ps(m));
}

template <int MR, int NP, bool INT4>
void tile512(const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy, int64_t k0, int64_t k1,
             const int64_t* cols) {
    __m512 acc[MR][NP];
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p) {
            const __mmask16 mask = static_cast<__mmask16>((1u << cols[p]) - 1);
            acc[m][p] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + m * ldy + p * NR);
        }
    int64_t g = k0 / W.group, next = (g + 1) * W.group;
    const float* s = W.s + g * NR;
    const float* mn = INT4 ? W.m + g * NR : nullptr;
    const int64_t step = INT4 ? 2 : 1;
    for (int64_t k = k0; k < k1; k += step) {
        if (k == next) {
            next += W.group;
            s += NR;
            if constexpr (INT4) mn += NR;
        }
        const uint8_t* q = W.q + (INT4 ? k / 2 : k) * NR;
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
            _mm_prefetch(reinterpret_cast<const char*>(q + p * W.qstride + AHEAD * NR), _MM_HINT_T0);
            if constexpr (INT4) {
                const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + p * W.qstride));
                const __m128i lo4 = _mm_set1_epi8(0x0F);
                const __m512 wa = dq4_512(_mm_and_si128(v, lo4), s + p * W.sstride, mn + p * W.sstride);
                const __m512 wb = dq4_512(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), s + p * W.sstride,
                                          mn + p * W.sstride);
#pragma GCC unroll 12
                for (int m = 0; m < MR; ++m) {
                    acc[m][p] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), wa, acc[m][p]);
                    acc[m][p] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k + 1]), wb, acc[m][p]);
                }
            } else {
                const __m512 w = dq8_512(q + p * W.qstride, s + p * W.sstride);
#pragma GCC unroll 12
                for (int m = 0; m < MR; ++m)
                    acc[m][p] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), w, acc[m][p]);
            }
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p)
            _mm512_mask_storeu_ps(y + m * ldy + p * NR, static_cast<__mmask16>((1u << cols[p]) - 1), acc[m][p]);
}

template <bool INT4>
void tile_of512(int64_t mr, int64_t np, const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy,
                int64_t k0, int64_t k1, const int64_t* cols) {
#define D3D_TILE(R, P) \
    if (mr == R && np == P) return tile512<R, P, INT4>(x, ldx, W, y, ldy, k0, k1, cols);
    D3D_TILE(1, 4) D3D_TILE(2, 4) D3D_TILE(3, 2) D3D_TILE(4, 2) D3D_TILE(5, 2) D3D_TILE(6, 2) D3D_TILE(7, 2)
    D3D_TILE(8, 2) D3D_TILE(1, 1) D3D_TILE(2, 1) D3D_TILE(3, 1) D3D_TILE(4, 1) D3D_TILE(5, 1) D3D_TILE(6, 1)
    D3D_TILE(7, 1) D3D_TILE(8, 1) D3D_TILE(9, 1) D3D_TILE(10, 1) D3D_TILE(11, 1) D3D_TILE(12, 1)
#undef D3D_TILE
}

template <bool INT4>
void panels512(const float* x, int64_t M, int64_t K, const Weights& W0, int64_t p0, int64_t np_group, int64_t N,
               float* y, int64_t k0, int64_t k1) {
    // Row tiles of at most 12 rows, as even as possible; up to 8 rows span 2-4 panels (8+ chains).
    for (int64_t m = 0; m < M;) {
        const int64_t left = M - m, tiles = (left + 11) / 12, mr = (left + tiles - 1) / tiles;
        const int64_t np = mr <= 2 ? 4 : mr <= 8 ? 2 : 1;
        for (int64_t p = 0; p < np_group;) {
            const int64_t n = np <= np_group - p ? np : 1;
            int64_t cols[GROUP];
            for (int64_t i = 0; i < n; ++i) cols[i] = std::min(NR, N - (p0 + p + i) * NR);
            Weights W = W0;
            W.q += (p0 + p) * W.qstride;
            W.s += (p0 + p) * W.sstride;
            if constexpr (INT4) W.m += (p0 + p) * W.sstride;
            tile_of512<INT4>(mr, n, x + m * K, K, W, y + m * N + (p0 + p) * NR, N, k0, k1, cols);
            p += n;
        }
        m += mr;
    }
}

#pragma GCC pop_options

}  // namespace

// y [M, N] = x [M, K] @ W^T, W given as panels (q, s, m) with group size G; bits 8 or 4.
// isa: 512 (AVX-512), 256 (AVX2) or 0 (AVX-512 where the CPU has it). Both give the same bits.
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& s,
                     const torch::Tensor& m, int64_t N, int64_t G, int64_t bits, int64_t isa) {
    TORCH_CHECK(bits == 8 || bits == 4, "quant_gemm.matmul: bits must be 8 or 4, got ", bits);
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
                "quant_gemm.matmul: x must be a 2-D fp32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
    const int64_t K = x.size(1);
    TORCH_CHECK(q.dim() == 3 && q.size(2) == NR && q.is_contiguous() &&
                    q.scalar_type() == (bits == 8 ? torch::kInt8 : torch::kUInt8) &&
                    q.size(1) == (bits == 8 ? K : K / 2),
                "quant_gemm.matmul: q must be contiguous panels [P, ", (bits == 8 ? K : K / 2), ", 16] of ",
                (bits == 8 ? "int8" : "uint8"), ", got ", q.sizes(), " ", q.scalar_type());
    const int64_t P = q.size(0);
    TORCH_CHECK(G > 0 && K % G == 0 && (bits == 8 || G % 2 == 0),
                "quant_gemm.matmul: group ", G, " must divide K=", K, (bits == 4 ? " and be even" : ""));
    TORCH_CHECK(s.dim() == 3 && s.is_contiguous() && s.scalar_type() == torch::kFloat32 && s.size(0) == P &&
                    s.size(1) == K / G && s.size(2) == NR,
                "quant_gemm.matmul: scales must be contiguous fp32 [", P, ", ", K / G, ", 16], got ", s.sizes());
    if (bits == 4)
        TORCH_CHECK(m.sizes() == s.sizes() && m.is_contiguous() && m.scalar_type() == torch::kFloat32,
                    "quant_gemm.matmul: mins must be contiguous fp32 like the scales, got ", m.sizes());
    TORCH_CHECK(N > (P - 1) * NR && N <= P * NR, "quant_gemm.matmul: N=", N, " does not fit ", P, " panels");
    auto xc = x.contiguous();
    const int64_t M = xc.size(0);
    if (M == 0 || K == 0) return torch::zeros({M, N}, x.options());
    auto y = torch::empty({M, N}, x.options());
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const Weights W{reinterpret_cast<const uint8_t*>(q.data_ptr()), s.data_ptr<float>(),
                    bits == 4 ? m.data_ptr<float>() : nullptr, q.size(1) * NR, s.size(1) * NR, G};
    const bool wide = isa == 512 || (isa == 0 && __builtin_cpu_supports("avx512f"));
    TORCH_CHECK(!wide || __builtin_cpu_supports("avx512f"), "quant_gemm.matmul: isa=512 on a CPU without AVX-512");
    // Threads split groups of panels: each weight is read from memory by one thread, once.
    const int64_t groups = (P + GROUP - 1) / GROUP;
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t p0 = g * GROUP, np = std::min(GROUP, P - p0);
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                const int64_t k1 = std::min(K, k0 + KC);
                if (wide && bits == 4)
                    panels512<true>(xp, M, K, W, p0, np, N, yp, k0, k1);
                else if (wide)
                    panels512<false>(xp, M, K, W, p0, np, N, yp, k0, k1);
                else if (bits == 4)
                    panels<true>(xp, M, K, W, p0, np, N, yp, k0, k1);
                else
                    panels<false>(xp, M, K, W, p0, np, N, yp, k0, k1);
            }
        }
    });
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("matmul", &matmul, "x [M, K] fp32 @ W^T, W as int8/int4 panels with group scales (and mins) -> y [M, N]");
}
