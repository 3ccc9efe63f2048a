// Passes of many rows (a prompt's prefill) through a quantized matrix with AMX's bf16 tiles: each thread takes a
// panel of 16 columns at a time, dequantizes it to bf16 once into tiles in its cache (B: 16 k pairs x 16 columns),
// and multiplies up to 96 rows at a time by it (TDPBF16PS into six fp32 C tiles that sum over the whole of K: the
// scales were applied in the dequantization, so nothing leaves the tiles until the end). The int8-activation
// kernels (quant_vnni.cpp) are bound by their multiply-adds past ~8 rows (~0.3 T a second on 2 cores); a tile
// product is 16 x 16 x 32 of them. Numerics: bf16 weights and activations, fp32 sums (not the int8 kernels' bits:
// d3d.cpu.prefill chooses which rows take it). Each row's sums depend on that row alone.
//
// The values are those of d3d.kernels.quant.dequantize (fp32, rounded as the kernels round), then rounded to bf16
// (to nearest, ties to even, as torch's .bfloat16()); `dequantize` returns the fp32 values for tests.
//     int8   w = fl(q s)                   q int8 [P, K, 16]
//     int5   w = fl((q - 16) s)            nibbles [P, K/2, 16] (k even low) + high bits [P, K/2, 4] (bits_to_panels)
//     int4   w = fl(fl(q s) - m)           nibbles [P, K/2, 16]
//     int6   w = fl((u - 32) s)            u's nibbles [P, K/2, 16] + its high 2 bits [P, K/8, 32] (int6_to_panels)
// Scales and mins [P, K/G, 16]: fp32, fp16, or int8 factors f with fp16 sd [P, K/G/per, 16]: s = fl(sd f).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t NR = 16;  // a panel's columns

// Scales or mins [P, K/G, 16]: fp32, fp16, or int8 factors f times fp16 factors d [P, K/G/per, 16].
struct Scales {
    const void* v = nullptr;
    const at::Half* d = nullptr;
    int kind = 0;  // 0 fp32, 1 fp16, 2 int8 x fp16
    int64_t groups = 0, supers = 0;
};

struct Mat {
    const uint8_t* q;    // int8 [P, K, 16] or nibbles [P, K/2, 16]
    const uint8_t* h;    // int5: [P, K/2, 4]; int6: [P, K/8, 32]
    Scales s, m;
    int64_t K, G, bits;
};

Scales scales(const torch::Tensor& t, const torch::Tensor& d) {
    if (!t.defined()) return {};
    const int kind = t.scalar_type() == torch::kFloat ? 0 : t.scalar_type() == torch::kHalf ? 1 : 2;
    TORCH_CHECK(kind < 2 || (t.scalar_type() == torch::kChar && d.defined() && d.scalar_type() == torch::kHalf),
                "quant_dense: int8 scale factors need fp16 factors per super-block");
    return {t.data_ptr(), kind == 2 ? d.data_ptr<at::Half>() : nullptr, kind, t.size(1), kind == 2 ? d.size(1) : 0};
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,amx-tile,amx-bf16")
#include <immintrin.h>

// The 16 integer values (offset as the format says, before the scale) of panel p's columns at k (e) and k + 1 (o),
// k even: the nibble formats hold both in one row of bytes.
template <int BITS>
inline void values(const Mat& W, int64_t p, int64_t k, __m512i& e, __m512i& o) {
    if constexpr (BITS == 8) {
        const int8_t* q = reinterpret_cast<const int8_t*>(W.q) + (p * W.K + k) * NR;
        e = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
        o = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + NR)));
        return;
    }
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
        W.q + (p * (W.K / 2) + k / 2) * NR)));
    e = _mm512_and_si512(b, _mm512_set1_epi32(15));
    o = _mm512_srli_epi32(b, 4);
    if constexpr (BITS == 5) {  // a little-endian word per k pair: bit j at k, bit 16 + j at k + 1
        uint32_t word;
        std::memcpy(&word, W.h + (p * (W.K / 2) + k / 2) * 4, 4);
        const __m512i sixteen = _mm512_set1_epi32(16);
        e = _mm512_sub_epi32(_mm512_mask_or_epi32(e, static_cast<__mmask16>(word), e, sixteen), sixteen);
        o = _mm512_sub_epi32(_mm512_mask_or_epi32(o, static_cast<__mmask16>(word >> 16), o, sixteen), sixteen);
    }
    if constexpr (BITS == 6) {
        // column j's two high bits at k = 8 s + 2 i (+ 1 odd) sit in byte (4 j + i) % 32 of step s's 32, from bit
        // 2 (j >= 8) + 4 (odd)
        const int64_t i = (k % 8) / 2;
        const uint8_t* c = W.h + (p * (W.K / 8) + k / 8) * 32;
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
        const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16));
        const __m128i pick = _mm_setr_epi8(i, 4 + i, 8 + i, 12 + i, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m128i eight = _mm_unpacklo_epi32(_mm_shuffle_epi8(lo, pick), _mm_shuffle_epi8(hi, pick));  // j < 8
        const __m512i crumb = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(eight, eight));  // j >= 8: the same bytes
        const __m512i up = _mm512_mask_blend_epi32(0xFF00, _mm512_setzero_si512(), _mm512_set1_epi32(2));
        const __m512i three = _mm512_set1_epi32(3), thirty_two = _mm512_set1_epi32(32);
        const __m512i te = _mm512_and_si512(_mm512_srlv_epi32(crumb, up), three);
        const __m512i odd = _mm512_add_epi32(up, _mm512_set1_epi32(4));
        const __m512i to = _mm512_and_si512(_mm512_srlv_epi32(crumb, odd), three);
        e = _mm512_sub_epi32(_mm512_or_si512(e, _mm512_slli_epi32(te, 4)), thirty_two);
        o = _mm512_sub_epi32(_mm512_or_si512(o, _mm512_slli_epi32(to, 4)), thirty_two);
    }
}

// Group g's scales (or mins) of panel p's 16 columns, in fp32 (two-level: the exact products of
// the factors).
inline __m512 group_vector(const Scales& t, int64_t p, int64_t g) {
    const int64_t at = (p * t.groups + g) * NR;
    if (t.kind == 0) return _mm512_loadu_ps(static_cast<const float*>(t.v) + at);
    if (t.kind == 1)
        return _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const at::Half*>(t.v) + at)));
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(t.v) + at))));
    const at::Half* d = t.d + (p * t.supers + g / (t.groups / t.supers)) * NR;
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d))), f);
}

// Panel p's fp32 values a k pair at a time: put(k, e, o), lane j of e and o column j's values at k and k + 1.
template <int BITS, typename Put>
inline void panel_pairs(const Mat& W, int64_t p, Put put) {
    for (int64_t g = 0; g < W.K / W.G; ++g) {
        const __m512 sv = group_vector(W.s, p, g), mv = BITS == 4 ? group_vector(W.m, p, g) : _mm512_setzero_ps();
        for (int64_t k = g * W.G; k < (g + 1) * W.G; k += 2) {
            __m512i qe, qo;
            values<BITS>(W, p, k, qe, qo);
            __m512 e = _mm512_mul_ps(_mm512_cvtepi32_ps(qe), sv), o = _mm512_mul_ps(_mm512_cvtepi32_ps(qo), sv);
            if (BITS == 4) e = _mm512_sub_ps(e, mv), o = _mm512_sub_ps(o, mv);
            put(k, e, o);
        }
    }
}

// The fp32 values of panel p (what b_tiles rounds to bf16; for tests): column j at out + k * ld + j.
template <int BITS>
void panel_values(const Mat& W, int64_t p, float* out, int64_t ld) {
    panel_pairs<BITS>(W, p, [&](int64_t k, __m512 e, __m512 o) {
        _mm512_storeu_ps(out + k * ld, e);
        _mm512_storeu_ps(out + (k + 1) * ld, o);
    });
}

constexpr int64_t ROWS = 16, TILES = 6;  // a tile's rows; C tiles at once (tiles 0-5; A is 6, B 7)

// Palette 1: C tiles 0-5 [16][16] fp32, A 6 [16][32] bf16, B 7 [16 k pairs][16 x 2] bf16: 16 rows of 64 bytes each.
inline void configure() {
    alignas(64) uint8_t c[64] = {1};  // byte 0 the palette, 16 + 2 t tile t's bytes a row, 48 + t its rows
    for (int t = 0; t < 8; ++t) {
        c[16 + 2 * t] = 64;
        c[48 + t] = ROWS;
    }
    __asm__ volatile("" : : "r"(c) : "memory");  // GCC 12 dropped the stores to a struct that ldtilecfg reads
    _tile_loadconfig(c);
}

// Panel p as bf16 B tiles [K / 32][16 k pairs][16 columns x (k, k + 1)]: tile b's row r holds k = 32 b + 2 r and
// the next, a column's pair in one 32-bit word.
template <int BITS>
void b_tiles(const Mat& W, int64_t p, uint32_t* B) {
    // word j of a B row: column j's bf16 at k (low half) and k + 1 (high): cvtne2ps's 32 values, e then o, interleaved
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    panel_pairs<BITS>(W, p, [&](int64_t k, __m512 e, __m512 o) {
        const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(o, e));  // e in the low half
        _mm512_store_si512(B + k / 2 * NR, _mm512_permutexvar_epi16(pairs, both));
    });
}

// y [Mp, 16] (row stride ldy, col columns kept) = x [Mp, K] bf16 (Mp a multiple of 16) @ one panel's B tiles.
void panel_product(const uint16_t* x, int64_t Mp, int64_t K, const uint32_t* B, float* y, int64_t ldy, int64_t col) {
    alignas(64) float c[ROWS * NR];
    for (int64_t m0 = 0; m0 < Mp; m0 += TILES * ROWS) {
        const int64_t tiles = std::min<int64_t>(TILES, (Mp - m0) / ROWS);
#define D3D_ZERO(T) if (T < tiles) _tile_zero(T);
        D3D_ZERO(0) D3D_ZERO(1) D3D_ZERO(2) D3D_ZERO(3) D3D_ZERO(4) D3D_ZERO(5)
#undef D3D_ZERO
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            _tile_loadd(7, B + k0 / 2 * NR, 64);
#define D3D_ROW_TILE(T)                                                                 \
            if (T < tiles) {                                                            \
                _tile_loadd(6, x + (m0 + T * ROWS) * K + k0, K * 2);                    \
                _tile_dpbf16ps(T, 6, 7);                                                \
            }
            D3D_ROW_TILE(0) D3D_ROW_TILE(1) D3D_ROW_TILE(2) D3D_ROW_TILE(3) D3D_ROW_TILE(4) D3D_ROW_TILE(5)
#undef D3D_ROW_TILE
        }
#define D3D_STORE(T)                                                                        \
        if (T < tiles) {                                                                    \
            float* out = y + (m0 + T * ROWS) * ldy;                                         \
            if (col == NR) {                                                                \
                _tile_stored(T, out, ldy * 4);                                              \
            } else {                                                                        \
                _tile_stored(T, c, NR * 4);                                                 \
                for (int64_t r = 0; r < ROWS; ++r) std::memcpy(out + r * ldy, c + r * NR, col * 4); \
            }                                                                               \
        }
        D3D_STORE(0) D3D_STORE(1) D3D_STORE(2) D3D_STORE(3) D3D_STORE(4) D3D_STORE(5)
#undef D3D_STORE
    }
}

// Panels p0 .. p1 of y [Mp, N] (a thread's share): each dequantized once into B tiles, then multiplied.
void panels(const Mat& W, const uint16_t* x, int64_t Mp, int64_t p0, int64_t p1, float* y, int64_t N) {
    std::vector<uint32_t> buf(W.K / 2 * NR + 16);
    uint32_t* B = reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    configure();  // this thread's tiles (oneDNN configures its own where it ran before)
    for (int64_t p = p0; p < p1; ++p) {
        switch (W.bits) {
            case 4: b_tiles<4>(W, p, B); break;
            case 5: b_tiles<5>(W, p, B); break;
            case 6: b_tiles<6>(W, p, B); break;
            default: b_tiles<8>(W, p, B);
        }
        panel_product(x, Mp, W.K, B, y + p * NR, N, std::min(NR, N - p * NR));
    }
    _tile_release();
}

#pragma GCC pop_options

void values_of(const Mat& W, int64_t p, float* out, int64_t ld) {
    switch (W.bits) {
        case 4: return panel_values<4>(W, p, out, ld);
        case 5: return panel_values<5>(W, p, out, ld);
        case 6: return panel_values<6>(W, p, out, ld);
        default: return panel_values<8>(W, p, out, ld);
    }
}

Mat mat(const torch::Tensor& q, const torch::Tensor& h, const torch::Tensor& s, const torch::Tensor& m,
        const torch::Tensor& sd, const torch::Tensor& md, int64_t K, int64_t G, int64_t bits) {
    TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "quant_dense: bits must be 4, 5, 6 or 8, got ", bits);
    TORCH_CHECK(q.is_contiguous() && s.is_contiguous() && q.size(2) == NR && K % G == 0 && s.size(1) == K / G,
                "quant_dense: panels do not fit K=", K, " G=", G);
    TORCH_CHECK(q.size(1) == (bits == 8 ? K : K / 2), "quant_dense: q has ", q.size(1), " rows for K=", K);
    TORCH_CHECK((bits == 5 || bits == 6) == h.defined() && (bits != 4 || m.defined()),
                "quant_dense: int5/int6 need high bits, int4 mins");
    return {reinterpret_cast<const uint8_t*>(q.data_ptr()), h.defined() ? h.data_ptr<uint8_t>() : nullptr,
            scales(s, sd), scales(m, md), K, G, bits};
}

torch::Tensor opt(const torch::Tensor& t) { return t.numel() ? t.contiguous() : torch::Tensor(); }

// W^T [K, N] fp32: the values the kernels compute with (tests compare them to dequantize's).
torch::Tensor dequantize(torch::Tensor q, torch::Tensor h, torch::Tensor s, torch::Tensor m, torch::Tensor sd,
                         torch::Tensor md, int64_t K, int64_t N, int64_t G, int64_t bits) {
    const Mat W = mat(q, opt(h), s, opt(m), opt(sd), opt(md), K, G, bits);
    const int64_t P = q.size(0);
    auto out = torch::empty({K, P * NR}, torch::kFloat);
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) values_of(W, p, out.data_ptr<float>() + p * NR, P * NR);
    });
    return out.narrow(1, 0, N).contiguous();
}

// Whether AMX's bf16 tiles can run here: AMX-TILE and AMX-BF16 in CPUID, and Linux's permission for their state
// (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked for once per process.
bool amx_usable() {
    static const bool usable = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1) || !((d >> 24) & 1)) return false;
        return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }();
    return usable;
}
}  // namespace

// x [M, K] bf16 @ W^T -> y [M, N] fp32 with AMX's bf16 tiles; threads split the panels.
torch::Tensor matmul(torch::Tensor x, torch::Tensor q, torch::Tensor h, torch::Tensor s, torch::Tensor m,
                     torch::Tensor sd, torch::Tensor md, int64_t N, int64_t G, int64_t bits) {
    TORCH_CHECK(amx_usable(), "quant_dense.matmul: this CPU (or kernel) does not let AMX's bf16 tiles run");
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16, "quant_dense.matmul: x must be [M, K] bf16");
    const int64_t M = x.size(0), K = x.size(1), P = q.size(0), Mp = (M + ROWS - 1) / ROWS * ROWS;
    TORCH_CHECK(K % 32 == 0, "quant_dense.matmul: K=", K, " must be a multiple of 32");
    const Mat W = mat(q, opt(h), s, opt(m), opt(sd), opt(md), K, G, bits);
    auto xp = x.contiguous();
    if (Mp != M) xp = torch::cat({xp, torch::zeros({Mp - M, K}, x.options())});
    auto y = torch::empty({Mp, N}, torch::kFloat);
    const auto* xd = reinterpret_cast<const uint16_t*>(xp.data_ptr());
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) { panels(W, xd, Mp, p0, p1, y.data_ptr<float>(), N); });
    return Mp == M ? y : y.narrow(0, 0, M);
}



PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
    mod.def("dequantize", &dequantize, "panels -> W^T [K, N] fp32, the values the kernels compute with");
    mod.def("matmul", &matmul, "x [M, K] bf16 @ W^T -> y [M, N] fp32 with AMX's bf16 tiles");
    mod.def("amx_usable", &amx_usable, "whether AMX's bf16 tiles can run in this process");
}
