#include <cstdio>
#include <cstdint>
#include <chrono>
// 12 chains zmm0..zmm11, weights zmm12; x in rdi
#define REP12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define FUSED(i) "vpdpbusd " #i "*4(%0)%{1to16%}, %%zmm12, %%zmm" #i "\n\t"
#define SPLIT(i) "vpbroadcastd " #i "*4(%0), %%zmm13\n\tvpdpbusd %%zmm13, %%zmm12, %%zmm" #i "\n\t"
#define SPLIT2(i) "vpbroadcastd " #i "*4(%0), %%zmm" #i "\n\t"
#define REG(i) "vpdpbusd %%zmm12, %%zmm12, %%zmm" #i "\n\t"
template <int V> double run(const int8_t* x) {
  const long N = 20000000;
  auto t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < N; ++n) {
    if (V == 0) __asm__ volatile(REP12(FUSED) :: "r"(x) : "memory");
    if (V == 1) __asm__ volatile(REP12(SPLIT) :: "r"(x) : "memory");
    if (V == 2) __asm__ volatile(REP12(REG) :: "r"(x) : "memory");
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return N * 12 / s / 1e9;
}
int main() {
  alignas(64) int8_t x[256] = {1};
  for (int r = 0; r < 2; ++r)
  printf("fused %.2f  split %.2f  reg %.2f  G dpbusd/s\n", run<0>(x), run<1>(x), run<2>(x));
}
