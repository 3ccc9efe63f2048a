// The small ops between the matmuls of a CPU decoding pass, each one call instead of a chain of torch ops.
//
// rms_norm: y = x / sqrt(mean(x^2) + eps) * w over the last dim, per row, in fp32, rounded once to x's
// dtype. The sum of squares runs in 16 lanes (lane j takes k = j, j + 16, ...), then a fixed tree
// ((0+8) + (4+12)) + ... over the lanes: one order whatever the number of rows, so every row is computed
// as alone (row invariance). Why: torch's CPU rms_norm is a chain of small ops, and its layer_norm trick
// (d3d.model.transformer.rms_norm's fallback) still cost ~17 us a call inside a pass of the 1.5B (57 calls
// a step; docs/results/vnni-streams/README.md). Torch reference: the fallback; loop oracle:
// naive.rms_norm_reference (float64).
#include <torch/extension.h>

#include <cmath>

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

}  // namespace

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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("rms_norm", &rms_norm, "rms_norm over the last dim, per row in fp32, rounded once (see the top)",
          py::arg("x"), py::arg("weight"), py::arg("eps"));
}
