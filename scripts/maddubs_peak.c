/* The AVX2 body's multi-row inner loop without AVX-VNNI, alone: vpmaddubsw of a code register by an
 * activation operand, summed in int16 (vpaddw), six independent accumulators, no stores. Three ways to
 * feed the activations, as quant_gemm_avx2.h could:
 *   0: one vpbroadcastd from memory per two multiplies (a row's 4 bytes serve both 8-lane halves)
 *   1: one vpbroadcastd per multiply (what a pass of more than 3 rows issues: one half per pass)
 *   2: activations stored already broadcast, folded into vpmaddubsw as a 32-byte memory operand
 * The yardstick for the pass's rate in MACs (32 per vpmaddubsw) on CPUs without vpdpbusd (Zen 2 / 3).
 *
 *     gcc -O2 -march=native scripts/maddubs_peak.c -o /tmp/maddubs_peak && /tmp/maddubs_peak
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define ACC(i, x, w) a##i = _mm256_add_epi16(a##i, _mm256_maddubs_epi16(w, x))

__attribute__((noinline)) static void run(int mode, const int8_t *xb, const __m256i *xe, long n, __m256i *io) {
    __m256i a0 = io[0], a1 = io[1], a2 = io[2], a3 = io[3], a4 = io[4], a5 = io[5];
    const __m256i b = io[6], c = io[7];
    if (mode == 0) {
        for (long i = 0; i < n; i++) {
            const int8_t *p = xb + (i & 7) * 16;
            const __m256i x0 = _mm256_set1_epi32(*(const int32_t *)p), x1 = _mm256_set1_epi32(*(const int32_t *)(p + 4)),
                          x2 = _mm256_set1_epi32(*(const int32_t *)(p + 8));
            ACC(0, x0, b); ACC(1, x0, c); ACC(2, x1, b); ACC(3, x1, c); ACC(4, x2, b); ACC(5, x2, c);
        }
    } else if (mode == 1) {
        for (long i = 0; i < n; i++) {
            const int8_t *p = xb + (i & 7) * 32;
            ACC(0, _mm256_set1_epi32(*(const int32_t *)p), b);
            ACC(1, _mm256_set1_epi32(*(const int32_t *)(p + 4)), c);
            ACC(2, _mm256_set1_epi32(*(const int32_t *)(p + 8)), b);
            ACC(3, _mm256_set1_epi32(*(const int32_t *)(p + 12)), c);
            ACC(4, _mm256_set1_epi32(*(const int32_t *)(p + 16)), b);
            ACC(5, _mm256_set1_epi32(*(const int32_t *)(p + 20)), c);
        }
    } else {
        for (long i = 0; i < n; i++) {
            const __m256i *p = xe + (i & 7) * 6;
            ACC(0, _mm256_load_si256(p), b); ACC(1, _mm256_load_si256(p + 1), c);
            ACC(2, _mm256_load_si256(p + 2), b); ACC(3, _mm256_load_si256(p + 3), c);
            ACC(4, _mm256_load_si256(p + 4), b); ACC(5, _mm256_load_si256(p + 5), c);
        }
    }
    io[0] = a0, io[1] = a1, io[2] = a2, io[3] = a3, io[4] = a4, io[5] = a5;
}

int main(void) {
    static int8_t xb[512] __attribute__((aligned(64)));
    static __m256i xe[64];
    for (int i = 0; i < 512; i++) xb[i] = (int8_t)(i * 7);
    for (int i = 0; i < 64; i++) xe[i] = _mm256_set1_epi32(i * 12345);
    __m256i io[8];
    for (int i = 0; i < 8; i++) io[i] = _mm256_set1_epi8((char)(i + 1));
    static const char *names[] = {"a broadcast per 2 multiplies", "a broadcast per multiply",
                                  "pre-broadcast operands"};
    const long n = 100000000 / 6;
    for (int rep = 0; rep < 2; rep++)
        for (int mode = 0; mode < 3; mode++) {
            const double t0 = now();
            run(mode, xb, xe, n, io);
            const double t = now() - t0;
            printf("%-30s %.2f G vpmaddubsw/s = %.0f GMAC/s\n", names[mode], 6 * n / t / 1e9, 6 * n * 32 / t / 1e9);
        }
    return ((int *)io)[3] == 7;  /* keeps the results live */
}
