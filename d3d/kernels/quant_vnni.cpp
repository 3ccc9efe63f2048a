// Weight-only quantized matmul with int8 activations and integer dot products (AVX-512 VNNI):
// y = x W^T for the int8 / int5 / int4 panels of quant_gemm.cpp, read as they are.
//
// Why: quant_gemm.cpp converts every weight to fp32 before its fma (~0.5 instructions per weight)
// and is bound by instructions, not by memory, on a 2-core CPU. Here the activations are quantized
// instead, once per pass (llama.cpp's approach for its CPU dot products): per row and per group of
// A = 32 inputs (16 where the weights' group is 16), qx = round(x / sx) with sx = max|x| / 127, and
// one vpdpbusd multiplies 64 weight bytes by 4 activation bytes at a time, exactly, in int32.
//
// Numerics, per row m, output n, activation group a (weights' group g(a), offset z: 128 for int8,
// whose bytes are read as q + 128, 16 for int5, 0 for int4):
//   I = sum_{k in a} (q[n, k] + z) qx[m, k] - z sum_{k in a} qx[m, k]          (exact integers)
//   acc = fma(float(I), fl(s[n, g] * sx[m, a]), acc);  int4: acc = fma(-m[n, g], X[m, a], acc)
// with X the fp32 sum of x over the group in k order, groups in k order from acc = 0. Every row's
// result depends on that row alone, so it is row-invariant for every row count, tile and thread.
//
// Two-level scales (llama.cpp's K-quants: an fp16 d per super-block of 256 inputs and an int8 factor f
// per group; int4's mins likewise dm and mf) are held as they come, and the activations of such a matrix
// are quantized per super-block instead, so that the group factors apply in integers and a super-block
// costs one fp32 fma per row and output: sx = max|x| / 127 over the super-block (as llama.cpp's Q8_K),
// and each group g of it with sx / 2^e_g, e_g <= 3 the largest with max_g |x| 2^e_g <= 127 sx (a quiet
// group keeps up to 3 more bits; a super-block's scale alone cost 7x the bits/byte of per-group scales,
// docs/results.md#fewer-bytes-and-fewer-instructions-for-k-quants-issue-47-docsresultsreal-models):
//   T = sum_{g in b} (f[n, g] I_g) << (3 - e_g),  M = sum_{g in b} mf[n, g] (B_g << (3 - e_g))   (exact int32)
//   acc = fma(float(T), fl(d[n, b] fl(sx / 8)), acc);  int4: acc = fma(-float(M), fl(dm[n, b] fl(sx / 8)), acc)
// with B_g = sum_{k in g} qx[m, k] (|T| < 2^31 for 256 inputs of int6 or int4 weights and int8 factors;
// float(T) rounds to nearest, as the oracle does).
// Loop oracle: naive.quant_vnni_reference.
//
// Layouts: the panels of quant_gemm.cpp. A 64-byte load holds 4 steps (int8: k .. k + 3) or 4 k
// pairs (int4/int5: k .. k + 7) of 16 columns, byte [i][j]; vpermb turns it into [j][i], so each
// 32-bit lane holds one column's 4 bytes, as vpdpbusd wants. For int4/int5 the low nibbles of a lane
// are k, k+2, k+4, k+6 and the high ones k+1, k+3, k+5, k+7: the activations are laid out in that
// order once per pass (integer sums do not depend on the order). int5's high bits (one 32-bit word
// per k pair) become two byte masks of the transposed layout (vpshufbitqmb, AVX-512 BITALG) that add
// 0x10 to the nibbles they mark.
//
// int6 (Q6_K's values, u = q + 32 in 0..63): the nibbles as int4's, and the high two bits 32 bytes per k
// step of a panel, laid out so that two 16-bit shifts and two masks put them in bits 4-5 of the
// transposed bytes (int6_to_panels); 6.5 bits a weight with its scales where int8 took 8.5.
//
// Several rows (verification's drafted tokens): a tile of up to 16 rows, in halves of up to 8, unpacks each
// load of weights once a half and streams it from memory once, so an extra row costs its vpdpbusd and little else.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant_int8.h"

namespace {

using d3d_quant::GROUP;
using d3d_quant::NR;
using d3d_quant::load16;
using d3d_quant::Weights;
using d3d_quant::Act;
using d3d_quant::MR_MAX;
using d3d_quant::SUPER;
using d3d_quant::tile_rows;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg")

// [i][j] (4 x 16 bytes) -> [j][i] (16 lanes of 4 bytes)
inline __m512i transpose4x16(__m512i v) {
    alignas(64) static const uint8_t idx[64] = {
        0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54,
        7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61,
        14, 30, 46, 62, 15, 31, 47, 63};
    return _mm512_permutexvar_epi8(_mm512_load_si512(idx), v);
}

// acc += the 4 bytes of w in each lane (unsigned) times the 4 activation bytes at x (signed), in every
// lane: one vpdpbusd with an embedded broadcast. Through the intrinsic GCC 12 loaded the broadcast apart
// and copied accumulators around each product, ~5 instructions a dot product at 6-8 rows.
__attribute__((always_inline)) inline void dot_bcast(__m512i& acc, __m512i w, const int8_t* x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
}

// int5's high bits of 4 k pairs (4 words: bit j at k, bit 16 + j at k + 1, column j) -> the two byte
// masks of the transposed [j][i] layout (bit 4 j + i: column j, pair i), for the even and the odd k.
// One shuffle gathers the even and the odd halves; vpshufbitqmb picks each mask bit from them.
inline void high_masks(const uint8_t* h, __mmask64& even, __mmask64& odd) {
    alignas(64) static const uint8_t pick[64] = {  // byte 4 j + i: bit 16 i + j
        0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54,
        7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61,
        14, 30, 46, 62, 15, 31, 47, 63};
    const __m128i halves = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)),
                                            _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    const __m512i ctl = _mm512_load_si512(pick);
    even = _mm512_bitshuffle_epi64_mask(_mm512_broadcastq_epi64(halves), ctl);
    odd = _mm512_bitshuffle_epi64_mask(_mm512_broadcastq_epi64(_mm_unpackhi_epi64(halves, halves)), ctl);
}

// The integer sums of MR rows x one panel over one activation group k0 .. k0 + A: I += (q + z) qx.
// Each 64-byte load of weights is unpacked once and applied to all MR rows: per row and 64 weights, one
// vpdpbusd. xt: the first row's activations in a tile of LD rows (Act).
template <int MR, int BITS, int A, int LD = MR, bool PF = true>
__attribute__((always_inline)) inline void dots(const int8_t* xt, const Weights& W, int64_t k0, __m512i (&I)[MR]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), sign = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i sixteen = _mm512_set1_epi8(0x10), bits45 = _mm512_set1_epi8(0x30);
    // int6: byte u of the high bits holds, from bit 0, the even k's crumbs of transposed bytes u and u + 32,
    // then the odd k's: shifted per 16-bit lane into bits 4-5 of bytes 0-31 and 32-63 (int6_to_panels)
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    // int4/int5 in small tiles: the odd k's sums apart (two dependency chains per output, not one)
    constexpr bool SPLIT = BITS != 8 && MR <= 4;
    __m512i J[MR];
    if constexpr (SPLIT)
        for (int m = 0; m < MR; ++m) J[m] = _mm512_setzero_si512();
    constexpr int STEP = BITS == 8 ? 4 : 8;  // k a load of weights covers
#pragma GCC unroll 8
    for (int j = 0; j < A / STEP; ++j) {
        const int64_t k = k0 + j * STEP;
        const uint8_t* q = W.q + (BITS == 8 ? k : k / 2) * NR;
        if constexpr (PF) d3d_quant::prefetch_panel<BITS>(W, q, k);
        const __m512i v = transpose4x16(_mm512_loadu_si512(q));
        __m512i lo, hi;  // int8: lo only
        if constexpr (BITS == 8) {
            lo = _mm512_xor_si512(v, sign);  // q + 128 as unsigned bytes
        } else {
            lo = _mm512_and_si512(v, low4);
            hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            if constexpr (BITS == 6) {  // 32 bytes of high two bits, laid out for the transposed bytes
                const __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(W.h + k * 4)));
                lo = _mm512_ternarylogic_epi32(_mm512_sllv_epi16(c, shl), bits45, lo, 0xEA);  // (a & b) | c
                hi = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(c, shr), bits45, hi, 0xEA);
            }
            if constexpr (BITS == 5) {
                __mmask64 even, odd;
                high_masks(W.h + k * 2, even, odd);  // 4 words: k pairs k/2 .. k/2 + 3
                lo = _mm512_mask_add_epi8(lo, even, lo, sixteen);
                hi = _mm512_mask_add_epi8(hi, odd, hi, sixteen);
            }
        }
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
            dot_bcast(I[m], lo, xt + k * LD + 4 * m);  // int4/int5: k, k+2, k+4, k+6
            if constexpr (BITS != 8) dot_bcast(SPLIT ? J[m] : I[m], hi, xt + (k + 4) * LD + 4 * m);  // the odd k
        }
    }
    if constexpr (SPLIT)
        for (int m = 0; m < MR; ++m) I[m] = _mm512_add_epi32(I[m], J[m]);
}

inline __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// Rows R0 .. R0 + R of an MR-row tile over activation group a (ia: the tile's values of the group), one scale
// (and int4 min) per group and row applied in fp32 (see the top). Integer sums start from -z sum qx. PF: this
// pass prefetches the weights ahead (the first over the group; the second finds them in L1).
template <int R0, int R, int MR, int BITS, int SC, int A, bool PF>
__attribute__((always_inline)) inline void group_rows(const Act& X, const int8_t* xt, int64_t ia, const Weights& W,
                                                      int64_t a, __m512 (&acc)[MR]) {
    const int64_t k0 = a * A, g = W.group == A ? a : k0 / W.group;
    __m512i I[R];
    for (int m = 0; m < R; ++m) I[m] = _mm512_set1_epi32(X.zsum[ia + R0 + m]);
    dots<R, BITS, A, MR, PF>(xt + 4 * R0, W, k0, I);
    const __m512 s = load16<SC == 1>(W.s, g * NR);
    const __m512 mn = BITS == 4 ? load16<SC == 1>(W.m, g * NR) : s;
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
        const int64_t i = ia + R0 + m;
        acc[R0 + m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[m]), _mm512_mul_ps(s, _mm512_set1_ps(X.scale[i])), acc[R0 + m]);
        if constexpr (BITS == 4) acc[R0 + m] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(X.xsum[i]), acc[R0 + m]);
    }
}

// Rows a pass over the weights takes at most: the integer sums of 8 rows, their fp32 accumulators and the
// unpacked weights fill the 32 registers. A tile of more rows (up to MR_MAX) runs in two halves that share
// each group's weights, the second half reading them from L1: a 16-row pass streams each panel from memory
// once, where two tiles of 8 rows had each streamed it (docs/results/row-halves/).
constexpr int HALF = 8;

// The rows of a tile's first half: all MR up to HALF, else the larger half.
constexpr int first_half(int MR) { return MR > HALF ? (MR + 1) / 2 : MR; }

// MR rows x one panel (col of its columns valid) over activation groups a0 .. a1, in two halves past HALF rows.
// SC: how the scales are held: 0 fp32, 1 fp16.
template <int MR, int BITS, int SC, int A>
void tile(const Act& X, int64_t m0, const Weights& W, float* y, int64_t ldy, int64_t a0, int64_t a1, int64_t col) {
    constexpr int H0 = first_half(MR);
    __m512 acc[MR];
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) acc[m] = a0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(first(col), y + m * ldy);
    const int64_t NG = X.K / A;
    const int8_t* xt = X.q + m0 * X.K;
    for (int64_t a = a0; a < a1; ++a) {  // activation groups, in k order
        const int64_t ia = m0 * NG + a * MR;  // the tile's values of group a
        group_rows<0, H0, MR, BITS, SC, A, true>(X, xt, ia, W, a, acc);
        if constexpr (MR > H0) group_rows<H0, MR - H0, MR, BITS, SC, A, false>(X, xt, ia, W, a, acc);
    }
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * ldy, first(col), acc[m]);
}

// int4's mins of a super-block: the int8 factors of groups g, g + 1 of one panel as 16 lanes of int16
// pairs (column j: mf[j, g], mf[j, g + 1]), for vpdpwssd with a row's pair of group sums.
inline __m512i min_pairs(const int8_t* f) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(f));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(f + NR));
    return _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}

// Two-level scales: rows R0 .. R0 + R of an MR-row tile over super-block b (see the top). The group factors
// apply in integers; the fp32 accumulators live in y (one load and store per super-block).
template <int R0, int R, int MR, int BITS, int G, bool PF>
__attribute__((always_inline)) inline void block_rows(const Act& X, int64_t m0, const Weights& W, float* y,
                                                      int64_t ldy, int64_t b, int64_t col) {
    constexpr int64_t PER = SUPER / G;  // groups per super-block
    const int64_t K = X.K, NG = K / G, NB = K / SUPER;
    const int8_t* f = static_cast<const int8_t*>(W.s);
    const int8_t* mf = static_cast<const int8_t*>(W.m);
    __m512i T[R];
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) T[m] = _mm512_setzero_si512();
    for (int64_t g = b * PER; g < (b + 1) * PER; ++g) {
        const int64_t ig = m0 * NG + g * MR + R0;  // the rows' values of group g
        __m512i I[R];
#pragma GCC unroll 8
        for (int m = 0; m < R; ++m) I[m] = BITS != 4 ? _mm512_set1_epi32(X.zsum[ig + m]) : _mm512_setzero_si512();
        dots<R, BITS, G, MR, PF>(X.q + m0 * K + 4 * R0, W, g * G, I);
        // (f I) << s = (I << s) f, exact in int32: a row's shift by its count broadcast from memory, then one multiply
        // (the factors shifted four ways through memory, or each row's count moved to a vector register, had cost more)
        const __m512i fg = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f + g * NR)));
#pragma GCC unroll 8
        for (int m = 0; m < R; ++m) {
            __m512i shifted = I[m];
            __asm__("vpsllvd %1%{1to16%}, %0, %0" : "+v"(shifted) : "m"(X.shift[ig + m]));  // GCC 12 broadcast apart
            T[m] = _mm512_add_epi32(T[m], _mm512_mullo_epi32(shifted, fg));
        }
    }
    const __m512 d = load16<true>(W.sd, b * NR);
    __m512i mp[PER / 2];
    if constexpr (BITS == 4)
        for (int64_t i = 0; i < PER / 2; ++i) mp[i] = min_pairs(mf + (b * PER + 2 * i) * NR);
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
        float* out = y + (R0 + m) * ldy;
        const __m512 sx = _mm512_set1_ps(X.scale[m0 * NB + b * MR + R0 + m]);
        __m512 acc = b == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(first(col), out);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[m]), _mm512_mul_ps(d, sx), acc);
        if constexpr (BITS == 4) {
            const int16_t* qs = X.qsum + (m0 + R0 + m) * NG + b * PER;
            __m512i M = _mm512_setzero_si512();
            for (int64_t i = 0; i < PER / 2; ++i) {
                int32_t pair;
                std::memcpy(&pair, qs + 2 * i, 4);
                M = _mm512_dpwssd_epi32(M, mp[i], _mm512_set1_epi32(pair));
            }
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(load16<true>(W.md, b * NR), sx), acc);
        }
        _mm512_mask_storeu_ps(out, first(col), acc);
    }
}

// Two-level scales: MR rows x one panel over super-blocks b0 .. b1, in two halves past HALF rows.
template <int MR, int BITS, int G>
void tile_sb(const Act& X, int64_t m0, const Weights& W, float* y, int64_t ldy, int64_t b0, int64_t b1, int64_t col) {
    constexpr int H0 = first_half(MR);
    for (int64_t b = b0; b < b1; ++b) {
        block_rows<0, H0, MR, BITS, G, true>(X, m0, W, y, ldy, b, col);
        if constexpr (MR > H0) block_rows<H0, MR - H0, MR, BITS, G, false>(X, m0, W, y, ldy, b, col);
    }
}

// Rows per tile: up to 16, in halves of at most HALF rows (tile). With `dots` inlined (it was not always, and
// 8 x 1 measured slower then: docs/results/attention-cpu/kernels.txt), 8 rows cost ~1.25x one row's matmuls
// where 4 x 2 tiles had cost ~1.75x (docs/results/vnni-streams/).
constexpr int64_t STREAM_ROWS = 16;

template <int BITS, int SC, int A>
void tile_of(int64_t mr, const Act& X, int64_t m0, const Weights& W, float* y, int64_t ldy, int64_t a0, int64_t a1,
             int64_t col) {
#define D3D_TILE(R)                                                                           \
    if (mr == R) {                                                                            \
        if constexpr (SC == 2)                                                                \
            return tile_sb<R, BITS, A>(X, m0, W, y, ldy, a0 * A / SUPER, a1 * A / SUPER, col); \
        else                                                                                  \
            return tile<R, BITS, SC, A>(X, m0, W, y, ldy, a0, a1, col);                       \
    }
    D3D_TILE(1) D3D_TILE(2) D3D_TILE(3) D3D_TILE(4) D3D_TILE(5) D3D_TILE(6) D3D_TILE(7) D3D_TILE(8)
    D3D_TILE(9) D3D_TILE(10) D3D_TILE(11) D3D_TILE(12) D3D_TILE(13) D3D_TILE(14) D3D_TILE(15) D3D_TILE(16)
#undef D3D_TILE
}

template <int BITS, int SC>
void run(const Act& X, int64_t M, const Weights& W0, int64_t P, int64_t N, float* y) {
    // Up to STREAM_ROWS rows a tile runs down the whole of K (AB = blocks), one panel at a time: each thread reads its
    // panels front to back, fewer streams at once, which the memory system serves faster (the matmuls of a 1.5B
    // step: 32 -> 24 ms; docs/results/vnni-streams/). More rows keep that order and take each panel's k blocks of
    // 256 through every row tile, the block in L1 after the first (k blocks across the 4 panels had cost 17 rows
    // ~20% more: docs/results/batch-gate/loop_order_vnni.json). Each output sums its k blocks in order either way.
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

// The machine's rate of integer dot products, a bound on a pass with many rows: `per_thread` vpdpbusd on 12
// independent chains (no memory) in each of the threads; returns their checksum (so that they run). The
// tiles above run at about a third to two thirds of it (unpacking, scales, loads; docs/results/dot-bound/,
// docs/results/kquant-rows/).
int64_t dots_on_chains(int64_t per_thread) {
    const int64_t threads = at::get_num_threads();
    std::vector<int64_t> sums(threads, 0);
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            __m512i a[12];
            const __m512i b = _mm512_set1_epi32(0x01020304), c = _mm512_set1_epi32(static_cast<int32_t>(t + 1));
            for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
            for (int64_t n = 0; n < per_thread / 12; ++n) {
#pragma GCC unroll 12
                for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], b, c);
            }
            __m512i s = a[0];
            for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, a[i]);
            sums[t] = _mm512_reduce_add_epi32(s);
        }
    });
    int64_t total = 0;
    for (int64_t v : sums) total += v;
    return total;
}

#pragma GCC pop_options

}  // namespace

// y [M, N] = x [M, K] @ W^T with int8 activations (see the top); the weights as quant_gemm.matmul takes them.
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h, const torch::Tensor& s,
                     const torch::Tensor& m, int64_t N, int64_t G, int64_t bits, const torch::Tensor& sd,
                     const torch::Tensor& md) {
    TORCH_CHECK(__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bitalg"),
                "quant_vnni.matmul: this CPU lacks AVX-512 VNNI/VBMI/BW/BITALG");
    static constexpr int32_t offsets[9] = {0, 0, 0, 0, 0, 16, 32, 0, 128};  // int8's bytes are read as q + 128
    return d3d_quant::int8_matmul("quant_vnni.matmul", x, q, h, s, m, N, G, bits, sd, md, offsets,
                                  [](int64_t bits, int sc, const Act& X, int64_t M, const Weights& W, int64_t P,
                                     int64_t N, float* y) {
#define D3D_RUN(B, S) \
    if (bits == B && sc == S) run<B, S>(X, M, W, P, N, y);
        D3D_RUN(8, 0) D3D_RUN(8, 1) D3D_RUN(6, 0) D3D_RUN(6, 1) D3D_RUN(6, 2) D3D_RUN(5, 0) D3D_RUN(5, 1)
        D3D_RUN(4, 0) D3D_RUN(4, 1) D3D_RUN(4, 2)
#undef D3D_RUN
    });
}

int64_t dot_probe(int64_t per_thread) {
    TORCH_CHECK(__builtin_cpu_supports("avx512vnni"), "quant_vnni.dot_probe: this CPU lacks AVX-512 VNNI");
    TORCH_CHECK(per_thread >= 0, "quant_vnni.dot_probe: per_thread=", per_thread, " must be >= 0");
    return dots_on_chains(per_thread);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("matmul", &matmul, "x [M, K] fp32 @ W^T with int8 activations and VNNI dot products -> y [M, N]",
          py::arg("x"), py::arg("q"), py::arg("h"), py::arg("s"), py::arg("m"), py::arg("N"), py::arg("G"),
          py::arg("bits"), py::arg("sd") = torch::Tensor(), py::arg("md") = torch::Tensor());
    m.def("address", [] { return reinterpret_cast<int64_t>(&matmul); }, "matmul's address (layers_cpu.cpp calls it)");
    m.def("dot_probe", &dot_probe, "per_thread vpdpbusd on 12 chains in each thread -> a checksum",
          py::arg("per_thread"));
}
