// The small ops between the matmuls of a CPU decoding pass, each one call instead of a chain of torch ops.
//
// rms_norm: y = x / sqrt(mean(x^2) + eps) * w over the last dim, per row, in fp32, rounded once to x's
// dtype. The sum of squares runs in 16 lanes (lane j takes k = j, j + 16, ...), then a fixed tree
// ((0+8) + (4+12)) + ... over the lanes: one order whatever the number of rows, so every row is computed
// as alone (row invariance). Why: torch's CPU rms_norm is a chain of small ops, and its layer_norm trick
// (d3d.model.transformer.rms_norm's fallback) still cost ~17 us a call inside a pass of the 1.5B (57 calls
// a step; docs/results/vnni-streams/README.md). Torch reference: the fallback; loop oracle:
// naive.rms_norm_reference (float64).
//
// rope_write: a pass's projected q/k/v [T, (H + 2 Hkv) D] -> q rotated [T, H, D] (fp32), and k rotated and v
// written into the KV cache at each token's (row, slot). The rotation is apply_rope's, op for op in fp32:
// fma(x[(d + D/2) mod D], signed_sin[d], fl(x[d] cos[d])) (torch's addcmul fuses its multiply-add on x86),
// so the bits are those of the torch path (slices, RoPE, two cache writes: ~20 small ops a layer). Loop
// oracle: naive.rope_write_reference.
//
// argmax: each fp32 row's first maximum over the last dim (a NaN counts as the maximum, the first NaN wins),
// as torch.argmax. Two passes over the row: its maximum (8 lanes x 4), then the first index equal to it.
// Why: torch's CPU argmax took ~85 us over a 151936-entry row of logits where its amax takes ~7 us; greedy
// decoding takes one per step and one per verified row. Torch reference: torch.argmax; loop oracle:
// naive.argmax_reference.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int LANES = 16;

inline float to_float(float v) { return v; }
inline float to_float(at::BFloat16 v) { return static_cast<float>(v); }

template <typename X, typename W>
void rms_rows(const X* x, const W* w, X* y, int64_t rows, int64_t d, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const X* xr = x + r * d;
        float lane[LANES] = {};
        int64_t k = 0;
        for (; k + LANES <= d; k += LANES)
            for (int j = 0; j < LANES; ++j) {
                const float v = to_float(xr[k + j]);
                lane[j] += v * v;
            }
        for (int j = 0; k + j < d; ++j) {
            const float v = to_float(xr[k + j]);
            lane[j] += v * v;
        }
        for (int half = LANES / 2; half > 0; half /= 2)  // lane j += lane j + half: a fixed tree
            for (int j = 0; j < half; ++j) lane[j] += lane[j + half];
        const float inv = 1.0f / std::sqrt(lane[0] / static_cast<float>(d) + eps);
        X* yr = y + r * d;
        for (int64_t i = 0; i < d; ++i) {
            const float n = to_float(xr[i]) * inv;
            yr[i] = static_cast<X>(w ? n * to_float(w[i]) : n);
        }
    }
}


template <typename X>
void rope_rows(const X* qkv, const float* cos, const float* sin, float* kc, float* vc, float* q, const int64_t* rows,
               const int64_t* slots, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t Lmax) {
    const int64_t width = (H + 2 * Hkv) * D, half = D / 2;
    for (int64_t t = 0; t < T; ++t) {
        const X* x = qkv + t * width;
        const float *c = cos + t * D, *sn = sin + t * D;
        for (int64_t h = 0; h < H + Hkv; ++h) {  // q heads, then k heads: rotated
            const X* xh = x + h * D;
            float* out = h < H ? q + (t * H + h) * D : kc + ((rows[t] * Hkv + (h - H)) * Lmax + slots[t]) * D;
            // d's partner (d + D/2) mod D in two runs: the modulo had kept the loop scalar (16 rows of the 1.5B's
            // heads 50.9 -> 4.4 us a layer; docs/results/pass-rest/)
            for (int64_t d = 0; d < half; ++d) out[d] = std::fma(to_float(xh[d + half]), sn[d], to_float(xh[d]) * c[d]);
            for (int64_t d = half; d < D; ++d) out[d] = std::fma(to_float(xh[d - half]), sn[d], to_float(xh[d]) * c[d]);
        }
        for (int64_t j = 0; j < Hkv; ++j) {  // v heads: as they are
            const X* xv = x + (H + Hkv + j) * D;
            float* out = vc + ((rows[t] * Hkv + j) * Lmax + slots[t]) * D;
            for (int64_t d = 0; d < D; ++d) out[d] = to_float(xv[d]);
        }
    }
}

int64_t first_nan(const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (std::isnan(x[i])) return i;
    return -1;
}

int64_t argmax_row(const float* x, int64_t n) {
    const float lowest = -std::numeric_limits<float>::infinity();
    __m256 m[4] = {_mm256_set1_ps(lowest), _mm256_set1_ps(lowest), _mm256_set1_ps(lowest), _mm256_set1_ps(lowest)};
    __m256 nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; ++j) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * j);
            m[j] = _mm256_max_ps(m[j], v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
    alignas(32) float lane[8];
    _mm256_store_ps(lane, _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
    float best = lowest;
    for (float v : lane) best = v > best ? v : best;
    bool has_nan = _mm256_movemask_ps(nan) != 0;
    for (; i < n; ++i) {
        has_nan |= std::isnan(x[i]);
        best = x[i] > best ? x[i] : best;
    }
    if (has_nan) return first_nan(x, n);
    const __m256 b = _mm256_set1_ps(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(hit);
    }
    for (; i < n; ++i)
        if (x[i] == best) return i;
    return 0;  // not reached: best is one of the row's values
}

}  // namespace

// q = rope_write(qkv [T, (H + 2 Hkv) D], cos/signed_sin [T, D] fp32, k_cache/v_cache [R, Hkv, Lmax, D] fp32,
// rows/slots [T] int64, H, Hkv), see the top
torch::Tensor rope_write(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                         torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& rows,
                         const torch::Tensor& slots, int64_t H, int64_t Hkv) {
    TORCH_CHECK(cos.dim() == 2 && cos.is_contiguous() && cos.scalar_type() == torch::kFloat32 &&
                    sin.sizes() == cos.sizes() && sin.is_contiguous() && sin.scalar_type() == torch::kFloat32 &&
                    cos.size(1) % 2 == 0,
                "glue_cpu.rope_write: cos and sin must be contiguous fp32 [T, D] alike with D even, got ", cos.sizes(),
                " and ", sin.sizes());
    const int64_t T = cos.size(0), D = cos.size(1);
    TORCH_CHECK(H > 0 && Hkv > 0 && qkv.dim() == 2 && qkv.is_contiguous() && qkv.size(0) == T &&
                    qkv.size(1) == (H + 2 * Hkv) * D &&
                    (qkv.scalar_type() == torch::kFloat32 || qkv.scalar_type() == torch::kBFloat16),
                "glue_cpu.rope_write: qkv must be contiguous fp32 or bf16 [", T, ", ", (H + 2 * Hkv) * D, "], got ",
                qkv.sizes(), " ", qkv.scalar_type());
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && k_cache.scalar_type() == torch::kFloat32 &&
                    v_cache.sizes() == k_cache.sizes() && v_cache.is_contiguous() &&
                    v_cache.scalar_type() == torch::kFloat32 && k_cache.size(1) == Hkv && k_cache.size(3) == D,
                "glue_cpu.rope_write: the caches must be contiguous fp32 [R, ", Hkv, ", Lmax, ", D, "] alike, got ",
                k_cache.sizes(), " and ", v_cache.sizes());
    for (const auto* t : {&rows, &slots})
        TORCH_CHECK(t->dim() == 1 && t->size(0) == T && t->scalar_type() == torch::kInt64 && t->is_contiguous(),
                    "glue_cpu.rope_write: rows and slots must be contiguous int64 [", T, "]");
    const int64_t R = k_cache.size(0), Lmax = k_cache.size(2);
    const int64_t *rp = rows.data_ptr<int64_t>(), *sp = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
        TORCH_CHECK(rp[t] >= 0 && rp[t] < R && sp[t] >= 0 && sp[t] < Lmax, "glue_cpu.rope_write: token ", t,
                    " goes to row ", rp[t], " slot ", sp[t], " of a cache of ", R, " rows of ", Lmax);
    auto q = torch::empty({T, H, D}, cos.options());
    if (qkv.scalar_type() == torch::kFloat32)
        rope_rows<float>(qkv.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), k_cache.data_ptr<float>(),
                         v_cache.data_ptr<float>(), q.data_ptr<float>(), rp, sp, T, H, Hkv, D, Lmax);
    else
        rope_rows<at::BFloat16>(qkv.data_ptr<at::BFloat16>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                                k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), q.data_ptr<float>(), rp, sp, T,
                                H, Hkv, D, Lmax);
    return q;
}

// y = rms_norm(x [..., d], weight [d] or empty, eps), see the top
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
    TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16)
                    && x.dim() >= 1 && x.size(-1) > 0,
                "glue_cpu.rms_norm: x must be a CPU fp32 or bf16 tensor [..., d], got ", x.sizes(), " ", x.scalar_type());
    const int64_t d = x.size(-1);
    const bool has_w = weight.defined() && weight.numel() > 0;
    TORCH_CHECK(!has_w || (weight.dim() == 1 && weight.size(0) == d && weight.is_contiguous() &&
                           (weight.scalar_type() == x.scalar_type() || weight.scalar_type() == torch::kFloat32)),
                "glue_cpu.rms_norm: weight must be contiguous [", d, "] of x's dtype or fp32, got ", weight.sizes(), " ",
                weight.scalar_type());
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t rows = xc.numel() / d;
    const float e = static_cast<float>(eps);
    if (x.scalar_type() == torch::kFloat32)
        rms_rows<float, float>(xc.data_ptr<float>(), has_w ? weight.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                               rows, d, e);
    else if (!has_w || weight.scalar_type() == torch::kBFloat16)
        rms_rows<at::BFloat16, at::BFloat16>(xc.data_ptr<at::BFloat16>(),
                                             has_w ? weight.data_ptr<at::BFloat16>() : nullptr,
                                             y.data_ptr<at::BFloat16>(), rows, d, e);
    else
        rms_rows<at::BFloat16, float>(xc.data_ptr<at::BFloat16>(), weight.data_ptr<float>(),
                                      y.data_ptr<at::BFloat16>(), rows, d, e);
    return y;
}

torch::Tensor argmax(const torch::Tensor& x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() >= 1 && x.size(-1) > 0,
                "glue_cpu.argmax: x must be a CPU fp32 tensor [..., n] with n > 0, got ", x.sizes(), " ", x.scalar_type());
    auto xc = x.contiguous();
    const int64_t n = xc.size(-1), rows = xc.numel() / n;
    auto sizes = xc.sizes().vec();
    sizes.pop_back();
    auto out = torch::empty(sizes, x.options().dtype(torch::kInt64));
    const float* xp = xc.data_ptr<float>();
    int64_t* op = out.data_ptr<int64_t>();
    at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) op[r] = argmax_row(xp + r * n, n);
    });
    return out;
}

// One row of approximate logits r [N]: its best lower bound by the columns' largest scales cm (lo <= 0: the row's
// bound per unit of scale), or NaN where some r is NaN.
float best_by_column_max(const float* r, const float* cm, int64_t N, float lo) {
    const int64_t N8 = N / 8 * 8;
    __m256 vb = _mm256_set1_ps(-INFINITY), vnan = _mm256_setzero_ps();
    const __m256 vlo = _mm256_set1_ps(lo);
    for (int64_t n = 0; n < N8; n += 8) {
        const __m256 v = _mm256_loadu_ps(r + n);
        vb = _mm256_max_ps(vb, _mm256_add_ps(v, _mm256_mul_ps(vlo, _mm256_loadu_ps(cm + n))));
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(vnan)) return NAN;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vb);
    float best = *std::max_element(lanes, lanes + 8);
    for (int64_t n = N8; n < N; ++n) {
        if (r[n] != r[n]) return NAN;
        best = std::max(best, r[n] + lo * cm[n]);
    }
    return best;
}

// The columns of that row whose upper bound by their largest scale (hi >= 0 per unit) reaches floor, into left.
void reaching(const float* r, const float* cm, int64_t N, float hi, float floor, std::vector<int64_t>& left) {
    const int64_t N8 = N / 8 * 8;
    const __m256 vhi = _mm256_set1_ps(hi), vfloor = _mm256_set1_ps(floor);
    left.clear();
    for (int64_t n = 0; n < N8; n += 8) {
        const __m256 u = _mm256_add_ps(_mm256_loadu_ps(r + n), _mm256_mul_ps(vhi, _mm256_loadu_ps(cm + n)));
        for (int bits = _mm256_movemask_ps(_mm256_cmp_ps(u, vfloor, _CMP_GE_OQ)); bits; bits &= bits - 1)
            left.push_back(n + __builtin_ctz(bits));
    }
    for (int64_t n = N8; n < N; ++n)
        if (r[n] + hi * cm[n] >= floor) left.push_back(n);
}

// The greedy head's candidates (d3d.cpu.greedy_head): the panels of 16 columns that can hold a row's maximum. a [T, N]
// the approximate logits, set to -inf on return (the caller writes the panels' exact logits); cmax [N] each column's
// largest scale; s the scales as the kernels' panels [P, G, 16] (fp16 or fp32); neg, pos [T, G] (sx times the
// negative and positive qx sums, times the unknown part's span); margin [T]. Bounds first with cmax (one multiply a
// column), then with every group's scale for the columns left. Returns the panels in ascending order, or None where
// some a is NaN (the caller then takes the full head).
py::object head_candidates(torch::Tensor a, const torch::Tensor& cmax, const torch::Tensor& s, const torch::Tensor& neg,
                           const torch::Tensor& pos, const torch::Tensor& margin) {
    for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&a, &cmax, &neg, &pos, &margin})
        TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kFloat32 && t->is_contiguous(),
                    "glue_cpu.head_candidates: a, cmax, neg, pos and margin must be contiguous CPU fp32 tensors");
    const int64_t T = a.size(0), N = a.size(1), G = neg.size(1), P = (N + 15) / 16;
    TORCH_CHECK(a.dim() == 2 && cmax.numel() == N && neg.size(0) == T && pos.sizes() == neg.sizes() &&
                    margin.numel() == T && s.dim() == 3 && s.size(0) == P && s.size(1) == G && s.size(2) == 16 &&
                    s.is_contiguous() && (s.scalar_type() == torch::kFloat32 || s.scalar_type() == torch::kHalf),
                "glue_cpu.head_candidates: shapes a [T, N], cmax [N], s [ceil(N / 16), G, 16] fp32 or fp16, neg and "
                "pos [T, G], margin [T]");
    float* ap = a.data_ptr<float>();
    const float *cm = cmax.data_ptr<float>(), *ng = neg.data_ptr<float>(), *ps = pos.data_ptr<float>(),
                *mg = margin.data_ptr<float>();
    const bool half = s.scalar_type() == torch::kHalf;
    const void* sv = s.data_ptr();
    auto group_bound = [&](int64_t t, int64_t n, const float* v) {  // sum_g s[n, g] v[t, g], s from the panels
        float b = 0.f;
        for (int64_t g = 0; g < G; ++g) {
            const int64_t i = ((n / 16) * G + g) * 16 + n % 16;
            b += (half ? static_cast<float>(static_cast<const at::Half*>(sv)[i]) : static_cast<const float*>(sv)[i]) *
                 v[t * G + g];
        }
        return b;
    };
    std::vector<uint8_t> marked(P, 0);
    std::vector<int64_t> left;
    for (int64_t t = 0; t < T; ++t) {
        const float* r = ap + t * N;
        float lo = 0.f, hi = 0.f;
        for (int64_t g = 0; g < G; ++g) lo += ng[t * G + g], hi += ps[t * G + g];
        float best = best_by_column_max(r, cm, N, lo);
        if (best != best) return py::none();
        reaching(r, cm, N, hi, best - 2 * mg[t], left);
        // every group's scale for those: a better lower bound, then the columns that can still reach it
        for (int64_t n : left) best = std::max(best, r[n] + group_bound(t, n, ng));
        for (int64_t n : left)
            if (r[n] + group_bound(t, n, ps) >= best - 2 * mg[t]) marked[n / 16] = 1;
    }
    std::vector<int64_t> panels;
    for (int64_t p = 0; p < P; ++p)
        if (marked[p]) panels.push_back(p);
    std::fill(ap, ap + T * N, -INFINITY);
    auto out = torch::empty({static_cast<int64_t>(panels.size())}, torch::TensorOptions().dtype(torch::kInt64));
    std::copy(panels.begin(), panels.end(), out.data_ptr<int64_t>());
    return py::cast(out);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("head_candidates", &head_candidates, "the greedy head's candidate panels (see above); a is set to -inf",
          py::arg("a"), py::arg("cmax"), py::arg("s"), py::arg("neg"), py::arg("pos"), py::arg("margin"));
    m.def("rope_write", &rope_write, "q rotated, k rotated and v written into the KV cache (see the top)",
          py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("k_cache"), py::arg("v_cache"), py::arg("rows"),
          py::arg("slots"), py::arg("H"), py::arg("Hkv"));
    m.def("rms_norm", &rms_norm, "rms_norm over the last dim, per row in fp32, rounded once (see the top)",
          py::arg("x"), py::arg("weight"), py::arg("eps"));
    m.def("addresses", [] {
        py::dict d;
        d["rms_norm"] = reinterpret_cast<int64_t>(&rms_norm);
        d["rope_write"] = reinterpret_cast<int64_t>(&rope_write);
        return d;
    }, "rms_norm's and rope_write's addresses (layers_cpu.cpp calls them)");
    m.def("argmax", &argmax, "each row's first maximum over the last dim, as torch.argmax (see the top)", py::arg("x"));
}
