// quantize_rows of quant_int8.h alone, timed in C++ (docs/results/act-quant/quant_time.py builds it).
#include <torch/extension.h>
#include <chrono>
#include "quant_int8.h"
using namespace d3d_quant;
// seconds per call of quantize_rows on x [M, K]
double time_quant(torch::Tensor x, int64_t A, int64_t S, bool nib, bool xsums, int64_t reps) {
    const int64_t M = x.size(0), K = x.size(1);
    std::vector<int8_t> qx(M * K);
    std::vector<float> sx(M * (K / S)), xs(M * (K / A));
    std::vector<int32_t> sq(M * (K / A)), sh(M * (K / A));
    std::vector<int16_t> qs(M * (K / A));
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < reps; ++r)
        quantize_rows(x.data_ptr<float>(), M, K, A, S, nib, 16, xsums, qx.data(), sx.data(), sq.data(), xs.data(), qs.data(), sh.data());
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(t1 - t0).count() / reps;
}
double time_alloc(int64_t M, int64_t K, int64_t reps) {
    auto t0 = std::chrono::steady_clock::now();
    int64_t s = 0;
    for (int64_t r = 0; r < reps; ++r) { std::vector<int8_t> qx(M * K); s += qx[M*K/2]; }
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(t1 - t0).count() / reps + s * 0;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("time_quant", &time_quant); m.def("time_alloc", &time_alloc); }
