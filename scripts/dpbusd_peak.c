/* Peak vpdpbusd throughput of one core: ten independent accumulator chains (more than latency x
 * ports), no loads. The yardstick for the int4 kernel's multi-row passes, which issue 8 vpdpbusd per
 * activation row per group of 32 inputs and 16 outputs (quant_gemm.c).
 *
 * Then the same chains beside five other vector operations per iteration, of the kinds a multi-row pass
 * issues per group (fused multiply-adds, int -> float conversions with adds, the nibble unpack's shifts
 * and ands): whether the float epilogue shares vpdpbusd's ports. If the others ran on ports of their
 * own, every line would keep the first one's rate.
 *
 *     gcc -O2 -march=native scripts/dpbusd_peak.c -o /tmp/dpbusd_peak && /tmp/dpbusd_peak
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
    static const char *names[] = {"zmm vpdpbusd", "beside 5 vfmadd", "beside 2 (cvtdq2ps + addps)",
                                  "beside 2 (srlw + and)"};
    for (int mode = 0; mode < 4; mode++) {
        /* ten named registers (GCC keeps an array's chains in memory at -O2), each started from its own
         * value (identical chains would be merged into one) */
#define I(i) _mm512_set1_epi32(argc + i)
#define F(i) _mm512_set1_ps((float)(argc + i))
        __m512i a0 = I(0), a1 = I(1), a2 = I(2), a3 = I(3), a4 = I(4), a5 = I(5), a6 = I(6), a7 = I(7),
                a8 = I(8), a9 = I(9);
        __m512 f0 = F(0), f1 = F(1), f2 = F(2), f3 = F(3), f4 = F(4), m = F(3), q = F(5);
        __m512i b = _mm512_set1_epi8((char)argc), c = _mm512_set1_epi8((char)(argc + 1));
        const long n = mode ? 50000000 : 100000000;
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
        __m512i s = a0;
        s = _mm512_add_epi32(s, a1), s = _mm512_add_epi32(s, a2), s = _mm512_add_epi32(s, a3);
        s = _mm512_add_epi32(s, a4), s = _mm512_add_epi32(s, a5), s = _mm512_add_epi32(s, a6);
        s = _mm512_add_epi32(s, a7), s = _mm512_add_epi32(s, a8), s = _mm512_add_epi32(s, a9);
        const __m512 fs = _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, _mm512_add_ps(f3, f4)));
        printf("%s: %.2f G/s per core (checksum %d %g)\n", names[mode], 10.0 * n / dt / 1e9,
               _mm512_reduce_add_epi32(s), _mm512_reduce_add_ps(fs));
    }
    return 0;
}
