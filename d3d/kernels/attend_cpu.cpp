// Packed attention over the KV cache on x86 CPUs (AVX2 + FMA), every query row computed alone.
//
// For query i (head h, kv head h / (H / Hkv)) over cache row rows[i]: the keys j < nkeys[i] that are
// visible (j < first[i], or mask[i, j - first[i]]) get s_j = scale * (q . k_j); then
//     m = max_j s_j,  p_j = exp(s_j - m),  l = sum_j p_j,  out = (sum_j p_j v_j) / l
// with every sum taken in key order over the visible keys only, in fp32, and out rounded once to q's
// dtype. Nothing depends on how many queries share the call or which other keys are masked out, so
// a verification pass of T tokens (or a leaf attending through a mask) computes for each row the
// same bits as a one-token decoding step over the same keys: row invariance in bf16 as in fp32.
//
// Why: torch's CPU SDPA is not row-invariant (its result for a row depends on the rows that share
// the call), and on the few-query calls of decoding it costs ~0.1-0.2 ms a layer in overhead.
//
// The dot product over D: 8 lanes of fma, d = l, l + 8, ..., then a fixed tree; the query heads of
// one kv head share each key and value load. Loop oracle: naive.packed_attention_reference (float64).
//
// A work item is one sequence's query rows (those over one cache row) and one kv head, and it takes the keys a
// block at a time (~64 KB of K, then of V; ``attend_rows``): every row and head over a block before the next, so a
// key and a value are read from memory once for all of them. Blocks change no sum's order (the same bits).
//
// AVX-512 (where the CPU has it, or isa = 2): the same sums in the same order, twice as wide. Scores put
// two query heads side by side (lanes 0-7 head g, 8-15 head g + 1, the key's 8 lanes in both halves), so
// each lane runs the 8-lane code's fma chain; values run 16 output dims a register, each dim's chain over
// the keys in order as before. The bits are the AVX2 code's (tested), in half the fma instructions.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// 8 elements from p (fp32 or bf16) as fp32
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float hsum8(__m256 v) {  // ((0+4) + (2+6)) + ((1+5) + (3+7)): one fixed order
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// hsum8 of 8 vectors at once: lane u = hsum8(v[u]), the same sums in the same order
inline __m256 hsum8x8(const __m256 (&v)[8]) {
    __m256 p[4];  // p[i]: lanes 0-3 = lo + hi of v[2i], lanes 4-7 = of v[2i + 1]
    for (int i = 0; i < 4; ++i)
        p[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    // (0+4)+(2+6) and (1+5)+(3+7) of each: lanes [v0 v0 v2 v2 | v1 v1 v3 v3], then of v4..v7
    const __m256 a = _mm256_add_ps(_mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 b = _mm256_add_ps(_mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(3, 2, 3, 2)));
    // the two halves of each: lanes [v0 v2 v4 v6 | v1 v3 v5 v7], then in order
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// exp(x) for x <= 0 (scores minus their max), ~2 ulp: exp(x) = 2^n exp(r), r = x - n ln 2, a degree-6
// polynomial for exp(r); 0 below -87 (and for -inf, the padding). One code path: the same bits everywhere.
inline __m256 exp8(__m256 x) {
    const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(small, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

inline void store(float* p, float v) { *p = v; }
inline void store(at::BFloat16* p, float v) { *p = at::BFloat16(v); }  // round to nearest even

constexpr int MAX_GROUP = 16;  // query heads per kv head
constexpr int MAX_D = 256;
constexpr int64_t BLOCK_BYTES = 65536;  // keys a block (attend_rows): ~64 KB of K, then as much V
constexpr int64_t LANES_FROM = 12;  // (row, head) pairs of a work item from which its shared keys run in lanes

// The visible keys of query i: j < first[i], or mask[i, j - first[i]]
inline void visible(int64_t i, const int64_t* nkeys, const int64_t* first, const bool* mask, int64_t W,
                    std::vector<int64_t>& vis) {
    const int64_t n = nkeys[i], f = first[i];
    vis.clear();
    for (int64_t j = 0; j < n; ++j)
        if (j < f || mask[i * W + (j - f)]) vis.push_back(j);
}

// s[g, t] = scale * (q_g . k_vis[t]) for heads g0 <= g < G (AVX2), each visible key loaded once for them
template <typename KV>
void scores8(const float (&qf)[MAX_GROUP][MAX_D], int64_t g0, int64_t G, int64_t D, const KV* kc,
             const std::vector<int64_t>& vis, int64_t t0, int64_t t1, int64_t nv8, float scale, float* s) {
    // 8 keys at a time: 8 dot products side by side, reduced together (hsum8x8: hsum8's sums, in its order)
    const __m256 sc = _mm256_set1_ps(scale);
    int64_t t = t0;
    for (; t + 8 <= t1; t += 8) {
        const KV* k[8];
        for (int u = 0; u < 8; ++u) k[u] = kc + vis[t + u] * D;
        for (int64_t g = g0; g < G; ++g) {
            __m256 acc[8];
            for (auto& a : acc) a = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 qd = _mm256_load_ps(qf[g] + d);
                for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qd, load8(k[u] + d), acc[u]);
            }
            _mm256_storeu_ps(s + g * nv8 + t, _mm256_mul_ps(hsum8x8(acc), sc));
        }
    }
    for (; t < t1; ++t) {
        const KV* k = kc + vis[t] * D;
        for (int64_t g = g0; g < G; ++g) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_load_ps(qf[g] + d), load8(k + d), acc);
            s[g * nv8 + t] = hsum8(acc) * scale;
        }
    }
}

// o[g] = sum_t p[g, t] v_vis[t] for one head (AVX2): 64 outputs at a time in registers (8 fma chains: 4 left
// the fma units half idle waiting on latency), keys in order
template <typename KV>
void values8(const float* pg, const KV* vc, const std::vector<int64_t>& vis, int64_t t0, int64_t t1, int64_t D,
             float* og) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int64_t c = std::min<int64_t>(8, (D - d0) / 8);
        __m256 a[8];
        for (int64_t u = 0; u < c; ++u) a[u] = t0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(og + d0 + 8 * u);
        for (int64_t t = t0; t < t1; ++t) {
            const KV* v = vc + vis[t] * D + d0;
            const __m256 p = _mm256_set1_ps(pg[t]);
            for (int64_t u = 0; u < c; ++u) a[u] = _mm256_fmadd_ps(p, load8(v + 8 * u), a[u]);
        }
        for (int64_t u = 0; u < c; ++u) _mm256_store_ps(og + d0 + 8 * u, a[u]);
    }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw")

// 8 elements from p as fp32, in both halves of a register
inline __m512 load8x2(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
inline __m512 load8x2(const at::BFloat16* p) { return _mm512_broadcast_f32x8(load8(p)); }
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// scores8 for heads g0, g0 + 1 at once: lanes 0-7 are head g0's 8 lanes, 8-15 head g0 + 1's (the same chains)
template <typename KV>
void scores16(const float (&qf)[MAX_GROUP][MAX_D], int64_t g0, int64_t D, const KV* kc,
              const std::vector<int64_t>& vis, int64_t t0, int64_t t1, int64_t nv8, float scale, float* s) {
    __m512 qq[MAX_D / 8];
    for (int64_t d = 0; d < D; d += 8)
        qq[d / 8] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(qf[g0] + d)), _mm256_load_ps(qf[g0 + 1] + d), 1);
    const __m256 sc = _mm256_set1_ps(scale);
    float* s0 = s + g0 * nv8;
    float* s1 = s0 + nv8;
    int64_t t = t0;
    for (; t + 8 <= t1; t += 8) {
        const KV* k[8];
        for (int u = 0; u < 8; ++u) k[u] = kc + vis[t + u] * D;
        __m512 acc[8];
        for (auto& a : acc) a = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 8)
            for (int u = 0; u < 8; ++u) acc[u] = _mm512_fmadd_ps(qq[d / 8], load8x2(k[u] + d), acc[u]);
        __m256 lo[8], hi[8];
        for (int u = 0; u < 8; ++u) {
            lo[u] = _mm512_castps512_ps256(acc[u]);
            hi[u] = _mm512_extractf32x8_ps(acc[u], 1);
        }
        _mm256_storeu_ps(s0 + t, _mm256_mul_ps(hsum8x8(lo), sc));
        _mm256_storeu_ps(s1 + t, _mm256_mul_ps(hsum8x8(hi), sc));
    }
    for (; t < t1; ++t) {
        const KV* k = kc + vis[t] * D;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) acc = _mm512_fmadd_ps(qq[d / 8], load8x2(k + d), acc);
        s0[t] = hsum8(_mm512_castps512_ps256(acc)) * scale;
        s1[t] = hsum8(_mm512_extractf32x8_ps(acc, 1)) * scale;
    }
}

// values8 for NH heads at once, 16 outputs a register (each output's chain as before); with D = 64 two heads
// give 8 chains, as values8 keeps
template <int NH, typename KV>
void values16(const float* p, int64_t nv8, const KV* vc, const std::vector<int64_t>& vis, int64_t t0, int64_t t1,
              int64_t D, float* o) {
    constexpr int64_t CH = 8 / NH;  // registers per head per sweep over the keys
    for (int64_t d0 = 0; d0 < D; d0 += 16 * CH) {
        const int64_t c = std::min<int64_t>(CH, (D - d0) / 16);  // whole registers; a last 8 dims below
        const bool half = c < CH && d0 + 16 * c < D;
        __m512 a[NH][CH];
        __m256 b[NH];
        for (int h = 0; h < NH; ++h) {  // the sums over the keys before t0 (kept in o), or none
            for (int64_t u = 0; u < c; ++u)
                a[h][u] = t0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(o + h * MAX_D + d0 + 16 * u);
            b[h] = t0 == 0 || !half ? _mm256_setzero_ps() : _mm256_load_ps(o + h * MAX_D + d0 + 16 * c);
        }
        for (int64_t t = t0; t < t1; ++t) {
            const KV* v = vc + vis[t] * D + d0;
            for (int h = 0; h < NH; ++h) {
                const __m512 ph = _mm512_set1_ps(p[h * nv8 + t]);
                for (int64_t u = 0; u < c; ++u) a[h][u] = _mm512_fmadd_ps(ph, load16(v + 16 * u), a[h][u]);
                if (half) b[h] = _mm256_fmadd_ps(_mm512_castps512_ps256(ph), load8(v + 16 * c), b[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            for (int64_t u = 0; u < c; ++u) _mm512_store_ps(o + h * MAX_D + d0 + 16 * u, a[h][u]);
            if (half) _mm256_store_ps(o + h * MAX_D + d0 + 16 * c, b[h]);
        }
    }
}

inline float as_float(float x) { return x; }
inline float as_float(at::BFloat16 x) { return static_cast<float>(x); }  // exact

// res[u][c] -> dst[c][c0 + u]: plain stores (vectorized, GCC made them scatters, slower here than the whole
// chunk's arithmetic: docs/results/attend-blocks/)
__attribute__((optimize("no-tree-vectorize"))) inline void scatter_scores(const float (*res)[16], int64_t n, int64_t nc,
                                                                         int64_t c0, float* const* dst) {
    for (int64_t c = 0; c < nc; ++c)
        for (int64_t u = 0; u < n; ++u) dst[c][c0 + u] = res[u][c];
}

// Scores of up to 16 (query row, head) pairs at once, one pair a lane, for keys j0..j1 that all of them see: lane c
// runs the 8-lane code's sums for its pair (chain l over d = l, l + 8, ..., then hsum8's tree, then the scale), each
// key element broadcast to all lanes. So where several rows share a kv head, a key is read once for all 16 and no
// horizontal sum or 256-bit broadcast is needed (a 256-bit broadcast holds a Zen 4 core's fmas to 2.65 G/s, a scalar
// one to 3.6: docs/results/attend-blocks/broadcast.txt). qT: [D][16] the pairs' queries; dst[c]: pair c's scores.
template <typename KV>
void scores_lanes(const float* qT, int64_t nc, int64_t D, const KV* kc, int64_t j0, int64_t j1, float scale,
                  float* const* dst) {
    constexpr int64_t CHUNK = 32;  // keys whose 8 partial sums a lane keeps in L1 (part: [key][l][16])
    alignas(64) float part[CHUNK][8][16];
    alignas(64) float res[CHUNK][16];
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t c0 = j0; c0 < j1; c0 += CHUNK) {
        const int64_t n = std::min(CHUNK, j1 - c0);
        for (int l = 0; l < 8; ++l) {  // chain l of every key: d = l, l + 8, ..., its queries held in registers
            __m512 qr[MAX_D / 8];
            for (int64_t i = 0; i < D / 8; ++i) qr[i] = _mm512_load_ps(qT + (l + 8 * i) * 16);
            int64_t u0 = 0;
            for (; u0 + 8 <= n; u0 += 8) {  // 8 keys: 8 chains side by side
                const KV* k = kc + (c0 + u0) * D + l;
                __m512 a[8];
                for (auto& r : a) r = _mm512_setzero_ps();
                for (int64_t i = 0; i < D / 8; ++i)
                    for (int u = 0; u < 8; ++u)
                        a[u] = _mm512_fmadd_ps(qr[i], _mm512_set1_ps(as_float(k[u * D + 8 * i])), a[u]);
                for (int u = 0; u < 8; ++u) _mm512_store_ps(part[u0 + u][l], a[u]);
            }
            for (; u0 < n; ++u0) {
                const KV* k = kc + (c0 + u0) * D + l;
                __m512 a = _mm512_setzero_ps();
                for (int64_t i = 0; i < D / 8; ++i) a = _mm512_fmadd_ps(qr[i], _mm512_set1_ps(as_float(k[8 * i])), a);
                _mm512_store_ps(part[u0][l], a);
            }
        }
        for (int64_t u = 0; u < n; ++u) {  // ((0+4) + (2+6)) + ((1+5) + (3+7)), as hsum8, then the scale
            const float(&p)[8][16] = part[u];
            const __m512 t = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(p[0]), _mm512_load_ps(p[4])),
                              _mm512_add_ps(_mm512_load_ps(p[2]), _mm512_load_ps(p[6]))),
                _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(p[1]), _mm512_load_ps(p[5])),
                              _mm512_add_ps(_mm512_load_ps(p[3]), _mm512_load_ps(p[7]))));
            _mm512_store_ps(res[u], _mm512_mul_ps(t, sc));
        }
        scatter_scores(res, n, nc, c0, dst);
    }
}

// values16 for NC (query row, head) pairs at once over keys j0..j1 that all of them see, CH registers of 16 output
// dims each (D = 16 CH): each key's values loaded once for the NC pairs. Each output's chain over the keys in order
// as values16's, carried in o[c] from block to block (none before key 0): the same bits.
template <int NC, int CH, typename KV>
void values_lanes(const float* const* p, const KV* vc, int64_t j0, int64_t j1, int64_t D, float* const* o) {
    __m512 a[NC][CH];
    for (int c = 0; c < NC; ++c)
        for (int u = 0; u < CH; ++u) a[c][u] = j0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(o[c] + 16 * u);
    for (int64_t j = j0; j < j1; ++j) {
        const KV* v = vc + j * D;
        __m512 vv[CH];
        for (int u = 0; u < CH; ++u) vv[u] = load16(v + 16 * u);
        for (int c = 0; c < NC; ++c) {
            const __m512 pc = _mm512_set1_ps(p[c][j]);
            for (int u = 0; u < CH; ++u) a[c][u] = _mm512_fmadd_ps(pc, vv[u], a[c][u]);
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int u = 0; u < CH; ++u) _mm512_store_ps(o[c] + 16 * u, a[c][u]);
}

// values_lanes over n pairs (their weights pp, outputs oo), NC at a time where as many are left, then one at a time
template <int NC, int CH, typename KV>
void values_pairs(const float* const* pp, float* const* oo, int64_t n, const KV* vc, int64_t j0, int64_t j1,
                  int64_t D) {
    int64_t c = 0;
    for (; c + NC <= n; c += NC) values_lanes<NC, CH>(pp + c, vc, j0, j1, D, oo + c);
    for (; c < n; ++c) values_lanes<1, CH>(pp + c, vc, j0, j1, D, oo + c);
}

#pragma GCC pop_options

// A thread's buffers, kept across its work items: per query row its visible keys, scores, fp32 query and outputs
struct Scratch {
    std::vector<std::vector<int64_t>> vis;
    std::vector<std::vector<float>> s;
    std::vector<float> qf, o;  // [rows][MAX_GROUP][MAX_D], 64-byte aligned through at()
    std::vector<int64_t> nv8, cur;  // per row: its padded key count, its position in its visible keys
    std::vector<float> l;  // [rows][G] softmax denominators
    std::vector<float> qT;  // scores_lanes' queries: [groups of 16 pairs][MAX_D][16]
    std::vector<float*> sp, ov;  // each pair's scores (softmax weights in place after), and its outputs

    static float* at(std::vector<float>& buf, size_t n) {  // n floats, 64-byte aligned
        buf.resize(n + 16);
        const auto p = reinterpret_cast<uintptr_t>(buf.data());
        return buf.data() + ((64 - p % 64) % 64) / sizeof(float);
    }
};

// Rows i0..i0 + T: their visible keys, scores (-inf, padded to 8) and fp32 queries (G heads from q, into qf);
// returns the keys of the longest
template <typename Q>
int64_t prepare_rows(const Q* q, float* qf, int64_t i0, int64_t T, int64_t H, int64_t G, int64_t D,
                     const int64_t* nkeys, const int64_t* first, const bool* mask, int64_t W, Scratch& sc) {
    if (static_cast<int64_t>(sc.vis.size()) < T) {
        sc.vis.resize(T);
        sc.s.resize(T);
    }
    sc.nv8.assign(T, 0);
    int64_t keys = 0;
    for (int64_t r = 0; r < T; ++r) {
        visible(i0 + r, nkeys, first, mask, W, sc.vis[r]);
        sc.nv8[r] = (static_cast<int64_t>(sc.vis[r].size()) + 7) / 8 * 8;
        sc.s[r].assign(G * sc.nv8[r], -INFINITY);
        keys = std::max(keys, nkeys[i0 + r]);
        for (int64_t g = 0; g < G; ++g)
            for (int64_t d = 0; d < D; d += 8)
                _mm256_store_ps(qf + (r * MAX_GROUP + g) * MAX_D + d, load8(q + ((i0 + r) * H + g) * D + d));
    }
    return keys;
}

// The lanes' inputs for P = T G (row, head) pairs, pair c = row c / G, head c % G: where each pair's scores go, its
// softmax weights and its outputs; returns the queries by dim (groups of 16 pairs, zero past P)
const float* lane_setup(int64_t P, int64_t G, int64_t D, const float* qf, float* of, Scratch& sc) {
    const int64_t groups = (P + 15) / 16;
    float* qT = Scratch::at(sc.qT, groups * MAX_D * 16);
    sc.sp.assign(groups * 16, nullptr);
    sc.ov.resize(P);
    for (int64_t c = 0; c < groups * 16; ++c)
        for (int64_t d = 0; d < D; ++d)
            qT[((c / 16) * MAX_D + d) * 16 + c % 16] = c < P ? qf[((c / G) * MAX_GROUP + c % G) * MAX_D + d] : 0.f;
    for (int64_t c = 0; c < P; ++c) {
        sc.sp[c] = sc.s[c / G].data() + (c % G) * sc.nv8[c / G];
        sc.ov[c] = of + ((c / G) * MAX_GROUP + c % G) * MAX_D;
    }
    return qT;
}

// The walk both phases take over the keys, kb at a time: in each block the keys below `shared` (every row sees them,
// at its own position = the key's index) through lane_fn(j0, j1) where `lanes`, then each row's remaining visible
// keys of the block through row_fn(r, t0, t1), in key order
template <typename Lanes, typename Row>
void walk_blocks(Scratch& sc, int64_t T, int64_t keys, int64_t kb, int64_t shared, bool lanes, Lanes&& lane_fn,
                 Row&& row_fn) {
    sc.cur.assign(T, 0);
    for (int64_t j0 = 0; j0 < keys; j0 += kb) {
        const int64_t j1 = std::min(j0 + kb, shared);
        if (lanes && j0 < j1) {
            lane_fn(j0, j1);
            std::fill(sc.cur.begin(), sc.cur.end(), j1);
        }
        for (int64_t r = 0; r < T; ++r) {
            const auto& vis = sc.vis[r];
            const int64_t t0 = sc.cur[r];
            const int64_t t1 = std::lower_bound(vis.begin() + t0, vis.end(), j0 + kb) - vis.begin();
            if (t0 < t1) row_fn(r, t0, t1);
            sc.cur[r] = t1;
        }
    }
}

// Each row and head's scores become softmax weights, 8 keys at a time: max, exp, sum (8 lanes, then hsum8) into l
void softmax_rows(int64_t T, int64_t G, Scratch& sc) {
    sc.l.assign(T * G, 0.f);
    for (int64_t r = 0; r < T; ++r)
        for (int64_t g = 0; g < G; ++g) {
            float* sg = sc.s[r].data() + g * sc.nv8[r];
            __m256 mv = _mm256_set1_ps(-INFINITY);
            for (int64_t t = 0; t < sc.nv8[r]; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sg + t));
            alignas(32) float mx[8];
            _mm256_store_ps(mx, mv);
            float m = mx[0];
            for (int u = 1; u < 8; ++u) m = std::max(m, mx[u]);
            const __m256 mb = _mm256_set1_ps(m);
            __m256 sum = _mm256_setzero_ps();
            for (int64_t t = 0; t < sc.nv8[r]; t += 8) {
                const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), mb));
                _mm256_storeu_ps(sg + t, p);
                sum = _mm256_add_ps(sum, p);
            }
            sc.l[r * G + g] = hsum8(sum);
        }
}

// The query rows i0..i1 (one sequence's: the same cache row) and the G query heads of one kv head. Keys are taken
// a block at a time (~block_bytes of them, in L2), every row and head over a block before the next, so that each
// key and value is read from memory or L3 once for all of them; sweeping all keys per row and head (pair) had
// read them again for each, from L3 at best (docs/results/attend-blocks/). No sum changes order: a score is one
// key's, the softmax runs over all of a row's scores, and each output's chain over the keys is carried from block
// to block in o: the bits of each row alone. Where the rows hold LANES_FROM pairs or more, the keys they all see
// (below every row's first masked position) go through scores_lanes and values_lanes; the rest row by row.
template <typename Q, typename KV>
void attend_rows(const Q* q, const KV* kc, const KV* vc, Q* out, int64_t i0, int64_t i1, int64_t H, int64_t G,
                 int64_t D, const int64_t* nkeys, const int64_t* first, const bool* mask, int64_t W, float scale,
                 bool wide, int64_t block_bytes, Scratch& sc) {
    const int64_t T = i1 - i0, P = T * G;
    float* qf = Scratch::at(sc.qf, T * MAX_GROUP * MAX_D);
    const int64_t keys = prepare_rows(q, qf, i0, T, H, G, D, nkeys, first, mask, W, sc);
    float* of = Scratch::at(sc.o, T * MAX_GROUP * MAX_D);
    const auto& nv8 = sc.nv8;
    int64_t shared = T > 1 ? keys : 0;
    for (int64_t r = 0; r < T; ++r) shared = std::min(shared, first[i0 + r]);
    const bool lanes = wide && P >= LANES_FROM, value_lanes = lanes && (D == 64 || D == 128);
    const float* qT = lanes ? lane_setup(P, G, D, qf, of, sc) : nullptr;
    const int64_t kb = std::max<int64_t>(8, block_bytes / (D * static_cast<int64_t>(sizeof(KV))) / 8 * 8);
    const int64_t pairs = wide ? G / 2 * 2 : 0;  // heads taken two at a time by the AVX-512 code
    walk_blocks(sc, T, keys, kb, shared, lanes, [&](int64_t j0, int64_t j1) {
        for (int64_t b = 0; b < (P + 15) / 16; ++b)
            scores_lanes(qT + b * MAX_D * 16, std::min<int64_t>(16, P - 16 * b), D, kc, j0, j1, scale,
                         sc.sp.data() + 16 * b);
    }, [&](int64_t r, int64_t t0, int64_t t1) {
        const auto& qr = *reinterpret_cast<const float(*)[MAX_GROUP][MAX_D]>(qf + r * MAX_GROUP * MAX_D);
        for (int64_t g = 0; g < pairs; g += 2)
            scores16(qr, g, D, kc, sc.vis[r], t0, t1, nv8[r], scale, sc.s[r].data());
        scores8(qr, pairs, G, D, kc, sc.vis[r], t0, t1, nv8[r], scale, sc.s[r].data());
    });
    softmax_rows(T, G, sc);
    walk_blocks(sc, T, keys, kb, shared, value_lanes, [&](int64_t j0, int64_t j1) {
        if (D == 64)  // 6 pairs x 4 registers + 4 of values
            values_pairs<6, 4>(sc.sp.data(), sc.ov.data(), P, vc, j0, j1, D);
        else  // 128: 2 pairs x 8 + 8
            values_pairs<2, 8>(sc.sp.data(), sc.ov.data(), P, vc, j0, j1, D);
    }, [&](int64_t r, int64_t t0, int64_t t1) {
        const float* p = sc.s[r].data();
        float* o = of + r * MAX_GROUP * MAX_D;
        int64_t g = 0;
        if (wide && D <= 64)
            for (; g + 2 <= G; g += 2) values16<2>(p + g * nv8[r], nv8[r], vc, sc.vis[r], t0, t1, D, o + g * MAX_D);
        for (; g < G; ++g)
            if (wide)
                values16<1>(p + g * nv8[r], nv8[r], vc, sc.vis[r], t0, t1, D, o + g * MAX_D);
            else
                values8(p + g * nv8[r], vc, sc.vis[r], t0, t1, D, o + g * MAX_D);
    });
    for (int64_t r = 0; r < T; ++r) {
        const bool any = !sc.vis[r].empty();
        for (int64_t g = 0; g < G; ++g)
            for (int64_t d = 0; d < D; ++d)
                store(out + ((i0 + r) * H + g) * D + d,
                      any ? of[(r * MAX_GROUP + g) * MAX_D + d] / sc.l[r * G + g] : 0.f);
    }
}

// Work items' rows [start, end): runs of consecutive query rows over one cache row (a sequence's), cut so that with
// the kv heads there are at least as many items as threads where rows allow
std::vector<std::pair<int64_t, int64_t>> row_runs(const int64_t* rows, int64_t T, int64_t Hkv) {
    std::vector<int64_t> cuts{0};
    for (int64_t i = 1; i < T; ++i)
        if (rows[i] != rows[i - 1]) cuts.push_back(i);
    cuts.push_back(T);
    const int64_t runs = static_cast<int64_t>(cuts.size()) - 1, threads = at::get_num_threads();
    const int64_t per = runs * Hkv >= threads ? T : std::max<int64_t>(1, (T * Hkv + threads - 1) / threads / Hkv);
    std::vector<std::pair<int64_t, int64_t>> items;
    for (int64_t n = 0; n < runs; ++n)
        for (int64_t i = cuts[n]; i < cuts[n + 1]; i += per) items.emplace_back(i, std::min(i + per, cuts[n + 1]));
    return items;
}

template <typename Q, typename KV>
void run(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc, torch::Tensor& out,
         const int64_t* rows, const int64_t* nkeys, const int64_t* first, const bool* mask, int64_t W, float scale,
         bool wide, int64_t block_bytes) {
    const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = kc.size(1), G = H / Hkv;
    const int64_t Lmax = kc.size(2);
    const auto items = row_runs(rows, T, Hkv);
    const Q* qp = q.data_ptr<Q>();
    Q* op = out.data_ptr<Q>();
    const KV* kp = kc.data_ptr<KV>();
    const KV* vp = vc.data_ptr<KV>();
    at::parallel_for(0, static_cast<int64_t>(items.size()) * Hkv, 1, [&](int64_t w0, int64_t w1) {
        static thread_local Scratch sc;  // kept from call to call: no allocations once grown
        for (int64_t w = w0; w < w1; ++w) {
            const auto [i0, i1] = items[w / Hkv];
            const int64_t kvh = w % Hkv, base = (rows[i0] * Hkv + kvh) * Lmax * D;
            attend_rows<Q, KV>(qp + kvh * G * D, kp + base, vp + base, op + kvh * G * D, i0, i1, H, G, D, nkeys,
                               first, mask, W, scale, wide, block_bytes, sc);
        }
    });
}

}  // namespace

// out [T, H, D] (q's dtype) = attention of q [T, H, D] over k_cache / v_cache [R, Hkv, Lmax, D] (see the top).
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                     const torch::Tensor& rows, const torch::Tensor& nkeys, const torch::Tensor& first,
                     const torch::Tensor& mask, double scale, int64_t isa, int64_t block_bytes) {
    TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.device().is_cpu() &&
                    (q.scalar_type() == torch::kFloat32 || q.scalar_type() == torch::kBFloat16),
                "attend_cpu.attend: q must be a contiguous fp32 or bf16 CPU tensor [T, H, D], got ", q.sizes(), " ",
                q.scalar_type());
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
                    v_cache.is_contiguous() && v_cache.scalar_type() == k_cache.scalar_type() &&
                    (k_cache.scalar_type() == torch::kFloat32 || k_cache.scalar_type() == torch::kBFloat16),
                "attend_cpu.attend: k_cache and v_cache must be contiguous fp32 or bf16 [R, Hkv, Lmax, D] alike, got ",
                k_cache.sizes(), " and ", v_cache.sizes());
    const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(1);
    TORCH_CHECK(k_cache.size(3) == D && D % 8 == 0 && D <= MAX_D && Hkv > 0 && H % Hkv == 0 && H / Hkv <= MAX_GROUP,
                "attend_cpu.attend: head dim ", D, " (a multiple of 8, at most ", MAX_D, ") and ", H, " heads over ",
                Hkv, " kv heads (at most ", MAX_GROUP, " per kv head) do not fit k_cache ", k_cache.sizes());
    for (const auto* t : {&rows, &nkeys, &first})
        TORCH_CHECK(t->dim() == 1 && t->size(0) == T && t->scalar_type() == torch::kInt64 && t->is_contiguous(),
                    "attend_cpu.attend: rows, nkeys and first must be contiguous int64 [", T, "]");
    TORCH_CHECK(mask.dim() == 2 && mask.size(0) == T && mask.scalar_type() == torch::kBool && mask.is_contiguous(),
                "attend_cpu.attend: mask must be contiguous bool [", T, ", W], got ", mask.sizes());
    const int64_t W = mask.size(1), R = k_cache.size(0), Lmax = k_cache.size(2);
    const int64_t *rp = rows.data_ptr<int64_t>(), *np = nkeys.data_ptr<int64_t>(), *fp = first.data_ptr<int64_t>();
    for (int64_t i = 0; i < T; ++i)
        TORCH_CHECK(rp[i] >= 0 && rp[i] < R && np[i] >= 0 && np[i] <= Lmax && fp[i] >= 0 && fp[i] <= np[i] &&
                        np[i] - fp[i] <= W,
                    "attend_cpu.attend: query ", i, ": row ", rp[i], ", ", np[i], " keys, ", fp[i],
                    " before the mask do not fit ", R, " rows of ", Lmax, " and a mask of width ", W);
    const bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    TORCH_CHECK(isa >= 0 && isa <= 2 && (isa != 2 || has512),
                "attend_cpu.attend: isa=", isa, " must be 0 (auto), 1 (AVX2) or 2 (AVX-512, on a CPU that has it)");
    const bool wide = isa == 2 || (isa == 0 && has512);
    TORCH_CHECK(block_bytes >= 0, "attend_cpu.attend: block_bytes=", block_bytes, " must be >= 0 (0: the default)");
    const int64_t bb = block_bytes ? block_bytes : BLOCK_BYTES;
    auto out = torch::empty_like(q);
    const bool* mp = mask.data_ptr<bool>();
    const float sc = static_cast<float>(scale);
    const bool qb = q.scalar_type() == torch::kBFloat16, kb = k_cache.scalar_type() == torch::kBFloat16;
    if (!qb && !kb) run<float, float>(q, k_cache, v_cache, out, rp, np, fp, mp, W, sc, wide, bb);
    if (!qb && kb) run<float, at::BFloat16>(q, k_cache, v_cache, out, rp, np, fp, mp, W, sc, wide, bb);
    if (qb && !kb) run<at::BFloat16, float>(q, k_cache, v_cache, out, rp, np, fp, mp, W, sc, wide, bb);
    if (qb && kb) run<at::BFloat16, at::BFloat16>(q, k_cache, v_cache, out, rp, np, fp, mp, W, sc, wide, bb);
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("attend", &attend, "packed attention over the KV cache, every query row computed alone (see the top)",
          py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("rows"), py::arg("nkeys"), py::arg("first"),
          py::arg("mask"), py::arg("scale"), py::arg("isa") = 0, py::arg("block_bytes") = 0);
    m.def("address", [] { return reinterpret_cast<int64_t>(&attend); }, "attend's address (layers_cpu.cpp calls it)");
}
