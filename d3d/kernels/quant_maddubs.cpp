// Weight-only quantized matmul with int8 activations on AVX2 (vpmaddubsw): quant_vnni.cpp's products for CPUs
// without AVX-512 VNNI, on the same panels and activations (quant_int8.h), with the same bits.
//
// Why: on AVX2 the fp32-activation kernel (quant_gemm.cpp) converts every weight to fp32 before its fma and is
// bound by instructions even at one row; a product here multiplies 32 weight bytes by 32 activation bytes.
//
// Numerics: quant_vnni.cpp's, exactly. The integer sums I are the same integers, computed another way:
//   vpmaddubsw multiplies unsigned weight bytes by signed activation bytes and adds pairs into int16 (saturating),
//   vpmaddwd adds those pairs into int32. No pair saturates: int4/int5/int6 weights are bytes below 64 and
//   |qx| <= 127 (two int6 pairs: 4 * 63 * 127 = 32004 <= 32767); int8 weights are read as |q| with the
//   activation's sign flipped where q < 0 (vpsignb: |q| <= 128, 2 * 128 * 127 = 32512), so int8 sums start
//   from 0, not from -128 sum qx as VNNI's q + 128 do.
//
// Layouts: a 64-byte load of a panel holds 4 steps of 16 columns, byte [i][j]; two unpacks, two lane
// permutes and two byte shuffles make it [j][i] in two registers (columns 0-7 and 8-15), each 32-bit lane one
// column's 4 bytes: VNNI's vpermb, 8 columns at a time. The activations are broadcast 4 bytes at a time, as
// there. int5's high bits become bytes 0x10 by a shuffle, a test and a mask (VNNI: vpshufbitqmb).
//
// Several rows: AVX2 has 16 registers, so a tile's rows run in chunks of a few rows that share each group's
// weights (the first chunk streams them from memory, the others read them from L1), and the fp32
// accumulators of a tile live in L1.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>

#include "quant_int8.h"

namespace {

using d3d_quant::Act;
using d3d_quant::GROUP;
using d3d_quant::MR_MAX;
using d3d_quant::NR;
using d3d_quant::load8;
using d3d_quant::SUPER;
using d3d_quant::tile_rows;
using d3d_quant::Weights;

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

// Rows a pass over a group's weights takes: two-level scales 4 (8-16 rows' matmuls 13-19% faster than with 2),
// one-level 2 (16 rows' matmuls 5-9% faster than with 4; docs/results/avx2-int8/chunks.txt).
template <int SC>
constexpr int CHUNK = SC == 2 ? 4 : 2;

// [i][j] (4 x 16 bytes at p) -> columns 0-7 and 8-15, each lane one column's 4 bytes [i = 0..3].
__attribute__((always_inline)) inline void transpose(const uint8_t* p, __m256i& c0, __m256i& c1) {
    const __m256i r01 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i r23 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    // lane 0: rows 0 and 2 interleaved, lane 1: rows 1 and 3; columns 0-7 (lo) or 8-15 (hi)
    const __m256i lo = _mm256_unpacklo_epi8(r01, r23), hi = _mm256_unpackhi_epi8(r01, r23);
    // after [q0 q2 q1 q3]: lane 0 holds columns 0-3 as (r0 r2) pairs then (r1 r3) pairs; lane 1 columns 4-7
    const __m256i pick = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                          0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    c0 = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(lo, 0xD8), pick);
    c1 = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(hi, 0xD8), pick);
}

// int5's high bits of 4 k pairs (W.h: 4 words, bit j at k and bit 16 + j at k + 1 of column j; both lanes of H)
// -> 0x10 in the bytes of columns 8 half .. 8 half + 7 that they mark, for the even k (odd: the k + 1).
template <int HALF, int ODD>
__attribute__((always_inline)) inline __m256i high_bits(__m256i H) {
    constexpr char b = 2 * ODD + HALF;  // the byte of word i that holds these columns' bits
    const __m256i pick = _mm256_setr_epi8(b, b + 4, b + 8, b + 12, b, b + 4, b + 8, b + 12, b, b + 4, b + 8, b + 12,
                                          b, b + 4, b + 8, b + 12, b, b + 4, b + 8, b + 12, b, b + 4, b + 8, b + 12,
                                          b, b + 4, b + 8, b + 12, b, b + 4, b + 8, b + 12);
    const __m256i bit = _mm256_setr_epi8(1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32,
                                         32, 64, 64, 64, 64, -128, -128, -128, -128);  // column 8 half + lane
    const __m256i t = _mm256_and_si256(_mm256_shuffle_epi8(H, pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(t, bit), _mm256_set1_epi8(0x10));
}

__attribute__((always_inline)) inline __m256i bcast(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

// The integer sums of R rows x one panel (columns 0-7: I[m][0], 8-15: I[m][1]) over one activation group
// k0 .. k0 + A: I += (q + z) qx (int8: q qx). xt: the first row's activations in a tile of LD rows (Act).
template <int R, int BITS, int A, int LD, bool PF>
__attribute__((always_inline)) inline void dots(const int8_t* xt, const Weights& W, int64_t k0, __m256i (&I)[R][2]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    constexpr int STEP = BITS == 8 ? 4 : 8;  // k a load of weights covers
#pragma GCC unroll 8
    for (int j = 0; j < A / STEP; ++j) {
        const int64_t k = k0 + j * STEP;
        const uint8_t* q = W.q + (BITS == 8 ? k : k / 2) * NR;
        if constexpr (PF) d3d_quant::prefetch_panel<BITS, (LD <= 4)>(W, q, k);  // into L2 too in tiles of <= 4 rows
        __m256i c[2];
        transpose(q, c[0], c[1]);
        __m256i crumbs;  // int6: 32 bytes of high two bits, laid out for the transposed bytes (int6_to_panels)
        if constexpr (BITS == 6) crumbs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(W.h + k * 4));
        if constexpr (BITS == 5)  // int5: the 4 words of high bits of these 4 k pairs, in both lanes
            crumbs = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W.h + k * 2)));
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
            if constexpr (BITS == 8) {
                const __m256i u = _mm256_abs_epi8(c[half]);
#pragma GCC unroll 8
                for (int m = 0; m < R; ++m) {
                    const __m256i x = _mm256_sign_epi8(bcast(xt + k * LD + 4 * m), c[half]);
                    I[m][half] = _mm256_add_epi32(I[m][half], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones));
                }
            } else {
                __m256i lo = _mm256_and_si256(c[half], low4), hi = _mm256_and_si256(_mm256_srli_epi16(c[half], 4), low4);
                if constexpr (BITS == 6) {  // bits 4-5: columns 0-7 from crumbs << 4 and crumbs, 8-15 << 2 and >> 2
                    lo = _mm256_or_si256(lo, _mm256_and_si256(half ? _mm256_slli_epi16(crumbs, 2)
                                                                   : _mm256_slli_epi16(crumbs, 4), bits45));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(half ? _mm256_srli_epi16(crumbs, 2) : crumbs, bits45));
                }
                if constexpr (BITS == 5) {
                    lo = _mm256_or_si256(lo, half ? high_bits<1, 0>(crumbs) : high_bits<0, 0>(crumbs));
                    hi = _mm256_or_si256(hi, half ? high_bits<1, 1>(crumbs) : high_bits<0, 1>(crumbs));
                }
#pragma GCC unroll 8
                for (int m = 0; m < R; ++m) {  // k, k+2, k+4, k+6 and the odd k: one int16 sum (<= 32004)
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast(xt + k * LD + 4 * m)),
                                                       _mm256_maddubs_epi16(hi, bcast(xt + (k + 4) * LD + 4 * m)));
                    I[m][half] = _mm256_add_epi32(I[m][half], _mm256_madd_epi16(p, ones));
                }
            }
        }
    }
}

// Rows R0 .. R0 + R of an MR-row tile over activation group a (ia: the tile's values of the group), one scale
// (and int4 min) per group and row applied in fp32, into acc [MR][16] (quant_vnni.cpp's group_rows).
template <int R0, int R, int MR, int BITS, int SC, int A, bool PF>
__attribute__((always_inline)) inline void group_rows(const Act& X, const int8_t* xt, int64_t ia, const Weights& W,
                                                      int64_t a, float* acc) {
    const int64_t k0 = a * A, g = W.group == A ? a : k0 / W.group;
    __m256i I[R][2];
    for (int m = 0; m < R; ++m) I[m][0] = I[m][1] = _mm256_set1_epi32(X.zsum[ia + R0 + m]);
    dots<R, BITS, A, MR, PF>(xt + 4 * R0, W, k0, I);
    for (int half = 0; half < 2; ++half) {
        const __m256 s = load8<SC == 1>(W.s, g * NR + 8 * half);
        const __m256 mn = BITS == 4 ? load8<SC == 1>(W.m, g * NR + 8 * half) : s;
#pragma GCC unroll 8
        for (int m = 0; m < R; ++m) {
            const int64_t i = ia + R0 + m;
            float* out = acc + (R0 + m) * NR + 8 * half;
            __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[m][half]), _mm256_mul_ps(s, _mm256_set1_ps(X.scale[i])),
                                       _mm256_load_ps(out));
            if constexpr (BITS == 4) v = _mm256_fnmadd_ps(mn, _mm256_set1_ps(X.xsum[i]), v);
            _mm256_store_ps(out, v);
        }
    }
}

// int4's mins of a super-block: the int8 factors of groups g, g + 1 of columns 8 h .. 8 h + 7 as int16 pairs
// (column j: mf[j, g], mf[j, g + 1]), for vpmaddwd with a row's pair of group sums.
inline __m256i min_pairs(const int8_t* f, int half) {
    const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(f + 8 * half));
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(f + NR + 8 * half));
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
}

// Two-level scales: rows R0 .. R0 + R of an MR-row tile over super-block b, into acc [MR][16]
// (quant_vnni.cpp's block_rows).
template <int R0, int R, int MR, int BITS, int G, bool PF>
__attribute__((always_inline)) inline void block_rows(const Act& X, int64_t m0, const Weights& W, float* acc,
                                                      int64_t b) {
    constexpr int64_t PER = SUPER / G;  // groups per super-block
    const int64_t K = X.K, NG = K / G, NB = K / SUPER;
    const int8_t* f = static_cast<const int8_t*>(W.s);
    const int8_t* mf = static_cast<const int8_t*>(W.m);
    __m256i T[R][2];
    for (int m = 0; m < R; ++m) T[m][0] = T[m][1] = _mm256_setzero_si256();
    for (int64_t g = b * PER; g < (b + 1) * PER; ++g) {
        const int64_t ig = m0 * NG + g * MR + R0;  // the rows' values of group g
        __m256i I[R][2];
        for (int m = 0; m < R; ++m)
            I[m][0] = I[m][1] = BITS != 4 ? _mm256_set1_epi32(X.zsum[ig + m]) : _mm256_setzero_si256();
        dots<R, BITS, G, MR, PF>(X.q + m0 * K + 4 * R0, W, g * G, I);
        for (int half = 0; half < 2; ++half) {
            const __m256i fg = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(f + g * NR + 8 * half)));
#pragma GCC unroll 8
            for (int m = 0; m < R; ++m)
                T[m][half] = _mm256_add_epi32(T[m][half], _mm256_sll_epi32(_mm256_mullo_epi32(I[m][half], fg),
                                                                          _mm_cvtsi32_si128(X.shift[ig + m])));
        }
    }
    for (int half = 0; half < 2; ++half) {
        const __m256 d = load8<true>(W.sd, b * NR + 8 * half);
        for (int m = 0; m < R; ++m) {
            float* out = acc + (R0 + m) * NR + 8 * half;
            const __m256 sx = _mm256_set1_ps(X.scale[m0 * NB + b * MR + R0 + m]);
            __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T[m][half]), _mm256_mul_ps(d, sx), _mm256_load_ps(out));
            if constexpr (BITS == 4) {
                const int16_t* qs = X.qsum + (m0 + R0 + m) * NG + b * PER;
                __m256i M = _mm256_setzero_si256();
                for (int64_t i = 0; i < PER / 2; ++i) {
                    int32_t pair;
                    std::memcpy(&pair, qs + 2 * i, 4);
                    M = _mm256_add_epi32(M, _mm256_madd_epi16(min_pairs(mf + (b * PER + 2 * i) * NR, half),
                                                              _mm256_set1_epi32(pair)));
                }
                v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(load8<true>(W.md, b * NR + 8 * half), sx), v);
            }
            _mm256_store_ps(out, v);
        }
    }
}

// The chunks of an MR-row tile: as even as possible, at most C rows each.
constexpr int chunk_of(int MR, int C) { return (MR + (MR + C - 1) / C - 1) / ((MR + C - 1) / C); }

// Every chunk of an MR-row tile over activation group a (two-level: super-block a), the first streaming the
// weights (prefetching ahead), the others finding them in L1.
template <int R0, int MR, int BITS, int SC, int A>
__attribute__((always_inline)) inline void chunks(const Act& X, int64_t m0, int64_t a, const Weights& W, float* acc) {
    if constexpr (R0 < MR) {
        constexpr int C = chunk_of(MR, CHUNK<SC>), R = MR - R0 < C ? MR - R0 : C;
        if constexpr (SC == 2)
            block_rows<R0, R, MR, BITS, A, R0 == 0>(X, m0, W, acc, a);
        else
            group_rows<R0, R, MR, BITS, SC, A, R0 == 0>(X, X.q + m0 * X.K, m0 * (X.K / A) + a * MR, W, a, acc);
        chunks<R0 + R, MR, BITS, SC, A>(X, m0, a, W, acc);
    }
}

// MR rows x one panel (col of its columns valid) over activation groups (two-level: super-blocks) a0 .. a1.
template <int MR, int BITS, int SC, int A>
void tile(const Act& X, int64_t m0, const Weights& W, float* y, int64_t ldy, int64_t a0, int64_t a1, int64_t col) {
    alignas(32) float acc[MR * NR];
    for (int m = 0; m < MR; ++m) {
        std::memset(acc + m * NR, 0, sizeof(float) * NR);
        if (a0 > 0) std::memcpy(acc + m * NR, y + m * ldy, sizeof(float) * col);
    }
    for (int64_t a = a0; a < a1; ++a) chunks<0, MR, BITS, SC, A>(X, m0, a, W, acc);
    for (int m = 0; m < MR; ++m) std::memcpy(y + m * ldy, acc + m * NR, sizeof(float) * col);
}

template <int BITS, int SC, int A>
void tile_of(int64_t mr, const Act& X, int64_t m0, const Weights& W, float* y, int64_t ldy, int64_t a0, int64_t a1,
             int64_t col) {
    if constexpr (SC == 2) a0 = a0 * A / SUPER, a1 = a1 * A / SUPER;  // super-blocks
#define D3D_TILE(R) \
    if (mr == R) return tile<R, BITS, SC, A>(X, m0, W, y, ldy, a0, a1, col);
    D3D_TILE(1) D3D_TILE(2) D3D_TILE(3) D3D_TILE(4) D3D_TILE(5) D3D_TILE(6) D3D_TILE(7) D3D_TILE(8)
    D3D_TILE(9) D3D_TILE(10) D3D_TILE(11) D3D_TILE(12) D3D_TILE(13) D3D_TILE(14) D3D_TILE(15) D3D_TILE(16)
#undef D3D_TILE
}

// As quant_vnni.cpp's run: up to STREAM_ROWS rows a tile runs down the whole of K, one panel at a time; more
// rows take each panel's k blocks of 256 through every row tile (docs/results/batch-gate/loop_order_maddubs.json).
// Each kernel keeps this loop under its own target pragma, so that its tiles inline into it (a template shared
// through quant_int8.h cost the matmuls of 8 rows ~2%).
constexpr int64_t STREAM_ROWS = 16;

template <int BITS, int SC>
void run(const Act& X, int64_t M, const Weights& W0, int64_t P, int64_t N, float* y) {
    const int64_t blocks = X.K / X.A, AB = M <= STREAM_ROWS ? blocks : std::max<int64_t>(1, SUPER / X.A);
    at::parallel_for(0, (P + GROUP - 1) / GROUP, 1, [&](int64_t g0, int64_t g1) {
        for (int64_t gi = g0; gi < g1; ++gi) {
            const int64_t p0 = gi * GROUP, npg = std::min(GROUP, P - p0);
            for (int64_t p = 0; p < npg; ++p) {  // each panel front to back: one stream a thread
                const int64_t col = std::min(NR, N - (p0 + p) * NR);
                const Weights W = W0.at(p0 + p);
                for (int64_t a0 = 0; a0 < blocks; a0 += AB) {
                    const int64_t a1 = std::min(blocks, a0 + AB);
                    for (int64_t m = 0; m < M;) {  // every row tile over the block, its weights in L1 after the first
                        const int64_t mr = tile_rows(M, m);
                        if (X.A == 16)
                            tile_of<BITS, SC, 16>(mr, X, m, W, y + m * N + (p0 + p) * NR, N, a0, a1, col);
                        else
                            tile_of<BITS, SC, 32>(mr, X, m, W, y + m * N + (p0 + p) * NR, N, a0, a1, col);
                        m += mr;
                    }
                }
            }
        }
    });
}

#pragma GCC pop_options

}  // namespace

// y [M, N] = x [M, K] @ W^T with int8 activations (quant_vnni.cpp's numerics); the panels as quant_vnni.matmul
// takes them.
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h, const torch::Tensor& s,
                     const torch::Tensor& m, int64_t N, int64_t G, int64_t bits, const torch::Tensor& sd,
                     const torch::Tensor& md) {
    TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                "quant_maddubs.matmul: this CPU lacks AVX2/FMA");
    static constexpr int32_t offsets[9] = {0, 0, 0, 0, 0, 16, 32, 0, 0};  // int8 is read as |q| and a sign
    return d3d_quant::int8_matmul("quant_maddubs.matmul", x, q, h, s, m, N, G, bits, sd, md, offsets,
                                  [](int64_t bits, int sc, const Act& X, int64_t M, const Weights& W, int64_t P,
                                     int64_t N, float* y) {
#define D3D_RUN(B, S) \
    if (bits == B && sc == S) run<B, S>(X, M, W, P, N, y);
        D3D_RUN(8, 0) D3D_RUN(8, 1) D3D_RUN(6, 0) D3D_RUN(6, 1) D3D_RUN(6, 2) D3D_RUN(5, 0) D3D_RUN(5, 1)
        D3D_RUN(4, 0) D3D_RUN(4, 1) D3D_RUN(4, 2)
#undef D3D_RUN
    });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("matmul", &matmul, "x [M, K] fp32 @ W^T with int8 activations and AVX2 dot products -> y [M, N]",
          py::arg("x"), py::arg("q"), py::arg("h"), py::arg("s"), py::arg("m"), py::arg("N"), py::arg("G"),
          py::arg("bits"), py::arg("sd") = torch::Tensor(), py::arg("md") = torch::Tensor());
    m.def("address", [] { return reinterpret_cast<int64_t>(&matmul); }, "matmul's address (layers_cpu.cpp calls it)");
}
