// A standalone copy of quant_vnni.cpp's 8-row int8 loop (1 thread, 64 panels of 16 columns x K in L2), to see
// what bounds it: with K a compile-time constant (KRUN=0) every row's activations sit at a constant offset;
// with K read at run time (KRUN=1) the loop needs a pointer per row, as the kernel did before its activations
// were laid out by row tile. EPILOGUE=0 drops the per-group fp32 rescale; NOPERM=1 the vpermb of each load of
// weights, NOXOR=1 its xor (wrong sums, the same instructions less one).
//   for k in 0 1; do for e in 1 0; do gcc -O3 -march=native -DKRUN=$k -DEPILOGUE=$e loop_copy.c -o /tmp/lc && /tmp/lc; done; done
// (loop_copy.txt: twice, as run on the development machine; docs/results/zen4/loop_copy_zen4.txt: a Zen 4)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DB(acc, w, x) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)(x)))
static const uint8_t idx[64] __attribute__((aligned(64))) = {
    0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54, 7, 23, 39,
    55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62,
    15, 31, 47, 63};
static uint8_t W[64 * 896 * 16] __attribute__((aligned(64)));
static int8_t X[8 * 896] __attribute__((aligned(64)));
static float S[64 * 28 * 16], XS[8 * 28], Y[8 * 1024];

int main(int argc, char** argv) {
#if KRUN
    const int K = argc > 1 ? atoi(argv[1]) : 896;
#else
    const int K = 896;
#endif
    const int P = 64;
    memset(W, 3, sizeof W), memset(X, 1, sizeof X);
    for (int i = 0; i < (int)(sizeof S / 4); i++) S[i] = 1e-3f;
    for (int i = 0; i < (int)(sizeof XS / 4); i++) XS[i] = 1e-2f;
    const __m512i perm = _mm512_load_si512(idx), sign = _mm512_set1_epi8((char)0x80);
    struct timespec t0, t1;
    const long reps = 2000;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < reps; r++)
        for (int p = 0; p < P; p++) {
            const uint8_t* wp = W + (long)p * K * 16;
            __m512 acc[8];
            for (int m = 0; m < 8; m++) acc[m] = _mm512_setzero_ps();
            for (int a = 0; a < K / 32; a++) {
                __m512i I0 = _mm512_setzero_si512(), I1 = I0, I2 = I0, I3 = I0, I4 = I0, I5 = I0, I6 = I0, I7 = I0;
                for (int k = a * 32; k < a * 32 + 32; k += 4) {
                    const uint8_t* q = wp + k * 16;
                    _mm_prefetch((const char*)(q + 4096), _MM_HINT_T0);
#if NOPERM
                    const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(q), sign);
#elif NOXOR
                    const __m512i v = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(q));
#else
                    const __m512i v = _mm512_xor_si512(_mm512_permutexvar_epi8(perm, _mm512_loadu_si512(q)), sign);
#endif
                    DB(I0, v, X + 0 * K + k); DB(I1, v, X + 1 * K + k); DB(I2, v, X + 2 * K + k); DB(I3, v, X + 3 * K + k);
                    DB(I4, v, X + 4 * K + k); DB(I5, v, X + 5 * K + k); DB(I6, v, X + 6 * K + k); DB(I7, v, X + 7 * K + k);
                }
                const __m512i I[8] = {I0, I1, I2, I3, I4, I5, I6, I7};
                const __m512 s = _mm512_loadu_ps(S + (p * (K / 32) + a) * 16);
                for (int m = 0; m < 8; m++)
                    acc[m] = EPILOGUE ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[m]), _mm512_mul_ps(s, _mm512_set1_ps(XS[m * (K / 32) + a])), acc[m])
                                      : _mm512_add_ps(acc[m], _mm512_castsi512_ps(I[m]));
            }
            for (int m = 0; m < 8; m++) _mm512_storeu_ps(Y + m * 1024 + p * 16, acc[m]);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double t = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    printf("K %s, %s: %.2f G vpdpbusd/s (1 thread) %g\n", KRUN ? "at run time" : "constant",
           EPILOGUE ? "with the fp32 rescale" : "without it", reps * 8.0 * K * P * 16 / 64 / t / 1e9, Y[5]);
}
