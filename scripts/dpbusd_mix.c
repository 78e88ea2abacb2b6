/* Does the int4 kernel's float epilogue share vpdpbusd's ports? One core runs ten independent vpdpbusd
 * chains per iteration (as scripts/dpbusd_peak.c), alone or beside five other vector operations of the
 * kinds a multi-row pass issues per group (quant_gemm.c: fused multiply-adds, int -> float conversions
 * with adds, the nibble unpack's shifts and ands), and prints the vpdpbusd rate of each mix. If the other
 * operations ran on ports of their own, every mix would keep the first line's rate.
 *
 *     gcc -O2 -march=native scripts/dpbusd_mix.c -o /tmp/dpbusd_mix && /tmp/dpbusd_mix
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    (void)argv;
#define I(i) _mm512_set1_epi32(argc + i)
#define F(i) _mm512_set1_ps((float)(argc + i))
    static const char *names[] = {"vpdpbusd alone", "+ 5 vfmadd", "+ 2 (cvtdq2ps + addps)", "+ 2 (srlw + and)"};
    for (int mode = 0; mode < 4; mode++) {
        __m512i a0 = I(0), a1 = I(1), a2 = I(2), a3 = I(3), a4 = I(4), a5 = I(5), a6 = I(6), a7 = I(7),
                a8 = I(8), a9 = I(9);
        __m512 f0 = F(0), f1 = F(1), f2 = F(2), f3 = F(3), f4 = F(4), m = F(3), q = F(5);
        __m512i b = _mm512_set1_epi8((char)argc), c = _mm512_set1_epi8((char)(argc + 1));
        const long n = 50000000;
        const double t0 = now();
        for (long k = 0; k < n; k++) {
#define D(x) x = _mm512_dpbusd_epi32(x, b, c)
            D(a0), D(a1), D(a2), D(a3), D(a4), D(a5), D(a6), D(a7), D(a8), D(a9);
            if (mode == 1) {
#define M(x) x = _mm512_fmadd_ps(x, m, q)
                M(f0), M(f1), M(f2), M(f3), M(f4);
            } else if (mode == 2) {
                f0 = _mm512_add_ps(f0, _mm512_cvtepi32_ps(a0));
                f1 = _mm512_add_ps(f1, _mm512_cvtepi32_ps(a1));
            } else if (mode == 3) {
                b = _mm512_and_si512(_mm512_srli_epi16(b, 4), c);
                c = _mm512_and_si512(_mm512_srli_epi16(c, 4), b);
            }
            __asm__ volatile("" : "+v"(b)); /* b is "new" each iteration: nothing is hoisted */
        }
        const double dt = now() - t0;
        __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                     _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
        s = _mm512_add_epi32(s, _mm512_add_epi32(a8, a9));
        const float fs = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, _mm512_add_ps(f3, f4))));
        printf("%-26s %.2f G vpdpbusd/s per core (checksum %d %g)\n", names[mode], 10.0 * n / dt / 1e9,
               _mm512_reduce_add_epi32(s), fs);
    }
    return 0;
}
