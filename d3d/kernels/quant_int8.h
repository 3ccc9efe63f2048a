// What the int8-activation kernels share (quant_vnni.cpp, AVX-512 VNNI; quant_maddubs.cpp, AVX2): the
// activations' layout and quantization, and the checked entry point. Both read the same panels and the
// same activations and compute the same exact integer sums, so they give the same bits (numerics:
// quant_vnni.cpp's top; loop oracles naive.quant_vnni_reference and naive.quant_vnni_two_level_reference).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "quant_panels.h"

namespace d3d_quant {

constexpr int64_t SUPER = 256;  // inputs per super-block of two-level scales
constexpr int64_t MR_MAX = 16;  // rows of an activation tile (Act)

// Software prefetch of a panel's weights (and int5/int6's high bits as far ahead in k), in 64-byte loads: into
// L1 4 KB ahead (~4% faster than 1 KB at 1-4 rows on a Zen 4: docs/results/vnni-streams/), and into L2 16 KB
// ahead (a pass's matmuls 4-6% faster at 1-2 rows on an Intel Xeon: docs/results/prefetch-l2/).
constexpr int64_t PREFETCH = 64, PREFETCH_L2 = 256;

// The prefetches for a panel's load of weights at input k (q: that load's address), of `BITS`-bit weights;
// L2: the prefetch into L2 too (the AVX2 kernel's tiles of 8 rows measured 3-4% slower with it: prefetch-l2/).
template <int BITS, bool L2 = true>
inline void prefetch_panel(const Weights& W, const uint8_t* q, int64_t k) {
    _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH * 64), _MM_HINT_T0);
    if constexpr (L2) _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_L2 * 64), _MM_HINT_T1);
    if constexpr (BITS == 6 || BITS == 5) {  // int6: 32 bytes of high bits a k step of 8; int5: 16
        constexpr int64_t H = BITS == 6 ? 4 : 2;
        _mm_prefetch(reinterpret_cast<const char*>(W.h + k * H + PREFETCH * 8 * H), _MM_HINT_T0);
        if constexpr (L2) _mm_prefetch(reinterpret_cast<const char*>(W.h + k * H + PREFETCH_L2 * 8 * H), _MM_HINT_T1);
    }
}

// The quantized activations of all rows, laid out by row tile (``tile_rows``): a tile of mr rows from row m0
// holds its qx at q + m0 K as [K / 4][mr][4] bytes (the 4 bytes a product broadcasts, of its rows side by side)
// and its values per group a (per span b) at m0 (K / A) + a mr + (m - m0): one pointer and constant offsets
// for a tile, where each product recomputed its row's address (the matmuls of a pass at 8-16 rows 4-8% faster
// this way; docs/results/dot-bound/).
struct Act {
    const int8_t* q;      // [M, K] in tiles as above, each row in the format's k order
    const float* scale;   // [M, K / A] in tiles; two-level: [M, K / 256]
    const int32_t* zsum;  // [M, K / A] in tiles: -z sum of qx (the weights' offset z times the row's sum)
    const float* xsum;    // [M, K / A] in tiles: fp32 sum of x (int4's mins)
    const int16_t* qsum;  // two-level: [M, K / A] row by row, sum of qx per group << shift (int4's mins, in pairs)
    const int32_t* shift; // two-level: [M, K / A] in tiles, 3 - e of each group (see quant_vnni.cpp's top)
    int64_t K, A;
};

// The rows of the tile that starts at row m of M: tiles of at most MR_MAX rows, as even as possible (past 16
// rows every tile has 9-16). The activations are laid out by these tiles (Act).
inline int64_t tile_rows(int64_t M, int64_t m) {
    const int64_t left = M - m, tiles = (left + MR_MAX - 1) / MR_MAX;
    return (left + tiles - 1) / tiles;
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

inline float max_abs(const float* p, int64_t n) {  // n a multiple of 8
    const __m256 bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 top = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(p + i), bits));
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// The activations of row m (in the tile of mr rows from m0), quantized per span of S inputs (A, or SUPER for
// two-level scales): qx (in the format's k order) and the span's scale; per group of A: -z sum qx, sum qx and,
// where int4's mins need it (``xsums``), sum x (fp32, added in k order). Two-level: each group of a super-block
// is quantized with sx / 2^e (quant_vnni.cpp's top), its sums shifted by 3 - e, and the scale stored is sx / 8.
// 8 inputs at a time: division and rounding to nearest as the loop oracle does them, so the same integers.
inline void quantize_row(const float* x, int64_t m, int64_t m0, int64_t mr, int64_t K, int64_t A, int64_t S,
                         bool nibble_order, int32_t z, bool xsums, int8_t* q, float* scale, int32_t* zsum, float* xsum,
                         int16_t* qsum, int32_t* shift) {
    // int4/int5/int6 lanes hold k, k+2, k+4, k+6 then k+1, k+3, k+5, k+7 of each 8
    const __m256i order = nibble_order ? _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)
                                       : _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t NG = K / A;
    for (int64_t b = 0; b < K / S; ++b) {
        const float top = max_abs(x + m * K + b * S, S), sx = top / 127.f;
        scale[m0 * (K / S) + b * mr + (m - m0)] = S > A ? sx * 0.125f : sx;
        for (int64_t a = b * (S / A); a < (b + 1) * (S / A); ++a) {
            const int64_t ia = m0 * NG + a * mr + (m - m0);
            const float* xa = x + m * K + a * A;
            int e = 0;  // two-level: the group's scale sx / 2^e, e <= 3 the largest with its max * 2^e <= top
            if (S > A)
                for (const float g = max_abs(xa, A); e < 3 && g * static_cast<float>(2 << e) <= top;) ++e;
            const __m256 vsx = _mm256_set1_ps(sx / static_cast<float>(1 << e));
            __m256i sum = _mm256_setzero_si256();
            for (int64_t i = 0; i < A; i += 8) {
                const __m256 v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xa + i), order);
                const __m256i v8 = sx > 0.f ? _mm256_cvtps_epi32(_mm256_div_ps(v, vsx)) : _mm256_setzero_si256();
                const __m256i w16 = _mm256_packs_epi32(v8, v8);  // |qx| <= 127: no saturation
                const __m256i w8 = _mm256_packs_epi16(w16, w16);  // bytes 0-3 of each lane: its 4 values
                const int32_t words[2] = {_mm256_cvtsi256_si32(w8), _mm256_extract_epi32(w8, 4)};
                for (int64_t j = 0; j < 2; ++j)  // to their places in the tile: [k / 4][mr][4]
                    std::memcpy(q + m0 * K + ((a * A + i) / 4 + j) * mr * 4 + (m - m0) * 4, words + j, 4);
                sum = _mm256_add_epi32(sum, v8);
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            const int32_t total = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
            zsum[ia] = -z * total;
            qsum[m * NG + a] = static_cast<int16_t>(total * (1 << (3 - e)));  // |.| <= 32 * 127 * 8
            shift[ia] = 3 - e;
            if (xsums) {
                float t = 0.f;
                for (int64_t i = 0; i < A; ++i) t += xa[i];
                xsum[ia] = t;
            }
        }
    }
}

// Every row's activations (quantize_row), tile by tile, the tiles shared among the threads (each written by one
// thread: the same bytes either way). One tile (up to MR_MAX rows) stays on the calling thread: split within a tile,
// the matmuls of 8-16 rows had taken up to 1.5x as long; shared, 17-64 rows' matmuls took 0.83-0.99x as long and a
// 256-token pass 0.96x (docs/results/act-quant/).
inline void quantize_rows(const float* x, int64_t M, int64_t K, int64_t A, int64_t S, bool nibble_order, int32_t z,
                          bool xsums, int8_t* q, float* scale, int32_t* zsum, float* xsum, int16_t* qsum,
                          int32_t* shift) {
    const auto quantize_tile = [&](int64_t m0) {
        const int64_t mr = tile_rows(M, m0);  // the rows' tile (Act)
        for (int64_t m = m0; m < m0 + mr; ++m)
            quantize_row(x, m, m0, mr, K, A, S, nibble_order, z, xsums, q, scale, zsum, xsum, qsum, shift);
    };
    if (M <= MR_MAX) return quantize_tile(0);  // one tile: this thread
    std::vector<int64_t> starts;  // the tiles' first rows
    for (int64_t m0 = 0; m0 < M; m0 += tile_rows(M, m0)) starts.push_back(m0);
    at::parallel_for(0, static_cast<int64_t>(starts.size()), 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) quantize_tile(starts[t]);
    });
}

#pragma GCC pop_options

// y [M, N] = x [M, K] @ W^T with int8 activations: the arguments checked (``who``), the activations quantized
// (the weights' offset z: ``offsets[bits]``, as the kernel's integer sums start), then
// ``run(bits, sc, X, M, W, P, N, y)``, sc how the scales are held: 0 fp32, 1 fp16, 2 two-level.
template <class Run>
torch::Tensor int8_matmul(const char* who, const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h,
                          const torch::Tensor& s, const torch::Tensor& m, int64_t N, int64_t G, int64_t bits,
                          const torch::Tensor& sd, const torch::Tensor& md, const int32_t (&offsets)[9], Run run) {
    const Weights W = checked(who, x, q, h, s, m, N, G, bits, sd, md, true);
    const int64_t K = x.size(1), P = q.size(0), A = G == 16 ? 16 : 32;
    const int sc = W.two ? 2 : W.half ? 1 : 0;
    TORCH_CHECK(G % A == 0 && K % A == 0, who, ": groups of ", G, " over K=", K,
                " need G = 16 or a multiple of 32 and K a multiple of ", A);
    TORCH_CHECK(!W.two || ((G == 16 || G == 32) && G * W.per_d == SUPER && (bits == 4 || bits == 6)),
                who, ": two-level scales need int6 or int4 groups of 16 or 32 in super-blocks of ",
                SUPER, " inputs (Q6_K, Q4_K), got int", bits, " groups of ", G, " x ", W.per_d);
    auto xc = x.contiguous();
    const int64_t M = xc.size(0), S = W.two ? SUPER : A;
    if (M == 0 || K == 0) return torch::zeros({M, N}, x.options());
    std::vector<int8_t> qx(M * K);
    std::vector<float> sx(M * (K / S)), xs(M * (K / A));
    std::vector<int32_t> sq(M * (K / A)), sh(M * (K / A));
    std::vector<int16_t> qs(M * (K / A));
    quantize_rows(xc.data_ptr<float>(), M, K, A, S, bits != 8, offsets[bits], bits == 4 && !W.two, qx.data(),
                  sx.data(), sq.data(), xs.data(), qs.data(), sh.data());
    const Act X{qx.data(), sx.data(), sq.data(), xs.data(), qs.data(), sh.data(), K, A};
    auto y = torch::empty({M, N}, x.options());
    run(bits, sc, X, M, W, P, N, y.data_ptr<float>());
    return y;
}

}  // namespace d3d_quant
