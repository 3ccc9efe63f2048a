// The FMA rate with each operand form a score loop can use, on one core (8 independent chains, data in L1):
// a 256-bit row broadcast to both halves (vbroadcastf32x8, as scores16), a 512-bit load, a scalar broadcast
// (vbroadcastss, as scores_lanes). Output on the session's Zen 4: broadcast.txt.
//     gcc -O3 -march=native broadcast.c -o broadcast && ./broadcast
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
float buf[16*1024] __attribute__((aligned(64)));
#define BODY(LOADEXPR) \
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0; \
  __m512 q=_mm512_set1_ps(1e-7f); \
  for (long n=0;n<N;n++){ const float* k = buf + (n & 63) * 64; \
    a0=_mm512_fmadd_ps(q,LOADEXPR(k+0),a0); a1=_mm512_fmadd_ps(q,LOADEXPR(k+8),a1); \
    a2=_mm512_fmadd_ps(q,LOADEXPR(k+16),a2); a3=_mm512_fmadd_ps(q,LOADEXPR(k+24),a3); \
    a4=_mm512_fmadd_ps(q,LOADEXPR(k+32),a4); a5=_mm512_fmadd_ps(q,LOADEXPR(k+40),a5); \
    a6=_mm512_fmadd_ps(q,LOADEXPR(k+48),a6); a7=_mm512_fmadd_ps(q,LOADEXPR(k+56),a7); } \
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)),_mm512_add_ps(_mm512_add_ps(a4,a5),_mm512_add_ps(a6,a7))));
#define BC8(p) _mm512_broadcast_f32x8(_mm256_load_ps(p))
#define LD16(p) _mm512_loadu_ps(p)
#define BCS(p) _mm512_set1_ps(*(p))
__attribute__((noinline)) float f0(long N){ BODY(BC8) }
__attribute__((noinline)) float f1(long N){ BODY(LD16) }
__attribute__((noinline)) float f2(long N){ BODY(BCS) }
int main(){
  for (int i=0;i<16*1024;i++) buf[i]=1e-3f*i;
  long N=50000000;
  float (*fs[3])(long)={f0,f1,f2}; const char* nm[3]={"vbroadcastf32x8 m256","vmovups m512","vbroadcastss m32"};
  for (int r=0;r<2;r++) for(int m=0;m<3;m++){ double t=now(); float s=fs[m](N); double dt=now()-t;
    printf("%-22s %.2f G FMA-512/s (%g)\n", nm[m], N*8/dt/1e9, s);}
}
