#include <initializer_list>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <chrono>
struct cfg_t { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
int main(int argc, char** argv) {
  long r = syscall(SYS_arch_prctl, 0x1023, 18);
  printf("arch_prctl -> %ld\n", r);
  for (int M : {8, 16}) for (int KB : {32, 64}) {
    cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
    // tmm0..3: C (M x 64B), tmm4: A (M x KB), tmm5: B (KB/4 x 64)
    for (int t = 0; t < 4; ++t) { c.rows[t] = M; c.colsb[t] = 64; }
    c.rows[4] = M; c.colsb[4] = KB; c.rows[5] = KB / 4; c.colsb[5] = 64; c.rows[6] = KB/4; c.colsb[6] = 64;
    _tile_loadconfig(&c);
    alignas(64) int8_t A[16 * 64]; alignas(64) uint8_t B[16 * 64]; alignas(64) int32_t C[16 * 16];
    for (int i = 0; i < 1024; ++i) { A[i] = (int8_t)(i * 7); B[i] = (uint8_t)(i * 13); }
    _tile_loadd(4, A, 64); _tile_loadd(5, B, 64); _tile_loadd(6, B, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    const long N = 20000000;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < N / 4; ++i) { _tile_dpbsud(0, 4, 5); _tile_dpbsud(1, 4, 6); _tile_dpbsud(2, 4, 5); _tile_dpbsud(3, 4, 6); }
    _tile_stored(0, C, 64);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("M=%d K=%d: %.2f ns/op, %.0f G MAC/s (C0=%d)\n", M, KB, s / N * 1e9, (double)M * 16 * KB * N / s / 1e9, C[0]);
    _tile_release();
  }
}
