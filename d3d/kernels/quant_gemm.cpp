// Weight-only quantized matmul for the few-row passes of decoding on x86 CPUs: y = x W^T, with x, y
// fp32 and W in one of three formats, one scale s (and for int4 a min m) per group of G
// consecutive k of a row, s and m stored as fp32 or fp16:
//
//   int8   w = fl(q * s),          q in [-128, 127]
//   int5   w = fl((q - 16) * s),   q in [0, 31]: a nibble and a high bit (llama.cpp's Q5_0)
//   int4   w = fl(fl(q * s) - m),  q in [0, 15]
//
// Why: on a CPU, decoding streams every weight once per pass, so a pass costs weight bytes over
// memory bandwidth: int8, int5 and int4 read 3.5-6x fewer bytes than fp32.
//
// Layout: the 16-column panels of skinny_gemm.cpp. int8: Q [P, K, 16] (panel p, step k holds
// q[16p .. 16p+15, k]); int4/int5: Q [P, K/2, 16] bytes, k even in the low nibble, k + 1 in the high
// one; int5's high bits H [P, K/2, 4] bytes, one little-endian word per k pair (bit j: column j at
// k, bit 16 + j: at k + 1); S (and M) [P, K/G, 16]. Columns past N are zero.
//
// Numerics: each weight is dequantized in registers to exactly the fp32 value above (built with
// -ffp-contract=off, so no fma merges int4's mul and sub), then y[m, n] is the fma chain
// acc = fma(x[m, k], w[n, k], acc), k ascending from 0: bit for bit what skinny_gemm.cpp computes
// on the dequantized fp32 matrix. So every row of an M-row product equals the 1-row product of
// that row, for every M, tile, thread and instruction set (row invariance keeps speculative decoding
// token-exact), and the loop oracle is the fp32 one.
//
// Tiles: one row would leave the fma latency as the limit, so a tile of MR rows covers NP panels
// (8+ independent chains); each chain is still one output's k-ordered sum, so the shape of a tile
// changes nothing.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>

#include "quant_panels.h"

namespace {

using d3d_quant::GROUP;
using d3d_quant::NR;
using d3d_quant::load8;
using d3d_quant::load16;
using d3d_quant::Weights;
constexpr int64_t KC = 256;   // k per block: a panel slice stays in L1 while every row tile uses it
constexpr int64_t AHEAD = 32;  // k steps prefetched ahead (as skinny_gemm.cpp)

// Bytes of one k step (int8) or k pair (int4/int5) of a panel, as 16 signed bytes; lo/hi: k and k + 1.
template <int BITS>
inline void unpack(const uint8_t* q, __m128i& lo, __m128i& hi) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    if constexpr (BITS == 8) {
        lo = v;
    } else {
        const __m128i low4 = _mm_set1_epi8(0x0F);
        lo = _mm_and_si128(v, low4);
        hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    }
}

// Byte j of the result is 0x10 where bit j of ``bits`` is set (int5's high bit, AVX2).
inline __m128i high_bits(uint32_t bits) {
    const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const __m128i b = _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(bits)),
                                       _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, sel), sel), _mm_set1_epi8(0x10));
}


// 16 signed bytes -> the dequantized weights of 16 columns (w0: columns 0-7, w1: 8-15); s/m: the group's.
template <bool MIN>
inline void dequant(__m128i b, const __m256 (&s)[2], const __m256 (&m)[2], __m256& w0, __m256& w1) {
    w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s[0]);
    w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), s[1]);
    if constexpr (MIN) {
        w0 = _mm256_sub_ps(w0, m[0]);
        w1 = _mm256_sub_ps(w1, m[1]);
    }
}

template <int MR, int NP>
inline void fma_rows(__m256 (&acc)[MR][NP][2], int p, const float* x, int64_t ldx, int64_t k, __m256 w0, __m256 w1) {
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) {  // full unrolling keeps acc in registers
        const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
        acc[m][p][0] = _mm256_fmadd_ps(xb, w0, acc[m][p][0]);
        acc[m][p][1] = _mm256_fmadd_ps(xb, w1, acc[m][p][1]);
    }
}

template <int MR, int NP, int BITS, bool HALF>
void tile(const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy, int64_t k0, int64_t k1,
          const int64_t* cols) {
    __m256 acc[MR][NP][2];
    alignas(32) float buf[NR];
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p) {
            float* yp = y + m * ldy + p * NR;
            if (k0 == 0) {
                acc[m][p][0] = acc[m][p][1] = _mm256_setzero_ps();
            } else {
                for (int64_t j = 0; j < NR; ++j) buf[j] = j < cols[p] ? yp[j] : 0.f;
                acc[m][p][0] = _mm256_load_ps(buf);
                acc[m][p][1] = _mm256_load_ps(buf + 8);
            }
        }
    // The group's scales (and mins) are converted once and kept while its G steps of k go by.
    int64_t next = (k0 / W.group + 1) * W.group, off = k0 / W.group * NR;
    __m256 sv[NP][2], mv[NP][2];
    auto load_group = [&]() {
        for (int p = 0; p < NP; ++p)
            for (int h = 0; h < 2; ++h) {
                sv[p][h] = load8<HALF>(W.s, p * W.sstride + off + 8 * h);
                mv[p][h] = BITS == 4 ? load8<HALF>(W.m, p * W.sstride + off + 8 * h) : sv[p][h];
            }
    };
    load_group();
    constexpr int64_t step = BITS == 8 ? 1 : 2;  // int4/int5: one byte vector holds k and k + 1 (G is even)
    for (int64_t k = k0; k < k1; k += step) {
        if (k == next) {
            next += W.group;
            off += NR;
            load_group();
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
            const uint8_t* q = W.q + p * W.qstride + (BITS == 8 ? k : k / 2) * NR;
            _mm_prefetch(reinterpret_cast<const char*>(q + AHEAD * NR), _MM_HINT_T0);
            __m128i lo, hi;
            unpack<BITS>(q, lo, hi);
            if constexpr (BITS == 5) {
                uint32_t bits;
                std::memcpy(&bits, W.h + p * W.hstride + k * 2, 4);
                const __m128i sixteen = _mm_set1_epi8(16);
                lo = _mm_sub_epi8(_mm_or_si128(lo, high_bits(bits & 0xFFFF)), sixteen);
                hi = _mm_sub_epi8(_mm_or_si128(hi, high_bits(bits >> 16)), sixteen);
            }
            __m256 w0, w1;
            dequant<BITS == 4>(lo, sv[p], mv[p], w0, w1);
            fma_rows<MR, NP>(acc, p, x, ldx, k, w0, w1);
            if constexpr (BITS != 8) {  // k + 1: the chain stays in k order
                dequant<BITS == 4>(hi, sv[p], mv[p], w0, w1);
                fma_rows<MR, NP>(acc, p, x, ldx, k + 1, w0, w1);
            }
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p) {
            _mm256_store_ps(buf, acc[m][p][0]);
            _mm256_store_ps(buf + 8, acc[m][p][1]);
            float* yp = y + m * ldy + p * NR;
            for (int64_t j = 0; j < cols[p]; ++j) yp[j] = buf[j];
        }
}

template <int BITS, bool HALF>
void tile_of(int64_t mr, int64_t np, const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy,
             int64_t k0, int64_t k1, const int64_t* cols) {
#define D3D_TILE(R, P) \
    if (mr == R && np == P) return tile<R, P, BITS, HALF>(x, ldx, W, y, ldy, k0, k1, cols);
    D3D_TILE(1, 4) D3D_TILE(1, 2) D3D_TILE(2, 2) D3D_TILE(1, 1) D3D_TILE(2, 1) D3D_TILE(3, 1) D3D_TILE(4, 1)
#undef D3D_TILE
}

// ---------------------------------------------------------------- AVX-512: one zmm per panel row
// The same numbers (each lane does the same conversions, mul, sub and fma), with 32 registers: a
// tile holds up to 12 rows, so a panel's dequantization serves more rows of a verification pass.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

template <bool MIN>
inline __m512 dequant512(__m128i b, __m512 scale, __m512 min) {
    __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), scale);
    if constexpr (MIN) w = _mm512_sub_ps(w, min);
    return w;
}

template <int MR, int NP>
inline void fma_rows512(__m512 (&acc)[MR][NP], int p, const float* x, int64_t ldx, int64_t k, __m512 w) {
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) acc[m][p] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), w, acc[m][p]);
}

template <int MR, int NP, int BITS, bool HALF>
void tile512(const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy, int64_t k0, int64_t k1,
             const int64_t* cols) {
    __m512 acc[MR][NP];
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p) {
            const __mmask16 mask = static_cast<__mmask16>((1u << cols[p]) - 1);
            acc[m][p] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + m * ldy + p * NR);
        }
    // The group's scales (and mins) stay in registers while its G steps of k go by.
    int64_t next = (k0 / W.group + 1) * W.group, off = k0 / W.group * NR;
    __m512 sv[NP], mv[NP];
    for (int p = 0; p < NP; ++p) {
        sv[p] = load16<HALF>(W.s, p * W.sstride + off);
        mv[p] = BITS == 4 ? load16<HALF>(W.m, p * W.sstride + off) : sv[p];
    }
    constexpr int64_t step = BITS == 8 ? 1 : 2;
    for (int64_t k = k0; k < k1; k += step) {
        if (k == next) {
            next += W.group;
            off += NR;
            for (int p = 0; p < NP; ++p) {
                sv[p] = load16<HALF>(W.s, p * W.sstride + off);
                if constexpr (BITS == 4) mv[p] = load16<HALF>(W.m, p * W.sstride + off);
            }
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
            const uint8_t* q = W.q + p * W.qstride + (BITS == 8 ? k : k / 2) * NR;
            _mm_prefetch(reinterpret_cast<const char*>(q + AHEAD * NR), _MM_HINT_T0);
            __m128i lo, hi;
            unpack<BITS>(q, lo, hi);
            if constexpr (BITS == 5) {
                uint32_t bits;
                std::memcpy(&bits, W.h + p * W.hstride + k * 2, 4);
                const __m128i sixteen = _mm_set1_epi8(16);  // q - 16 = nibble - 16, or the nibble where the bit is set
                lo = _mm_mask_sub_epi8(lo, static_cast<__mmask16>(~bits), lo, sixteen);
                hi = _mm_mask_sub_epi8(hi, static_cast<__mmask16>(~bits >> 16), hi, sixteen);
            }
            fma_rows512<MR, NP>(acc, p, x, ldx, k, dequant512<BITS == 4>(lo, sv[p], mv[p]));
            if constexpr (BITS != 8)
                fma_rows512<MR, NP>(acc, p, x, ldx, k + 1, dequant512<BITS == 4>(hi, sv[p], mv[p]));
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int p = 0; p < NP; ++p)
            _mm512_mask_storeu_ps(y + m * ldy + p * NR, static_cast<__mmask16>((1u << cols[p]) - 1), acc[m][p]);
}

template <int BITS, bool HALF>
void tile_of512(int64_t mr, int64_t np, const float* x, int64_t ldx, const Weights& W, float* y, int64_t ldy,
                int64_t k0, int64_t k1, const int64_t* cols) {
#define D3D_TILE(R, P) \
    if (mr == R && np == P) return tile512<R, P, BITS, HALF>(x, ldx, W, y, ldy, k0, k1, cols);
    D3D_TILE(1, 4) D3D_TILE(2, 4) D3D_TILE(3, 2) D3D_TILE(4, 2) D3D_TILE(5, 2) D3D_TILE(6, 2) D3D_TILE(7, 2)
    D3D_TILE(8, 2) D3D_TILE(1, 1) D3D_TILE(2, 1) D3D_TILE(3, 1) D3D_TILE(4, 1) D3D_TILE(5, 1) D3D_TILE(6, 1)
    D3D_TILE(7, 1) D3D_TILE(8, 1) D3D_TILE(9, 1) D3D_TILE(10, 1) D3D_TILE(11, 1) D3D_TILE(12, 1)
#undef D3D_TILE
}

#pragma GCC pop_options

// One group of up to GROUP panels starting at panel p0, every row, one k block. AVX2: 1 or 2 rows
// span several panels, more rows go in tiles of at most 4; AVX-512: tiles of at most 12 rows, up to 8
// rows spanning 2-4 panels. Tiles as even as possible (8 rows: 4 + 4, not 6 + 2).
template <int BITS, bool HALF>
void panels(bool wide, const float* x, int64_t M, int64_t K, const Weights& W0, int64_t p0, int64_t np_group,
            int64_t N, float* y, int64_t k0, int64_t k1) {
    const int64_t most = wide ? 12 : 4;
    for (int64_t m = 0; m < M;) {
        const int64_t left = M - m, tiles = (left + most - 1) / most, mr = (left + tiles - 1) / tiles;
        const int64_t np = wide ? (mr <= 2 ? 4 : mr <= 8 ? 2 : 1) : (mr == 1 ? 4 : mr == 2 ? 2 : 1);
        for (int64_t p = 0; p < np_group;) {
            const int64_t n = np <= np_group - p ? np : 1;  // the group's ragged end: one panel at a time
            int64_t cols[GROUP];
            for (int64_t i = 0; i < n; ++i) cols[i] = std::min(NR, N - (p0 + p + i) * NR);
            const Weights W = W0.at(p0 + p);
            if (wide)
                tile_of512<BITS, HALF>(mr, n, x + m * K, K, W, y + m * N + (p0 + p) * NR, N, k0, k1, cols);
            else
                tile_of<BITS, HALF>(mr, n, x + m * K, K, W, y + m * N + (p0 + p) * NR, N, k0, k1, cols);
            p += n;
        }
        m += mr;
    }
}

template <int BITS, bool HALF>
void run(bool wide, const float* x, int64_t M, int64_t K, const Weights& W, int64_t P, int64_t N, float* y) {
    // Threads split groups of panels: each weight is read from memory by one thread, once.
    at::parallel_for(0, (P + GROUP - 1) / GROUP, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g)
            for (int64_t k0 = 0; k0 < K; k0 += KC)
                panels<BITS, HALF>(wide, x, M, K, W, g * GROUP, std::min(GROUP, P - g * GROUP), N, y, k0,
                                   std::min(K, k0 + KC));
    });
}

}  // namespace

// y [M, N] = x [M, K] @ W^T, W as panels: q, h (int5's high bits; else empty), s and m (int4's
// mins; else empty), s/m fp32 or fp16, group G, bits 8, 5 or 4.
// isa: 512 (AVX-512), 256 (AVX2) or 0 (AVX-512 where the CPU has it). All give the same bits.
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h, const torch::Tensor& s,
                     const torch::Tensor& m, int64_t N, int64_t G, int64_t bits, int64_t isa) {
    const Weights W = d3d_quant::checked("quant_gemm.matmul", x, q, h, s, m, N, G, bits);
    const int64_t K = x.size(1), P = q.size(0);
    const bool half = W.half;
    const bool wide = isa == 512 || (isa == 0 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"));
    TORCH_CHECK(!wide || (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")),
                "quant_gemm.matmul: isa=512 on a CPU without AVX-512 (BW, VL)");
    auto xc = x.contiguous();
    const int64_t M = xc.size(0);
    if (M == 0 || K == 0) return torch::zeros({M, N}, x.options());
    auto y = torch::empty({M, N}, x.options());
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
#define D3D_RUN(B, H) \
    if (bits == B && half == H) run<B, H>(wide, xp, M, K, W, P, N, yp);
    D3D_RUN(8, false) D3D_RUN(8, true) D3D_RUN(5, false) D3D_RUN(5, true) D3D_RUN(4, false) D3D_RUN(4, true)
#undef D3D_RUN
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("matmul", &matmul, "x [M, K] fp32 @ W^T, W as int8/int5/int4 panels with group scales -> y [M, N]");
}
