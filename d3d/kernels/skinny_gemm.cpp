// Row-invariant fp32 matmul for the few-row passes of decoding on AVX2 CPUs: y = x W^T.
//
// Why: oneDNN's fp32 kernels reach well under half of an AVX2 CPU's peak at 2-8 rows (an 8-row
// pass of the 0.5B target costs over twice a 1-row pass although both stream the same weights;
// docs/results.md, "Measurements behind the code"), which is the price of every verification pass. Here each 16-column panel of W is
// streamed from memory once per pass and used for up to 6 rows at a time from registers.
//
// Layout: W [N, K] is packed into panels P [ceil(N/16), K, 16] (panel p, step k holds
// W[16p .. 16p+15, k], zero past N). The micro-kernel keeps an MR x 16 tile of y in 2*MR ymm
// registers and, for k = 0 .. K-1 in order, adds x[m, k] * P[p, k, :] with one fused multiply-add.
//
// Row invariance (what keeps speculative decoding token-exact in fp32): y[m, n] is the same chain
// of fmas, acc = fma(x[m, k], W[n, k], acc) for k ascending from acc = 0, whatever the number of
// rows M, the tile m falls in, or the thread that computes it; the K-blocking below stores the
// partial acc to y and reloads it (fp32, exact), so it does not change the chain.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int64_t NR = 16;  // columns per panel: two 8-float vectors
constexpr int64_t KC = 256;  // k per block: a 16 KB panel slice stays in L1 while every row tile uses it
// Lines (k steps) prefetched ahead of the loads: 0, 16 and 64 measured within 10% of each other
// (docs/results/panels/); a prefetch of the next block by the later row tiles did not help either.
constexpr int64_t AHEAD = 32;

template <int MR>
inline void tile(const float* x, int64_t ldx, const float* panel, float* y, int64_t ldy, int64_t k0, int64_t k1,
                 int64_t cols) {
    __m256 acc[MR][2];
    alignas(32) float buf[NR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
        if (k0 == 0) {
            acc[m][0] = _mm256_setzero_ps();
            acc[m][1] = _mm256_setzero_ps();
        } else if (cols == NR) {
            acc[m][0] = _mm256_loadu_ps(y + m * ldy);
            acc[m][1] = _mm256_loadu_ps(y + m * ldy + 8);
        } else {
            for (int64_t j = 0; j < NR; ++j) buf[j] = j < cols ? y[m * ldy + j] : 0.f;
            acc[m][0] = _mm256_load_ps(buf);
            acc[m][1] = _mm256_load_ps(buf + 8);
        }
    }
    const float* w = panel + k0 * NR;
    for (int64_t k = k0; k < k1; ++k, w += NR) {
        _mm_prefetch(reinterpret_cast<const char*>(w + AHEAD * NR), _MM_HINT_T0);
        const __m256 w0 = _mm256_load_ps(w);
        const __m256 w1 = _mm256_load_ps(w + 8);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {  // full unrolling keeps acc in registers (else GCC spills it)
            const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
            acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
        if (cols == NR) {
            _mm256_storeu_ps(y + m * ldy, acc[m][0]);
            _mm256_storeu_ps(y + m * ldy + 8, acc[m][1]);
        } else {
            _mm256_store_ps(buf, acc[m][0]);
            _mm256_store_ps(buf + 8, acc[m][1]);
            for (int64_t j = 0; j < cols; ++j) y[m * ldy + j] = buf[j];
        }
    }
}

inline void tile_of(int64_t mr, const float* x, int64_t ldx, const float* panel, float* y, int64_t ldy, int64_t k0,
                    int64_t k1, int64_t cols) {
    switch (mr) {
        case 6: tile<6>(x, ldx, panel, y, ldy, k0, k1, cols); break;
        case 5: tile<5>(x, ldx, panel, y, ldy, k0, k1, cols); break;
        case 4: tile<4>(x, ldx, panel, y, ldy, k0, k1, cols); break;
        case 3: tile<3>(x, ldx, panel, y, ldy, k0, k1, cols); break;
        case 2: tile<2>(x, ldx, panel, y, ldy, k0, k1, cols); break;
        case 1: tile<1>(x, ldx, panel, y, ldy, k0, k1, cols); break;
        default: break;
    }
}

inline void rows(const float* x, int64_t ldx, const float* panel, float* y, int64_t ldy, int64_t M, int64_t k0,
                 int64_t k1, int64_t cols) {
    // Tiles of at most 6 rows, as even as possible: a tile of MR rows costs max(4, MR) cycles per
    // k (fma latency 4 bounds the chains of a small tile), so 8 rows go as 4 + 4, not 6 + 2.
    for (int64_t m = 0; m < M;) {
        const int64_t left = M - m, tiles = (left + 5) / 6, mr = (left + tiles - 1) / tiles;
        tile_of(mr, x + m * ldx, ldx, panel, y + m * ldy, ldy, k0, k1, cols);
        m += mr;
    }
}

}  // namespace

// W [N, K] fp32 -> panels [ceil(N/16), K, 16] (zero-padded past N).
torch::Tensor pack(const torch::Tensor& w) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.device().is_cpu(),
                "skinny_gemm.pack: weight must be a 2-D fp32 CPU tensor, got ", w.sizes(), " ", w.scalar_type());
    const int64_t N = w.size(0), K = w.size(1), P = (N + NR - 1) / NR;
    auto padded = torch::zeros({P * NR, K}, w.options());
    padded.narrow(0, 0, N).copy_(w);
    return padded.view({P, NR, K}).transpose(1, 2).contiguous();
}

// y [M, N] = x [M, K] @ W^T with W packed by pack(); N is W's row count before padding.
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& panels, int64_t N) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
                "skinny_gemm.matmul: x must be a 2-D fp32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
    TORCH_CHECK(panels.dim() == 3 && panels.size(2) == NR && panels.is_contiguous() &&
                    reinterpret_cast<uintptr_t>(panels.data_ptr()) % 32 == 0,  // aligned vector loads
                "skinny_gemm.matmul: panels must come from skinny_gemm.pack (contiguous, 32-byte aligned), got ",
                panels.sizes());
    TORCH_CHECK(x.size(1) == panels.size(1), "skinny_gemm.matmul: x has ", x.size(1), " features, the weight ",
                panels.size(1));
    TORCH_CHECK(N > (panels.size(0) - 1) * NR && N <= panels.size(0) * NR, "skinny_gemm.matmul: N=", N,
                " does not fit ", panels.size(0), " panels");
    auto xc = x.contiguous();
    const int64_t M = xc.size(0), K = xc.size(1), P = panels.size(0);
    if (M == 0 || K == 0) return torch::zeros({M, N}, x.options());
    auto y = torch::empty({M, N}, x.options());
    const float* xp = xc.data_ptr<float>();
    const float* pp = panels.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // Threads split the panels: each panel's weights are read from memory by one thread, once.
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t cols = std::min(NR, N - p * NR);
            for (int64_t k0 = 0; k0 < K; k0 += KC)
                rows(xp, K, pp + p * K * NR, yp + p * NR, N, M, k0, std::min(K, k0 + KC), cols);
        }
    });
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("pack", &pack, "W [N, K] fp32 -> panels [ceil(N/16), K, 16]");
    m.def("matmul", &matmul, "x [M, K] @ W^T from packed panels -> y [M, N]");
    m.def("address", [] { return reinterpret_cast<int64_t>(&matmul); }, "matmul's address (layers_cpu.cpp calls it)");
}
