// vpdpbusd on C independent chains, one thread: its latency (1 chain) and how many chains reach its throughput.
//   for c in 1 2 4 6 8 10 12 16; do gcc -O3 -march=native -DC=$c chains.c -o /tmp/c && /tmp/c; done   (chains.txt)
// (3.96 GHz: the clock a chain of dependent adds measured on the development machine.)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#define D(x) __asm__("vpdpbusd %2, %1, %0" : "+v"(x) : "v"(b), "v"(c))
int main() {
    const __m512i b = _mm512_set1_epi32(0x01020304), c = _mm512_set1_epi32(3);
    __m512i a0=b,a1=c,a2=b,a3=c,a4=b,a5=c,a6=b,a7=c,a8=b,a9=c,a10=b,a11=c,a12=b,a13=c,a14=b,a15=c;
    struct timespec t0, t1; const long n = 200000000 / C;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < n; r++) {
        D(a0); if (C>1) D(a1); if (C>2) D(a2); if (C>3) D(a3); if (C>4) D(a4); if (C>5) D(a5); if (C>6) D(a6); if (C>7) D(a7);
        if (C>8) D(a8); if (C>9) D(a9); if (C>10) D(a10); if (C>11) D(a11); if (C>12) D(a12); if (C>13) D(a13); if (C>14) D(a14); if (C>15) D(a15);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double t = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0,a1),_mm512_add_epi32(a2,a3)),_mm512_add_epi32(_mm512_add_epi32(a4,a5),_mm512_add_epi32(a6,a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a8,a9),_mm512_add_epi32(a10,a11)),_mm512_add_epi32(_mm512_add_epi32(a12,a13),_mm512_add_epi32(a14,a15))));
    printf("chains %d: %.2f G/s = %.2f/cycle at 3.96 GHz (%d)\n", C, n * (double)C / t / 1e9, n*(double)C/t/3.96e9, _mm512_reduce_add_epi32(s));
}
